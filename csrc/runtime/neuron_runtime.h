// The NeuronCore runtime interface.
//
// This is the only surface the PyTorch integration (csrc/aten/) uses to reach a
// device: device discovery, device memory, copies, streams, events and kernel
// launch. The default implementation (device.cpp, memory.cpp, stream.cpp) is
// an emulated NeuronCore whose memory is host memory with a capacity and whose
// kernels run on the host CPU. A driver for real silicon implements the same
// functions; nothing above this header changes.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace torchneuron::rt {

enum class Status {
  Success = 0,
  InvalidDevice,      // device index out of range
  OutOfMemory,        // request above the device's free capacity
  InvalidValue,       // bad pointer, size or handle
  NotReady,           // asynchronous work is still pending
};

const char* statusString(Status s);

// ---- devices -------------------------------------------------------------
struct DeviceProperties {
  char name[64];
  size_t total_memory;   // bytes
  int core_count;        // compute engines per device
};

int deviceCount();                       // TORCHNEURON_NUM_DEVICES, default 2
Status getDeviceProperties(int device, DeviceProperties* props);
Status deviceSynchronize(int device);    // wait for all streams of a device

// ---- memory --------------------------------------------------------------
// Device memory. Every byte is charged against the device's capacity
// (TORCHNEURON_DEVICE_MEMORY, default 16 GiB per device).
Status malloc(int device, void** ptr, size_t nbytes);
Status free(void* ptr);
// Charge or release bytes that a kernel produced in place (the zero-copy path
// hands kernel outputs over to the device without copying them).
Status reserve(int device, size_t nbytes);
void release(int device, size_t nbytes);
Status memGetInfo(int device, size_t* free_bytes, size_t* total_bytes);
// The device a pointer returned by malloc() belongs to.
Status pointerGetDevice(const void* ptr, int* device);

// ---- strict mode (TORCHNEURON_STRICT=1) -----------------------------------
// Device memory is out of the host's reach (page protection) except while the
// runtime runs work that may touch it: a kernel (launchKernel), a copy
// (memcpy), or a host-side operation that declared device access (a collective
// in flight). Any other host access, from this library, a C++ extension or
// data_ptr() arithmetic, stops the process at once with a message naming the
// address and its device. Access windows are process-wide and nest.
bool strictMode();
// Reports a fault in device memory, then hands it to the SIGSEGV handler installed before this
// call (e.g. Python's faulthandler, for the Python stack). Strict mode installs it at start.
void installStrictFaultHandler();
void deviceAccessBegin();
void deviceAccessEnd();
class DeviceAccess {  // a window of device access for its lifetime (nothing when not strict)
 public:
  DeviceAccess() : open_(strictMode()) { if (open_) deviceAccessBegin(); }
  ~DeviceAccess() { if (open_) deviceAccessEnd(); }
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;

 private:
  bool open_;
};

enum class CopyKind { HostToDevice, DeviceToHost, DeviceToDevice, HostToHost };
Status memcpy(void* dst, const void* src, size_t nbytes, CopyKind kind);

// Page-locked host memory for fast, asynchronous copies.
Status hostMalloc(void** ptr, size_t nbytes);
Status hostFree(void* ptr);
bool isHostPinned(const void* ptr);

// ---- streams and events --------------------------------------------------
// Streams are identified by (device, id); id 0 is the default stream.
// Work submitted to a stream runs in submission order. The emulator runs each
// kernel to completion when it is launched, so a stream is always idle when
// control returns to the caller; events still carry real timestamps.
using Stream = int64_t;
struct EventImpl;
using Event = EventImpl*;

Status streamSynchronize(int device, Stream stream);
Status streamQuery(int device, Stream stream);   // Success or NotReady
Status streamWaitEvent(int device, Stream stream, Event event);

Status eventCreate(Event* event, bool enable_timing);
Status eventDestroy(Event event);
Status eventRecord(Event event, int device, Stream stream);
Status eventQuery(Event event);                   // Success or NotReady
Status eventSynchronize(Event event);
Status eventElapsedTime(float* ms, Event start, Event end);

// Launch a kernel on a stream: the function runs with the given argument once
// all earlier work on that stream is done. `info` says what the work is, for
// the activity records below; an exception the function raises reaches the
// caller (the emulator runs it on the caller's thread).
using KernelFn = void (*)(void* arg);
enum class ActivityKind { Kernel, Memcpy, Memset, Collective };
struct LaunchInfo {
  ActivityKind kind = ActivityKind::Kernel;
  const char* name = "kernel";  // read during the launch only
  uint64_t bytes = 0;           // bytes moved, for copies and collectives
};
Status launchKernel(int device, Stream stream, KernelFn fn, void* arg, const LaunchInfo& info = {});

// ---- activity records (activity.cpp) --------------------------------------
// While recording is on, the runtime keeps a record of each piece of work it
// runs on a device: what (kind, name, bytes), where (device, stream), when
// (host launch and device start and end, in nanoseconds since the Unix epoch)
// and the host's external correlation id current at launch (the id of the
// framework op that launched it), as CUPTI's activity API does for CUDA. A
// profiler turns them into its own events (csrc/profiler/kineto.cpp).
struct ActivityRecord {
  ActivityKind kind;
  std::string name;
  int device;
  Stream stream;
  uint64_t bytes;
  int64_t launch_ns;  // host: the launch began
  int64_t start_ns;   // device: the work began
  int64_t end_ns;     // device: the work ended (and, here, the launch returned)
  uint64_t correlation;  // external correlation id, 0 when none
  uint64_t sequence;     // this runtime's own id of the launch, from 1
  int32_t host_thread;   // the launching thread's system id
};
extern std::atomic<bool> activity_recording;
inline bool activityRecording() { return activity_recording.load(std::memory_order_relaxed); }
void activityStart();                      // clears earlier records
void activityStop();
std::vector<ActivityRecord> activityDrain();  // the records so far, oldest first
void activityPushExternalCorrelation(uint64_t id);  // per host thread
void activityPopExternalCorrelation();
// For work whose end the host learns later (a collective another thread
// runs): a record begun now, on this thread, and added when it ends.
ActivityRecord activityBegin(int device, Stream stream, const LaunchInfo& info);
int64_t activityClockNs();  // the clock of the records' times
void activityEnd(ActivityRecord record);  // kept only while recording

}  // namespace torchneuron::rt
