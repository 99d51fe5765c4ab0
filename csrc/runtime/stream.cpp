// Emulated NeuronCore: streams, events and kernel launch.
//
// Kernels run to completion on the launching thread, so every stream is idle
// whenever the host looks at it; ordering between streams therefore always
// holds. Events record the time at which all earlier work on their stream was
// done, which is what elapsed_time() reports.
#include "neuron_runtime.h"

#include <chrono>
#include <utility>

namespace torchneuron::rt {

struct EventImpl {
  bool enable_timing = false;
  bool recorded = false;
  int device = -1;
  std::chrono::steady_clock::time_point time;
};

namespace {
bool validDevice(int device) { return device >= 0 && device < deviceCount(); }
}  // namespace

Status streamSynchronize(int device, Stream /*stream*/) {
  return validDevice(device) ? Status::Success : Status::InvalidDevice;
}

Status streamQuery(int device, Stream /*stream*/) {
  return validDevice(device) ? Status::Success : Status::InvalidDevice;
}

Status streamWaitEvent(int device, Stream /*stream*/, Event event) {
  if (!validDevice(device)) return Status::InvalidDevice;
  return event == nullptr ? Status::InvalidValue : Status::Success;
}

Status eventCreate(Event* event, bool enable_timing) {
  if (event == nullptr) return Status::InvalidValue;
  *event = new EventImpl();
  (*event)->enable_timing = enable_timing;
  return Status::Success;
}

Status eventDestroy(Event event) {
  delete event;
  return Status::Success;
}

Status eventRecord(Event event, int device, Stream /*stream*/) {
  if (event == nullptr) return Status::InvalidValue;
  if (!validDevice(device)) return Status::InvalidDevice;
  event->device = device;
  event->recorded = true;
  event->time = std::chrono::steady_clock::now();
  return Status::Success;
}

Status eventQuery(Event event) {
  return event == nullptr ? Status::InvalidValue : Status::Success;
}

Status eventSynchronize(Event event) {
  return event == nullptr ? Status::InvalidValue : Status::Success;
}

Status eventElapsedTime(float* ms, Event start, Event end) {
  if (ms == nullptr || start == nullptr || end == nullptr) return Status::InvalidValue;
  if (!start->enable_timing || !end->enable_timing || !start->recorded || !end->recorded)
    return Status::InvalidValue;
  *ms = std::chrono::duration<float, std::milli>(end->time - start->time).count();
  return Status::Success;
}

Status launchKernel(int device, Stream stream, KernelFn fn, void* arg, const LaunchInfo& info) {
  if (!validDevice(device)) return Status::InvalidDevice;
  if (fn == nullptr) return Status::InvalidValue;
  DeviceAccess access;  // strict mode: device memory is reachable while the kernel runs
  if (!activityRecording()) {
    fn(arg);
    return Status::Success;
  }
  // The stream is idle, so the work starts at once and ends when fn returns (or raises).
  ActivityRecord record = activityBegin(device, stream, info);
  record.start_ns = activityClockNs();
  try {
    fn(arg);
  } catch (...) {
    activityEnd(std::move(record));
    throw;
  }
  activityEnd(std::move(record));
  return Status::Success;
}

}  // namespace torchneuron::rt
