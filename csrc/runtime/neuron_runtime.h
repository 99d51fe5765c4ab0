/* The NeuronCore runtime interface: the C API of libtorchneuron_runtime.
 *
 * This is the only surface the PyTorch integration (csrc/aten/ and the rest of torchneuron._C) uses
 * to reach a device: device discovery, device memory, copies, streams, events, kernel launch,
 * activity records and strict mode's protection. The default implementation is an emulated
 * NeuronCore whose memory is host memory with a capacity and whose kernels run on the host CPU
 * (device.cpp, memory.cpp, protection.cpp, stream.cpp, activity.cpp behind capi.cpp), built as a
 * shared library of its own that includes nothing of PyTorch: torchneuron/libtorchneuron_runtime.so,
 * which _C links (docs/runtime.md). A driver for real silicon implements these functions and keeps
 * the same contract, which tests/runtime/test_runtime.cpp (through neuron_runtime.inl) and
 * tests/runtime/test_c_api.c check on the library alone (tests/test_runtime_library.py).
 *
 * Across this boundary go plain C types and status codes only: no C++ type, no exception. A call
 * that fails returns a status; tnrtLastError() says more. The work a launch runs is a C function
 * that reports failure by returning a message. C++ callers use the conveniences of
 * neuron_runtime.inl (namespace torchneuron::rt), included below for C++: RAII, std::string,
 * std::vector, and launches whose C++ exceptions reach the caller, all compiled into the caller.
 *
 * Above this interface, the emulator's one further assumption, that device memory is
 * host-addressable, is made in csrc/aten/host_addressable.{h,cpp} (every host view of device
 * memory), and by the kernels: csrc/aten's CPU kernels over host views, and the C++ kernels
 * torch.compile generates, which read device memory directly inside their launches. A port to
 * silicon replaces this runtime, host_addressable and the kernel library under csrc/aten; nothing
 * above aten changes (docs/runtime.md).
 */
#ifndef TORCHNEURON_NEURON_RUNTIME_H
#define TORCHNEURON_NEURON_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#if defined(TNRT_BUILDING_LIBRARY)
#define TNRT_API __attribute__((visibility("default")))
#else
#define TNRT_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tnrtStatus {
  TNRT_SUCCESS = 0,
  TNRT_INVALID_DEVICE = 1,  /* device index out of range */
  TNRT_OUT_OF_MEMORY = 2,   /* request above the device's free capacity */
  TNRT_INVALID_VALUE = 3,   /* bad pointer, size or handle */
  TNRT_NOT_READY = 4,       /* asynchronous work is still pending */
  TNRT_KERNEL_FAILED = 5,   /* work run asynchronously failed; tnrtAsyncError() says what */
  TNRT_LAUNCH_FAILED = 6,   /* the work of this (blocking) launch failed; tnrtLastError() says what */
  TNRT_INTERNAL = 7         /* the runtime itself failed (host memory ran out); tnrtLastError() says how */
} tnrtStatus;

TNRT_API const char* tnrtStatusString(tnrtStatus status);
/* The message of the last call on this thread that failed with TNRT_LAUNCH_FAILED or TNRT_INTERNAL
 * (empty: none); valid until the next such failure on this thread. */
TNRT_API const char* tnrtLastError(void);

/* ---- version ------------------------------------------------------------------------------------
 * The interface's version. A change that breaks callers raises the major number; a function added
 * raises the minor one. _C checks at load that the runtime it runs on has its major number and at
 * least its minor one (module.cpp), so a driver built against another interface is refused by name.
 * 2.0: the C interface (1.x was a C++ one, linked into _C). */
#define TNRT_API_VERSION_MAJOR 2
#define TNRT_API_VERSION_MINOR 0
/* The version the runtime was built with: major * 1000 + minor. */
TNRT_API int tnrtApiVersion(void);

/* ---- devices ------------------------------------------------------------------------------------ */
typedef struct tnrtDeviceProperties {
  char name[64];
  size_t total_memory; /* bytes */
  int core_count;      /* compute engines per device */
} tnrtDeviceProperties;

TNRT_API int tnrtDeviceCount(void); /* TORCHNEURON_NUM_DEVICES, default 2 */
TNRT_API tnrtStatus tnrtGetDeviceProperties(int device, tnrtDeviceProperties* props);
TNRT_API tnrtStatus tnrtDeviceSynchronize(int device); /* waits for all streams of a device */

/* ---- memory -------------------------------------------------------------------------------------
 * Device memory. Every byte is charged against the device's capacity (TORCHNEURON_DEVICE_MEMORY,
 * default 16 GiB per device). As on a device, a block's memory costs the host nothing until it is
 * written (blocks of 1 MiB or more; a new block's contents are undefined all the same). */
