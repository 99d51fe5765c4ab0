// C++ conveniences over the runtime's C API (neuron_runtime.h, which includes this file for C++):
// namespace torchneuron::rt, inline, compiled into the caller (torchneuron._C, the contract test),
// never into the runtime library. What they add to the C calls: C++ enums and RAII, std::string and
// std::vector results, and launches of C++ functions whose exceptions reach the caller as they were
// raised: the work's adapter catches on the caller's side of the boundary, hands the runtime a
// message, and the launch call rethrows the caught exception, so no exception crosses the library.
#ifndef TORCHNEURON_NEURON_RUNTIME_H
#error "include neuron_runtime.h, not neuron_runtime.inl"
#endif

#include <algorithm>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace torchneuron::rt {

enum class Status {
  Success = TNRT_SUCCESS,
  InvalidDevice = TNRT_INVALID_DEVICE,
  OutOfMemory = TNRT_OUT_OF_MEMORY,
  InvalidValue = TNRT_INVALID_VALUE,
  NotReady = TNRT_NOT_READY,
  KernelFailed = TNRT_KERNEL_FAILED,
  LaunchFailed = TNRT_LAUNCH_FAILED,  // the C++ launches below raise the work's exception instead
  Internal = TNRT_INTERNAL,
};
inline Status toStatus(tnrtStatus s) { return static_cast<Status>(s); }
inline const char* statusString(Status s) { return tnrtStatusString(static_cast<tnrtStatus>(s)); }
inline std::string lastError() { return tnrtLastError(); }

// ---- version ----------------------------------------------------------------------------------------
constexpr int kApiVersionMajor = TNRT_API_VERSION_MAJOR;
constexpr int kApiVersionMinor = TNRT_API_VERSION_MINOR;
inline int apiVersion() { return tnrtApiVersion(); }

// ---- devices ----------------------------------------------------------------------------------------
using DeviceProperties = tnrtDeviceProperties;
// The number of devices, the modes below: fixed when the runtime starts (read from the environment
// once), so each is asked of the library once and kept, off the per-op path's calls across it.
inline int deviceCount() {
  static const int count = tnrtDeviceCount();
  return count;
}
inline Status getDeviceProperties(int device, DeviceProperties* props) {
  return toStatus(tnrtGetDeviceProperties(device, props));
}
inline Status deviceSynchronize(int device) { return toStatus(tnrtDeviceSynchronize(device)); }

// ---- memory -----------------------------------------------------------------------------------------
inline Status malloc(int device, void** ptr, size_t nbytes) { return toStatus(tnrtMalloc(device, ptr, nbytes)); }
inline Status free(void* ptr) { return toStatus(tnrtFree(ptr)); }
inline Status reserve(int device, size_t nbytes) { return toStatus(tnrtReserve(device, nbytes)); }
inline void release(int device, size_t nbytes) { (void)tnrtRelease(device, nbytes); }
inline Status memGetInfo(int device, size_t* free_bytes, size_t* total_bytes) {
  return toStatus(tnrtMemGetInfo(device, free_bytes, total_bytes));
}
inline Status pointerGetDevice(const void* ptr, int* device) { return toStatus(tnrtPointerGetDevice(ptr, device)); }

enum class CopyKind {
  HostToDevice = TNRT_HOST_TO_DEVICE,
  DeviceToHost = TNRT_DEVICE_TO_HOST,
  DeviceToDevice = TNRT_DEVICE_TO_DEVICE,
  HostToHost = TNRT_HOST_TO_HOST,
};
inline Status memcpy(void* dst, const void* src, size_t nbytes, CopyKind kind) {
  return toStatus(tnrtMemcpy(dst, src, nbytes, static_cast<tnrtCopyKind>(kind)));
}
inline Status memset(void* dst, int value, size_t nbytes) { return toStatus(tnrtMemset(dst, value, nbytes)); }
inline Status hostMalloc(void** ptr, size_t nbytes) { return toStatus(tnrtHostMalloc(ptr, nbytes)); }
inline Status hostFree(void* ptr) { return toStatus(tnrtHostFree(ptr)); }
inline bool isHostPinned(const void* ptr) { return tnrtIsHostPinned(ptr) != 0; }

// ---- strict mode ------------------------------------------------------------------------------------
using MemoryRange = tnrtMemoryRange;
inline bool strictMode() {
  static const bool on = tnrtStrictMode() != 0;  // fixed at start, as deviceCount()
  return on;
}
inline void installStrictFaultHandler() { tnrtInstallStrictFaultHandler(); }
class DeviceAccess {  // a window over `ranges` for its lifetime (nothing when not strict); nests
 public:
  enum Owner { ThisThread = TNRT_ACCESS_THIS_THREAD, NoThread = TNRT_ACCESS_NO_THREAD };
  DeviceAccess(const MemoryRange* ranges, size_t count, Owner owner = ThisThread) {
    const tnrtStatus s = tnrtDeviceAccessOpen(ranges, count, static_cast<tnrtAccessOwner>(owner), &window_);
    if (s != TNRT_SUCCESS) throw std::runtime_error(std::string("neuron runtime: ") + tnrtLastError());
  }
  ~DeviceAccess() { tnrtDeviceAccessClose(window_); }
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;

