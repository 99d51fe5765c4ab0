// The emulated NeuronCore's own C++ interface, between its sources (device.cpp, memory.cpp,
// protection.cpp, stream.cpp, activity.cpp) and capi.cpp, which exports it as the C API of
// neuron_runtime.h. Nothing outside csrc/runtime/ includes this header; the contract of each function
// is the one its C counterpart states in neuron_runtime.h.
#pragma once

#define TNRT_BUILDING_LIBRARY 1
#include "neuron_runtime.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace torchneuron::emu {

enum class Status {
  Success = 0,
  InvalidDevice,      // device index out of range
  OutOfMemory,        // request above the device's free capacity
  InvalidValue,       // bad pointer, size or handle
  NotReady,           // asynchronous work is still pending
  KernelFailed,       // work run asynchronously raised; asyncError() says what
  LaunchFailed,       // the work of a blocking launch failed; lastError() says what
  Internal,           // the runtime failed; lastError() says how
};
static_assert(int(Status::Internal) == TNRT_INTERNAL && int(Status::KernelFailed) == TNRT_KERNEL_FAILED);

// The message of this thread's last LaunchFailed or Internal failure (device.cpp).
void setLastError(const char* message);
const char* lastError();

const char* statusString(Status s);

// ---- version -------------------------------------------------------------
// The interface's version. A change that breaks callers raises the major number; a function added
// raises the minor one. _C checks at load that the runtime it runs on has its major number and at
// least its minor one (module.cpp), so a driver built against another interface is refused by name.
constexpr int kApiVersionMajor = TNRT_API_VERSION_MAJOR;
constexpr int kApiVersionMinor = TNRT_API_VERSION_MINOR;
// The version the runtime was built with: major * 1000 + minor.
int apiVersion();

// ---- devices -------------------------------------------------------------
using DeviceProperties = tnrtDeviceProperties;

int deviceCount();                       // TORCHNEURON_NUM_DEVICES, default 2
Status getDeviceProperties(int device, DeviceProperties* props);
Status deviceSynchronize(int device);    // wait for all streams of a device

// ---- memory --------------------------------------------------------------
// Device memory. Every byte is charged against the device's capacity
// (TORCHNEURON_DEVICE_MEMORY, default 16 GiB per device). As on a device, a
// block's memory costs the host nothing until it is written (blocks of 1 MiB
// or more; a new block's contents are undefined all the same).
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
// Device memory is out of the host's reach (page protection, in pages of 4 KiB) except the memory
// of the work the runtime is running. Each piece of work opens a window of its own: the ranges it
// was launched with (LaunchInfo::ranges; a copy's source and destination), those added while it
// runs (deviceAccessAdd, on the thread that runs it), for as long as it runs. Windows of work that
// runs at the same time open the union of their ranges; memory outside every window faults, also
// while other work runs, and any such host access (from this library, a C++ extension or
// data_ptr() arithmetic) stops the process at once with a message naming the address and its
// device. Page protection is the process's, not a thread's: a page stays reachable to all threads
// while some window opens it, and tensors that share a page are reachable together.
using MemoryRange = tnrtMemoryRange;
bool strictMode();
// Reports a fault in device memory, then hands it to the SIGSEGV handler installed before this
// call (e.g. Python's faulthandler, for the Python stack). Strict mode installs it at start.
void installStrictFaultHandler();
class DeviceAccess {  // a window over `ranges` for its lifetime (nothing when not strict); nests
 public:
  enum Owner {
    ThisThread,  // this thread's: deviceAccessAdd() on this thread joins it while it is the innermost
    NoThread,    // no thread's: for memory another library's threads reach while it holds it (gloo's)
  };
  DeviceAccess(const MemoryRange* ranges, size_t count, Owner owner = ThisThread);
  ~DeviceAccess();
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;

 private:
  void* window_;
  Owner owner_;
};
// Opens [ptr, ptr + nbytes) for the rest of this thread's innermost window: memory the running
// work reaches that it was not launched with (a block allocated while it runs). Nothing outside a
// window, or for memory that is not a device's.
void deviceAccessAdd(const void* ptr, size_t nbytes);
// Opens all of `device`'s memory for the rest of this thread's innermost window, for host code
// whose arguments the runtime is not told (an AOTInductor model's C++ kernels).
void deviceAccessAddDevice(int device);
// The ranges this thread's innermost window has opened so far: for work that reaches the same
// memory again later, in a launch of its own (a CPU autograd graph over device memory).
std::vector<MemoryRange> deviceAccessRanges();

enum class CopyKind { HostToDevice, DeviceToHost, DeviceToDevice, HostToHost };
Status memcpy(void* dst, const void* src, size_t nbytes, CopyKind kind);
// Sets nbytes of device memory at dst to the byte `value`, as cudaMemset does. Zeros cost no host
// memory: the whole pages of a large block that the range covers are handed back to the host.
Status memset(void* dst, int value, size_t nbytes);