TNRT_API tnrtStatus tnrtMalloc(int device, void** ptr, size_t nbytes);
TNRT_API tnrtStatus tnrtFree(void* ptr);
/* Charge or release bytes that a kernel produced in place (the zero-copy path hands kernel outputs
 * over to the device without copying them). */
TNRT_API tnrtStatus tnrtReserve(int device, size_t nbytes);
TNRT_API tnrtStatus tnrtRelease(int device, size_t nbytes);
TNRT_API tnrtStatus tnrtMemGetInfo(int device, size_t* free_bytes, size_t* total_bytes);
/* The device a pointer returned by tnrtMalloc() belongs to. */
TNRT_API tnrtStatus tnrtPointerGetDevice(const void* ptr, int* device);

typedef enum tnrtCopyKind {
  TNRT_HOST_TO_DEVICE = 0,
  TNRT_DEVICE_TO_HOST = 1,
  TNRT_DEVICE_TO_DEVICE = 2,
  TNRT_HOST_TO_HOST = 3
} tnrtCopyKind;
TNRT_API tnrtStatus tnrtMemcpy(void* dst, const void* src, size_t nbytes, tnrtCopyKind kind);
/* Sets nbytes of device memory at dst to the byte `value`, as cudaMemset does. Zeros cost no host
 * memory: the whole pages of a large block that the range covers are handed back to the host. */
TNRT_API tnrtStatus tnrtMemset(void* dst, int value, size_t nbytes);

/* Page-locked host memory for fast, asynchronous copies. */
TNRT_API tnrtStatus tnrtHostMalloc(void** ptr, size_t nbytes);
TNRT_API tnrtStatus tnrtHostFree(void* ptr);
TNRT_API int tnrtIsHostPinned(const void* ptr);

/* ---- strict mode (TORCHNEURON_STRICT=1) ----------------------------------------------------------
 * Device memory is out of the host's reach (page protection, in pages of 4 KiB) except the memory
 * of the work the runtime is running. Each piece of work opens a window of its own: the ranges it
 * was launched with (tnrtLaunchInfo.ranges; a copy's source and destination), those added while it
 * runs (tnrtDeviceAccessAdd, on the thread that runs it), for as long as it runs. Windows of work
 * that runs at the same time open the union of their ranges; memory outside every window faults,
 * also while other work runs, and any such host access (from this library, a C++ extension or
 * data_ptr() arithmetic) stops the process at once with a message naming the address and its
 * device. Page protection is the process's, not a thread's: a page stays reachable to all threads
 * while some window opens it, and tensors that share a page are reachable together. */
typedef struct tnrtMemoryRange {
  const void* ptr;
  size_t nbytes;
} tnrtMemoryRange;
TNRT_API int tnrtStrictMode(void);
/* Reports a fault in device memory, then hands it to the SIGSEGV handler installed before this call
 * (e.g. Python's faulthandler, for the Python stack). Strict mode installs it at start. */
TNRT_API void tnrtInstallStrictFaultHandler(void);
/* A window over `ranges` until tnrtDeviceAccessClose (*window is NULL when not strict); windows nest.
 * TNRT_ACCESS_THIS_THREAD: this thread's: tnrtDeviceAccessAdd() on this thread joins it while it is
 * the innermost. TNRT_ACCESS_NO_THREAD: no thread's: for memory another library's threads reach while
 * it holds it (gloo's). */
typedef struct tnrtAccessWindowImpl* tnrtAccessWindow;
typedef enum tnrtAccessOwner { TNRT_ACCESS_THIS_THREAD = 0, TNRT_ACCESS_NO_THREAD = 1 } tnrtAccessOwner;
TNRT_API tnrtStatus tnrtDeviceAccessOpen(const tnrtMemoryRange* ranges, size_t count, tnrtAccessOwner owner,
                                         tnrtAccessWindow* window);
TNRT_API void tnrtDeviceAccessClose(tnrtAccessWindow window);
/* Opens [ptr, ptr + nbytes) for the rest of this thread's innermost window: memory the running work
 * reaches that it was not launched with (a block allocated while it runs). Nothing outside a window,
 * or for memory that is not a device's. */
TNRT_API tnrtStatus tnrtDeviceAccessAdd(const void* ptr, size_t nbytes);
/* Opens all of `device`'s memory for the rest of this thread's innermost window, for host code whose
 * arguments the runtime is not told (an AOTInductor model's C++ kernels). */