 private:
  tnrtAccessWindow window_ = nullptr;
};
inline void deviceAccessAdd(const void* ptr, size_t nbytes) { (void)tnrtDeviceAccessAdd(ptr, nbytes); }
inline void deviceAccessAddDevice(int device) { (void)tnrtDeviceAccessAddDevice(device); }
inline std::vector<MemoryRange> deviceAccessRanges() {
  std::vector<MemoryRange> ranges(tnrtDeviceAccessRanges(nullptr, 0));
  if (!ranges.empty()) ranges.resize(std::min(ranges.size(), tnrtDeviceAccessRanges(ranges.data(), ranges.size())));
  return ranges;
}

// ---- streams and events -----------------------------------------------------------------------------
inline bool asyncMode() {
  static const bool on = tnrtAsyncMode() != 0;  // fixed at start, as deviceCount()
  return on;
}
using Stream = tnrtStream;
using Event = tnrtEvent;
inline Status streamSynchronize(int device, Stream stream) { return toStatus(tnrtStreamSynchronize(device, stream)); }
inline Status streamQuery(int device, Stream stream) { return toStatus(tnrtStreamQuery(device, stream)); }
inline Status streamWaitEvent(int device, Stream stream, Event event) {
  return toStatus(tnrtStreamWaitEvent(device, stream, event));
}
// The message of the device's first asynchronous failure since the last call (empty: none).
inline std::string asyncError(int device) {
  char buffer[1024];
  size_t length = tnrtAsyncError(device, buffer, sizeof(buffer));
  if (length < sizeof(buffer)) return length == 0 ? std::string() : std::string(buffer, length);
  std::string message(length + 1, '\0');
  length = tnrtAsyncError(device, message.data(), message.size());
  message.resize(length < message.size() ? length : 0);
  return message;
}
inline Status eventCreate(Event* event, bool enable_timing) { return toStatus(tnrtEventCreate(event, enable_timing)); }
inline Status eventDestroy(Event event) { return toStatus(tnrtEventDestroy(event)); }
inline Status eventRecord(Event event, int device, Stream stream) {
  return toStatus(tnrtEventRecord(event, device, stream));
}
inline Status eventQuery(Event event) { return toStatus(tnrtEventQuery(event)); }
inline Status eventSynchronize(Event event) { return toStatus(tnrtEventSynchronize(event)); }
inline int eventDevice(Event event) { return tnrtEventDevice(event); }
inline Status eventElapsedTime(float* ms, Event start, Event end) {
  return toStatus(tnrtEventElapsedTime(ms, start, end));
}

enum class ActivityKind {
  Kernel = TNRT_ACTIVITY_KERNEL,
  Memcpy = TNRT_ACTIVITY_MEMCPY,
  Memset = TNRT_ACTIVITY_MEMSET,
  Collective = TNRT_ACTIVITY_COLLECTIVE,
};
struct LaunchInfo {
  ActivityKind kind = ActivityKind::Kernel;
  const char* name = "kernel";
  uint64_t bytes = 0;
  const MemoryRange* ranges = nullptr;
  size_t range_count = 0;
  tnrtLaunchInfo c() const {
    return {static_cast<tnrtActivityKind>(kind), name, bytes, ranges, range_count};
  }
};
inline bool insideKernel() { return tnrtInsideKernel() != 0; }

// C++ work: fn(arg), which may raise.
using KernelFn = void (*)(void* arg);
using KernelDrop = tnrtKernelDrop;
namespace detail {
// The exception the work of a launch on this thread raised, for the launch call to rethrow.
inline thread_local std::exception_ptr raised;
inline thread_local std::string raised_message;
// The adapter the runtime calls: runs the C++ function `context` on `arg`, and catches.
inline const char* runCxx(void* arg, void* context) noexcept {
  try {
    reinterpret_cast<KernelFn>(context)(arg);
    return nullptr;
  } catch (...) {
    try {
      // Kept only for a launch whose caller waits on this thread: inside a blocking launch's body.
      if (tnrtInsideKernel()) raised = std::current_exception();
      try {
        throw;
      } catch (const std::exception& e) {
        raised_message = e.what();
      } catch (...) {
        raised_message = "unknown exception";
      }
      return raised_message.c_str();
    } catch (...) {
      return "an exception (and no memory to say which)";
    }
  }
}
// A launch's status: its work's exception, raised again here.
inline Status rethrowRaised(tnrtStatus s) {
  if (s == TNRT_LAUNCH_FAILED) {
    if (raised) std::rethrow_exception(std::exchange(raised, nullptr));
    throw std::runtime_error(tnrtLastError());
  }
  return toStatus(s);
}
}  // namespace detail

