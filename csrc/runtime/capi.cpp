// The C API of neuron_runtime.h over the emulator's C++ (runtime.h). Every entry catches: an exception
// of the runtime's own (host memory ran out) becomes TNRT_INTERNAL, with its text as tnrtLastError(),
// and never leaves the library.
#include "runtime.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <utility>
#include <vector>

namespace emu = torchneuron::emu;

namespace {

tnrtStatus c(emu::Status s) { return static_cast<tnrtStatus>(s); }

tnrtStatus internalError() {
  try {
    throw;
  } catch (const std::exception& e) {
    emu::setLastError(e.what());
  } catch (...) {
    emu::setLastError("unknown exception");
  }
  return TNRT_INTERNAL;
}

// Runs `f` (returning an emu::Status), catching at the boundary.
template <class F>
tnrtStatus guarded(F&& f) noexcept {
  try {
    return c(f());
  } catch (...) {
    return internalError();
  }
}

emu::LaunchInfo launchInfo(const tnrtLaunchInfo* info) {
  emu::LaunchInfo l;
  if (info == nullptr) return l;
  l.kind = static_cast<emu::ActivityKind>(info->kind);
  if (info->name != nullptr) l.name = info->name;
  l.bytes = info->bytes;
  l.ranges = info->ranges;
  l.range_count = info->ranges != nullptr ? info->range_count : 0;
  return l;
}

}  // namespace

