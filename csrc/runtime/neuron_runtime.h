// The NeuronCore runtime interface.
//
// This is the only surface the PyTorch integration (csrc/aten/) uses to reach a
// device: device discovery, device memory, copies, streams, events and kernel
// launch. The default implementation (device.cpp, memory.cpp, stream.cpp) is
// an emulated NeuronCore whose memory is host memory with a capacity and whose
// kernels run on the host CPU. A driver for real silicon implements the same
// functions; nothing above this header changes.
#pragma once

#include <cstddef>
#include <cstdint>

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
// all earlier work on that stream is done.
using KernelFn = void (*)(void* arg);
Status launchKernel(int device, Stream stream, KernelFn fn, void* arg);

}  // namespace torchneuron::rt