TNRT_API tnrtStatus tnrtDeviceAccessAddDevice(int device);
/* The ranges this thread's innermost window has opened so far, for work that reaches the same memory
 * again later in a launch of its own (a CPU autograd graph over device memory): their number, of
 * which the first min(number, capacity) are copied to `ranges`. */
TNRT_API size_t tnrtDeviceAccessRanges(tnrtMemoryRange* ranges, size_t capacity);

/* ---- streams and events -------------------------------------------------------------------------
 * Streams are identified by (device, id); id 0 is the default stream. Work submitted to a stream runs
 * in submission order.
 *
 * Synchronous mode (the default): each kernel runs to completion on the launching thread, so a
 * stream is always idle when control returns to the caller; events still carry real timestamps.
 *
 * Asynchronous mode (TORCHNEURON_ASYNC=1, and in strict mode unless TORCHNEURON_ASYNC=0): each
 * stream runs its work in order on a worker thread of its own, and tnrtEnqueueKernel returns once
 * the work is queued, as a real device's launch does. Ordering between streams holds only through
 * events. Work that fails does not stop its stream: the first error of a device is kept and returned
 * (TNRT_KERNEL_FAILED, text from tnrtAsyncError) by the next call that waits on that device
 * (synchronize, a blocking launch, an event's synchronize), once. */
TNRT_API int tnrtAsyncMode(void);
typedef int64_t tnrtStream;
typedef struct tnrtEventImpl* tnrtEvent;

TNRT_API tnrtStatus tnrtStreamSynchronize(int device, tnrtStream stream);
TNRT_API tnrtStatus tnrtStreamQuery(int device, tnrtStream stream); /* TNRT_SUCCESS or TNRT_NOT_READY */
TNRT_API tnrtStatus tnrtStreamWaitEvent(int device, tnrtStream stream, tnrtEvent event);
/* The length of the message of the device's first asynchronous failure not yet taken (0: none).
 * When `capacity` exceeds that length, the message and its NUL are copied to `buffer` and taken:
 * the next call says nothing until work fails again. */
TNRT_API size_t tnrtAsyncError(int device, char* buffer, size_t capacity);

TNRT_API tnrtStatus tnrtEventCreate(tnrtEvent* event, int enable_timing);
TNRT_API tnrtStatus tnrtEventDestroy(tnrtEvent event);
TNRT_API tnrtStatus tnrtEventRecord(tnrtEvent event, int device, tnrtStream stream);
TNRT_API tnrtStatus tnrtEventQuery(tnrtEvent event); /* TNRT_SUCCESS or TNRT_NOT_READY */
TNRT_API tnrtStatus tnrtEventSynchronize(tnrtEvent event);
TNRT_API int tnrtEventDevice(tnrtEvent event); /* the device of its last record (-1: none) */
TNRT_API tnrtStatus tnrtEventElapsedTime(float* ms, tnrtEvent start, tnrtEvent end); /* TNRT_NOT_READY until both happened */

/* Work on a stream: fn(arg, context). It returns NULL when it succeeded, or a message saying what
 * failed, which the runtime copies at once; it must not let an exception out (a C++ caller's work
 * goes through neuron_runtime.inl, which catches). `context` is the caller's second pointer, e.g. the
 * C++ function an adapter calls. `info` says what the work is (its name is copied). */
typedef const char* (*tnrtKernelFn)(void* arg, void* context);
typedef void (*tnrtKernelDrop)(void* arg);
typedef enum tnrtActivityKind {
  TNRT_ACTIVITY_KERNEL = 0,
  TNRT_ACTIVITY_MEMCPY = 1,
  TNRT_ACTIVITY_MEMSET = 2,
  TNRT_ACTIVITY_COLLECTIVE = 3
} tnrtActivityKind;
typedef struct tnrtLaunchInfo {
  tnrtActivityKind kind;
  const char* name;   /* NULL: "kernel" */
  uint64_t bytes;     /* bytes moved, for copies and collectives */
  /* The device memory the work reads or writes, as a real kernel's arguments name it: strict mode
   * opens only these for it (copied at launch). Host memory among them is ignored. */
  const tnrtMemoryRange* ranges;
  size_t range_count;
} tnrtLaunchInfo;
/* True while this thread runs the body of a blocking launch (tnrtLaunchKernel, or a synchronous
 * enqueue). Host code that calls device ops from inside a kernel (the C++ kernels and C shim calls of
 * an AOTInductor model, which run the CPU's kernels over device memory and dispatch nested ops such
 * as copy_) reads their results at once, so such work runs synchronously: tnrtEnqueueKernel runs it
 * before returning, and aten neither queues nor records (fused eager) the ops it is given there. */