// Page-locked host memory for fast, asynchronous copies.
Status hostMalloc(void** ptr, size_t nbytes);
Status hostFree(void* ptr);
bool isHostPinned(const void* ptr);

// ---- streams and events --------------------------------------------------
// Streams are identified by (device, id); id 0 is the default stream.
// Work submitted to a stream runs in submission order.
//
// Synchronous mode (the default): each kernel runs to completion on the
// launching thread, so a stream is always idle when control returns to the
// caller; events still carry real timestamps.
//
// Asynchronous mode (TORCHNEURON_ASYNC=1, and in strict mode unless TORCHNEURON_ASYNC=0): each
// stream runs its work in order on a worker thread of its own, and
// enqueueKernel returns once the work is queued, as a real device's launch
// does. Ordering between streams holds only through events. Work that raises
// does not stop its stream: the first error of a device is kept and returned
// (KernelFailed, text from asyncError) by the next call that waits on that
// device (synchronize, a blocking launch, an event's synchronize), once.
bool asyncMode();
using Stream = tnrtStream;
using Event = tnrtEvent;  // struct tnrtEventImpl: stream.cpp

Status streamSynchronize(int device, Stream stream);
Status streamQuery(int device, Stream stream);   // Success or NotReady
Status streamWaitEvent(int device, Stream stream, Event event);
// The device's first asynchronous failure not yet taken, as tnrtAsyncError says.
size_t asyncErrorInto(int device, char* buffer, size_t capacity);

Status eventCreate(Event* event, bool enable_timing);
Status eventDestroy(Event event);
Status eventRecord(Event event, int device, Stream stream);
Status eventQuery(Event event);                   // Success or NotReady
Status eventSynchronize(Event event);
int eventDevice(Event event);                     // the device of its last record (-1: none)
Status eventElapsedTime(float* ms, Event start, Event end);  // NotReady until both have happened

// Work on a stream: fn(arg, context), which returns nullptr, or a message saying what failed
// (neuron_runtime.h). `info` says what the work is, for the activity records below (its name is copied).
using KernelFn = tnrtKernelFn;
using KernelDrop = tnrtKernelDrop;
enum class ActivityKind { Kernel, Memcpy, Memset, Collective };
struct LaunchInfo {
  ActivityKind kind = ActivityKind::Kernel;
  const char* name = "kernel";
  uint64_t bytes = 0;           // bytes moved, for copies and collectives
  // The device memory the work reads or writes, as a real kernel's arguments name it: strict mode
  // opens only these for it (copied by enqueueKernel). Host memory among them is ignored.
  const MemoryRange* ranges = nullptr;
  size_t range_count = 0;
};
// A blocking launch (tnrtLaunchKernel): runs fn(arg, context) on the calling thread once the
// stream's earlier work is done; LaunchFailed, with fn's message as lastError(), when fn failed.
Status launchKernel(int device, Stream stream, KernelFn fn, void* arg, void* context, const LaunchInfo& info = {});
// An asynchronous launch (tnrtEnqueueKernel); drop(arg) runs after fn, also when fn failed.
Status enqueueKernel(int device, Stream stream, KernelFn fn, void* arg, void* context, KernelDrop drop,
                     const LaunchInfo& info = {});

// True while this thread runs the body of launchKernel (tnrtInsideKernel).
bool insideKernel();

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
  bool nested = false;   // launched from inside another launch's body (its time is part of that one's)
  std::vector<std::pair<std::string, std::string>> args;  // what the work said of itself (activityAnnotate)
};
extern std::atomic<bool> activity_recording;
inline bool activityRecording() { return activity_recording.load(std::memory_order_relaxed); }
void activityStart();                      // clears earlier records
void activityStop();
std::vector<ActivityRecord> activityDrain();  // the records so far, oldest first
// Adds `key`: `value` to the record of the work this thread is running (the innermost launch whose body
// runs here, or the stream worker's current work), shown with its event; nothing while not recording.
void activityAnnotate(const char* key, std::string value);
void activityPushExternalCorrelation(uint64_t id);  // per host thread
void activityPopExternalCorrelation();
// For work whose end the host learns later (a collective another thread
// runs): a record begun now, on this thread, and added when it ends.
ActivityRecord activityBegin(int device, Stream stream, const LaunchInfo& info);
int64_t activityClockNs();  // the clock of the records' times
void activityEnd(ActivityRecord record);  // kept only while recording
// Makes `record` the one activityAnnotate adds to on this thread while its work runs; returns the
// one before, to be put back after.
ActivityRecord* activitySwapRunning(ActivityRecord* record);

}  // namespace torchneuron::emu