extern "C" {

const char* tnrtStatusString(tnrtStatus status) { return emu::statusString(static_cast<emu::Status>(status)); }
const char* tnrtLastError(void) { return emu::lastError(); }
int tnrtApiVersion(void) { return emu::apiVersion(); }

// ---- devices ----
int tnrtDeviceCount(void) { return emu::deviceCount(); }
tnrtStatus tnrtGetDeviceProperties(int device, tnrtDeviceProperties* props) {
  return c(emu::getDeviceProperties(device, props));
}
tnrtStatus tnrtDeviceSynchronize(int device) {
  return guarded([&] { return emu::deviceSynchronize(device); });
}

// ---- memory ----
tnrtStatus tnrtMalloc(int device, void** ptr, size_t nbytes) {
  return guarded([&] { return emu::malloc(device, ptr, nbytes); });
}
tnrtStatus tnrtFree(void* ptr) {
  return guarded([&] { return emu::free(ptr); });
}
tnrtStatus tnrtReserve(int device, size_t nbytes) {
  return guarded([&] { return emu::reserve(device, nbytes); });
}
tnrtStatus tnrtRelease(int device, size_t nbytes) {
  return guarded([&] {
    emu::release(device, nbytes);
    return emu::Status::Success;
  });
}
tnrtStatus tnrtMemGetInfo(int device, size_t* free_bytes, size_t* total_bytes) {
  return guarded([&] { return emu::memGetInfo(device, free_bytes, total_bytes); });
}
tnrtStatus tnrtPointerGetDevice(const void* ptr, int* device) {
  return guarded([&] { return emu::pointerGetDevice(ptr, device); });
}
tnrtStatus tnrtMemcpy(void* dst, const void* src, size_t nbytes, tnrtCopyKind kind) {
  return guarded([&] { return emu::memcpy(dst, src, nbytes, static_cast<emu::CopyKind>(kind)); });
}
tnrtStatus tnrtMemset(void* dst, int value, size_t nbytes) {
  return guarded([&] { return emu::memset(dst, value, nbytes); });
}
tnrtStatus tnrtHostMalloc(void** ptr, size_t nbytes) {
  return guarded([&] { return emu::hostMalloc(ptr, nbytes); });
}
tnrtStatus tnrtHostFree(void* ptr) {
  return guarded([&] { return emu::hostFree(ptr); });
}
int tnrtIsHostPinned(const void* ptr) {
  try {
    return emu::isHostPinned(ptr) ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

// ---- strict mode ----
int tnrtStrictMode(void) {
  try {
    return emu::strictMode() ? 1 : 0;
  } catch (...) {
    return 0;
  }
}
void tnrtInstallStrictFaultHandler(void) { emu::installStrictFaultHandler(); }
tnrtStatus tnrtDeviceAccessOpen(const tnrtMemoryRange* ranges, size_t count, tnrtAccessOwner owner,
                                tnrtAccessWindow* window) {
  if (window == nullptr) return TNRT_INVALID_VALUE;
  *window = nullptr;
  return guarded([&] {
    if (emu::strictMode())
      *window = reinterpret_cast<tnrtAccessWindow>(new emu::DeviceAccess(
          ranges, ranges != nullptr ? count : 0,
          owner == TNRT_ACCESS_NO_THREAD ? emu::DeviceAccess::NoThread : emu::DeviceAccess::ThisThread));
    return emu::Status::Success;
  });
}
void tnrtDeviceAccessClose(tnrtAccessWindow window) {
  delete reinterpret_cast<emu::DeviceAccess*>(window);
}
tnrtStatus tnrtDeviceAccessAdd(const void* ptr, size_t nbytes) {
  return guarded([&] {
    emu::deviceAccessAdd(ptr, nbytes);
    return emu::Status::Success;
  });
}
tnrtStatus tnrtDeviceAccessAddDevice(int device) {
  return guarded([&] {
    emu::deviceAccessAddDevice(device);
    return emu::Status::Success;
  });
}
size_t tnrtDeviceAccessRanges(tnrtMemoryRange* ranges, size_t capacity) {
  try {
    const std::vector<emu::MemoryRange> open = emu::deviceAccessRanges();
    if (ranges != nullptr) std::copy_n(open.begin(), std::min(capacity, open.size()), ranges);
    return open.size();
  } catch (...) {
    internalError();
    return 0;
  }
}

// ---- streams and events ----
int tnrtAsyncMode(void) {
  try {
    return emu::asyncMode() ? 1 : 0;
  } catch (...) {
    return 0;
  }
}
tnrtStatus tnrtStreamSynchronize(int device, tnrtStream stream) {
  return guarded([&] { return emu::streamSynchronize(device, stream); });
}
tnrtStatus tnrtStreamQuery(int device, tnrtStream stream) {
  return guarded([&] { return emu::streamQuery(device, stream); });
}
tnrtStatus tnrtStreamWaitEvent(int device, tnrtStream stream, tnrtEvent event) {
  return guarded([&] { return emu::streamWaitEvent(device, stream, event); });
}
size_t tnrtAsyncError(int device, char* buffer, size_t capacity) {
  try {
    return emu::asyncErrorInto(device, buffer, capacity);
  } catch (...) {
    internalError();
    return 0;
  }
}
tnrtStatus tnrtEventCreate(tnrtEvent* event, int enable_timing) {
  return guarded([&] { return emu::eventCreate(event, enable_timing != 0); });
}
tnrtStatus tnrtEventDestroy(tnrtEvent event) {
  return guarded([&] { return emu::eventDestroy(event); });
}
tnrtStatus tnrtEventRecord(tnrtEvent event, int device, tnrtStream stream) {
  return guarded([&] { return emu::eventRecord(event, device, stream); });
}
tnrtStatus tnrtEventQuery(tnrtEvent event) {
  return guarded([&] { return emu::eventQuery(event); });
}
tnrtStatus tnrtEventSynchronize(tnrtEvent event) {
  return guarded([&] { return emu::eventSynchronize(event); });
}
int tnrtEventDevice(tnrtEvent event) { return emu::eventDevice(event); }
tnrtStatus tnrtEventElapsedTime(float* ms, tnrtEvent start, tnrtEvent end) {
  return guarded([&] { return emu::eventElapsedTime(ms, start, end); });
}

int tnrtInsideKernel(void) { return emu::insideKernel() ? 1 : 0; }
tnrtStatus tnrtLaunchKernel(int device, tnrtStream stream, tnrtKernelFn fn, void* arg, void* context,
                            const tnrtLaunchInfo* info) {
  return guarded([&] { return emu::launchKernel(device, stream, fn, arg, context, launchInfo(info)); });
}
tnrtStatus tnrtEnqueueKernel(int device, tnrtStream stream, tnrtKernelFn fn, void* arg, void* context,
                             tnrtKernelDrop drop, const tnrtLaunchInfo* info) {
  return guarded([&] { return emu::enqueueKernel(device, stream, fn, arg, context, drop, launchInfo(info)); });
}

// ---- activity records ----
int tnrtActivityRecording(void) { return emu::activityRecording() ? 1 : 0; }
tnrtStatus tnrtActivityStart(void) {
  return guarded([&] {
    emu::activityStart();
    return emu::Status::Success;
  });
}
void tnrtActivityStop(void) { emu::activityStop(); }
tnrtStatus tnrtActivityDrain(tnrtActivityVisitor visit, void* context) {
  if (visit == nullptr) return TNRT_INVALID_VALUE;
  return guarded([&] {
    const std::vector<emu::ActivityRecord> records = emu::activityDrain();
    std::vector<tnrtActivityArg> args;
    for (const auto& r : records) {
      args.clear();
      for (const auto& [key, value] : r.args) args.push_back({key.c_str(), value.c_str()});
      const tnrtActivityRecord record{static_cast<tnrtActivityKind>(r.kind), r.name.c_str(), r.device, r.stream,
                                      r.bytes, r.launch_ns, r.start_ns, r.end_ns, r.correlation, r.sequence,
                                      r.host_thread, r.nested ? 1 : 0, args.data(), args.size()};
      visit(&record, context);
    }
    return emu::Status::Success;
  });
}
tnrtStatus tnrtActivityAnnotate(const char* key, const char* value) {
  return guarded([&] {
    emu::activityAnnotate(key, value != nullptr ? value : "");
    return emu::Status::Success;
  });
}
void tnrtActivityPushExternalCorrelation(uint64_t id) {
  try {
    emu::activityPushExternalCorrelation(id);
  } catch (...) {
    internalError();
  }
}
void tnrtActivityPopExternalCorrelation(void) { emu::activityPopExternalCorrelation(); }
tnrtStatus tnrtActivityBegin(int device, tnrtStream stream, const tnrtLaunchInfo* info, tnrtActivityRecord* record) {
  if (record == nullptr) return TNRT_INVALID_VALUE;
  return guarded([&] {
    const emu::LaunchInfo l = launchInfo(info);
    const emu::ActivityRecord r = emu::activityBegin(device, stream, l);
    *record = tnrtActivityRecord{static_cast<tnrtActivityKind>(r.kind), l.name, r.device, r.stream, r.bytes,
                                 r.launch_ns, r.start_ns, r.end_ns, r.correlation, r.sequence, r.host_thread,
                                 r.nested ? 1 : 0, nullptr, 0};
    return emu::Status::Success;
  });
}
tnrtStatus tnrtActivityEnd(const tnrtActivityRecord* record) {
  if (record == nullptr) return TNRT_INVALID_VALUE;
  return guarded([&] {
    emu::ActivityRecord r{static_cast<emu::ActivityKind>(record->kind), record->name != nullptr ? record->name : "kernel",
                          record->device, record->stream, record->bytes, record->launch_ns, record->start_ns,
                          record->end_ns, record->correlation, record->sequence, record->host_thread,
                          record->nested != 0, {}};
    for (size_t i = 0; i < record->arg_count; ++i)
      r.args.emplace_back(record->args[i].key != nullptr ? record->args[i].key : "",
                          record->args[i].value != nullptr ? record->args[i].value : "");
    emu::activityEnd(std::move(r));
    return emu::Status::Success;
  });
}
int64_t tnrtActivityClockNs(void) { return emu::activityClockNs(); }

}  // extern "C"