// A blocking launch: waits until all earlier work on the stream is done, then runs fn(arg) on the
// calling thread; an exception it raises reaches the caller.
inline Status launchKernel(int device, Stream stream, KernelFn fn, void* arg, const LaunchInfo& info = {}) {
  if (fn == nullptr) return Status::InvalidValue;
  const tnrtLaunchInfo c = info.c();
  return detail::rethrowRaised(
      tnrtLaunchKernel(device, stream, &detail::runCxx, arg, reinterpret_cast<void*>(fn), &c));
}
// An asynchronous launch: fn(arg) runs once all earlier work on the stream is done, then drop(arg).
// In synchronous mode both run before the call returns and an exception fn raises reaches the caller;
// in asynchronous mode an exception becomes the device's asynchronous error (its what()).
inline Status enqueueKernel(int device, Stream stream, KernelFn fn, void* arg, KernelDrop drop,
                            const LaunchInfo& info = {}) {
  const tnrtLaunchInfo c = info.c();
  return detail::rethrowRaised(tnrtEnqueueKernel(device, stream, fn != nullptr ? &detail::runCxx : nullptr, arg,
                                                 reinterpret_cast<void*>(fn), drop, &c));
}

// ---- activity records -------------------------------------------------------------------------------
struct ActivityRecord {
  ActivityKind kind;
  std::string name;
  int device;
  Stream stream;
  uint64_t bytes;
  int64_t launch_ns;
  int64_t start_ns;
  int64_t end_ns;
  uint64_t correlation;
  uint64_t sequence;
  int32_t host_thread;
  bool nested = false;
  std::vector<std::pair<std::string, std::string>> args;
};
inline bool activityRecording() { return tnrtActivityRecording() != 0; }
inline void activityStart() {
  if (tnrtActivityStart() != TNRT_SUCCESS) throw std::runtime_error(tnrtLastError());
}
inline void activityStop() { tnrtActivityStop(); }
inline std::vector<ActivityRecord> activityDrain() {
  struct Drained {
    std::vector<ActivityRecord> records;
    bool failed = false;
  } drained;
  const tnrtStatus s = tnrtActivityDrain(
      [](const tnrtActivityRecord* r, void* p) {
        auto* d = static_cast<Drained*>(p);
        try {
          ActivityRecord record{static_cast<ActivityKind>(r->kind), r->name != nullptr ? r->name : "",
                                r->device, r->stream, r->bytes, r->launch_ns, r->start_ns, r->end_ns,
                                r->correlation, r->sequence, r->host_thread, r->nested != 0, {}};
          for (size_t i = 0; i < r->arg_count; ++i) record.args.emplace_back(r->args[i].key, r->args[i].value);
          d->records.push_back(std::move(record));
        } catch (...) {
          d->failed = true;
        }
      },
      &drained);
  if (s != TNRT_SUCCESS || drained.failed) throw std::bad_alloc();
  return std::move(drained.records);
}
inline void activityAnnotate(const char* key, const std::string& value) {
  (void)tnrtActivityAnnotate(key, value.c_str());
}
inline void activityPushExternalCorrelation(uint64_t id) { tnrtActivityPushExternalCorrelation(id); }
inline void activityPopExternalCorrelation() { tnrtActivityPopExternalCorrelation(); }
inline int64_t activityClockNs() { return tnrtActivityClockNs(); }
// For work whose end the host learns later (a collective another thread runs): a record begun now,
// on this thread, and added when it ends (kept only while recording).
inline ActivityRecord activityBegin(int device, Stream stream, const LaunchInfo& info) {
  const tnrtLaunchInfo c = info.c();
  tnrtActivityRecord r{};
  (void)tnrtActivityBegin(device, stream, &c, &r);
  return ActivityRecord{info.kind, info.name != nullptr ? info.name : "kernel", device, stream, info.bytes,
                        r.launch_ns, r.start_ns, r.end_ns, r.correlation, r.sequence, r.host_thread, false, {}};
}
inline void activityEnd(const ActivityRecord& record) {
  std::vector<tnrtActivityArg> args;
  args.reserve(record.args.size());
  for (const auto& [key, value] : record.args) args.push_back({key.c_str(), value.c_str()});
  const tnrtActivityRecord r{static_cast<tnrtActivityKind>(record.kind), record.name.c_str(), record.device,
                             record.stream, record.bytes, record.launch_ns, record.start_ns, record.end_ns,
                             record.correlation, record.sequence, record.host_thread, record.nested,
                             args.data(), args.size()};
  (void)tnrtActivityEnd(&r);
}

}  // namespace torchneuron::rt