TNRT_API int tnrtInsideKernel(void);
/* A blocking launch: waits until all earlier work on the stream is done, then runs fn on the calling
 * thread. TNRT_LAUNCH_FAILED when fn failed (tnrtLastError() has its message); TNRT_KERNEL_FAILED
 * when earlier asynchronous work did (fn then does not run). For work the host waits for anyway (a
 * read of device memory into a host value, a blocking copy) or whose arguments live on the caller's
 * stack. `info` may be NULL. */
TNRT_API tnrtStatus tnrtLaunchKernel(int device, tnrtStream stream, tnrtKernelFn fn, void* arg, void* context,
                                     const tnrtLaunchInfo* info);
/* An asynchronous launch: fn runs once all earlier work on the stream is done, then drop(arg) (also
 * when fn failed, and when the launch is refused). In synchronous mode, and inside a kernel, both run
 * before the call returns and fn's failure is this call's (TNRT_LAUNCH_FAILED); in asynchronous mode
 * they run on the stream's worker and a failure becomes the device's asynchronous error. `arg` owns
 * what the work needs (device memory is referred to by address, as a real kernel's is). */
TNRT_API tnrtStatus tnrtEnqueueKernel(int device, tnrtStream stream, tnrtKernelFn fn, void* arg, void* context,
                                      tnrtKernelDrop drop, const tnrtLaunchInfo* info);

/* ---- activity records ---------------------------------------------------------------------------
 * While recording is on, the runtime keeps a record of each piece of work it runs on a device: what
 * (kind, name, bytes), where (device, stream), when (host launch and device start and end, in
 * nanoseconds since the Unix epoch) and the host's external correlation id current at launch (the id
 * of the framework op that launched it), as CUPTI's activity API does for CUDA. A profiler turns them
 * into its own events (csrc/profiler/kineto.cpp). */
typedef struct tnrtActivityArg {
  const char* key;
  const char* value;
} tnrtActivityArg;
typedef struct tnrtActivityRecord {
  tnrtActivityKind kind;
  const char* name;
  int device;
  tnrtStream stream;
  uint64_t bytes;
  int64_t launch_ns;    /* host: the launch began */
  int64_t start_ns;     /* device: the work began */
  int64_t end_ns;       /* device: the work ended (and, here, the launch returned) */
  uint64_t correlation; /* external correlation id, 0 when none */
  uint64_t sequence;    /* this runtime's own id of the launch, from 1 */
  int32_t host_thread;  /* the launching thread's system id */
  int nested;           /* launched from inside another launch's body (its time is part of that one's) */
  const tnrtActivityArg* args; /* what the work said of itself (tnrtActivityAnnotate) */
  size_t arg_count;
} tnrtActivityRecord;
TNRT_API int tnrtActivityRecording(void);
TNRT_API tnrtStatus tnrtActivityStart(void); /* clears earlier records */
TNRT_API void tnrtActivityStop(void);
/* Calls visit(record, context) for each record so far, oldest first, and forgets them; a record's
 * strings live until visit returns, and visit must not let an exception out. */
typedef void (*tnrtActivityVisitor)(const tnrtActivityRecord* record, void* context);
TNRT_API tnrtStatus tnrtActivityDrain(tnrtActivityVisitor visit, void* context);
/* Adds `key`: `value` to the record of the work this thread is running (the innermost launch whose
 * body runs here, or the stream worker's current work), shown with its event; nothing while not
 * recording. */
TNRT_API tnrtStatus tnrtActivityAnnotate(const char* key, const char* value);
TNRT_API void tnrtActivityPushExternalCorrelation(uint64_t id); /* per host thread */
TNRT_API void tnrtActivityPopExternalCorrelation(void);
/* For work whose end the host learns later (a collective another thread runs): a record begun now,
 * on this thread (its name is info->name, the caller's), and kept by tnrtActivityEnd, which sets its
 * end, while recording. */
TNRT_API tnrtStatus tnrtActivityBegin(int device, tnrtStream stream, const tnrtLaunchInfo* info,
                                      tnrtActivityRecord* record);
TNRT_API tnrtStatus tnrtActivityEnd(const tnrtActivityRecord* record);
TNRT_API int64_t tnrtActivityClockNs(void); /* the clock of the records' times */

#ifdef __cplusplus
}  // extern "C"
#endif

#if defined(__cplusplus) && !defined(TNRT_BUILDING_LIBRARY) && !defined(TNRT_C_ONLY)
#include "neuron_runtime.inl"
#endif

#endif  // TORCHNEURON_NEURON_RUNTIME_H
