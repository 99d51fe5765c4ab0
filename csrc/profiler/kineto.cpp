// The neuron device's activity profiler for torch.profiler (Kineto).
//
// PyTorch's profiler runs Kineto; a PrivateUse1 backend adds its device's
// activity to Kineto's trace with an IActivityProfiler registered through
// REGISTER_PRIVATEUSE1_PROFILER (torch/csrc/profiler/standalone/
// privateuse1_profiler.h). Kineto asks it for a session when a profile with
// ProfilerActivity.PrivateUse1 starts, hands it the correlation id of each
// framework op as the op begins, and collects its events at the end.
//
// A session turns on the runtime's activity records (neuron_runtime.h) and
// forwards correlation ids to it; at the end it turns each record into two
// Kineto events, as CUDA's traces have them: the launch on the host thread
// (PRIVATEUSE1_RUNTIME, "neuronLaunchKernel", "neuronMemcpy", ...) and the
// work on the device's stream (CONCURRENT_KERNEL, GPU_MEMCPY), joined by a
// flow arrow and both linked to the op that launched them. PyTorch reads the
// device events back as PrivateUse1 time of that op (key_averages()'s device
// columns) and Chrome traces show a process per device with a lane per stream.
#define USE_KINETO 1
// fmt (which Kineto's event metadata uses) compiled into this file: libtorch does not export it.
#define FMT_HEADER_ONLY 1

#include "../aten/device.h"
#include "../aten/held_work.h"

#include <GenericTraceActivity.h>
#include <IActivityProfiler.h>
#include <libkineto.h>
#include <output_base.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <unistd.h>
#include <utility>
#include <vector>

namespace torchneuron::profiler {
namespace {

using libkineto::ActivityType;

// Where device lanes go in a trace viewer: after the host's.
constexpr int64_t kSortAfterHost = 0x1000000;

const char* launchName(rt::ActivityKind kind) {
  switch (kind) {
    case rt::ActivityKind::Kernel: return "neuronLaunchKernel";
    case rt::ActivityKind::Memcpy: return "neuronMemcpyAsync";
    case rt::ActivityKind::Memset: return "neuronMemsetAsync";
    case rt::ActivityKind::Collective: return "neuronCollectiveLaunch";
  }
  return "neuronLaunch";
}

ActivityType deviceType(rt::ActivityKind kind) {
  switch (kind) {
    case rt::ActivityKind::Memcpy: return ActivityType::GPU_MEMCPY;
    case rt::ActivityKind::Memset: return ActivityType::GPU_MEMSET;
    default: return ActivityType::CONCURRENT_KERNEL;
  }
}

const std::set<ActivityType>& supported() {
  static const std::set<ActivityType> types = {ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY,
                                               ActivityType::GPU_MEMSET, ActivityType::PRIVATEUSE1_RUNTIME};
  return types;
}

class Session : public libkineto::IActivityProfilerSession {
 public:
  explicit Session(std::set<ActivityType> types) : types_(std::move(types)) {}

  void start() override {
    rt::activityStart();
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    // Work queued while recording is part of the profile (as CUPTI records a kernel launched
    // during the trace): the devices' streams are drained first. Their errors stay for the
    // program's next synchronization.
    if (rt::asyncMode())
      for (int device = 0; device < rt::deviceCount(); ++device) (void)runtime::synchronizeDevice(device);
    rt::activityStop();
    records_ = rt::activityDrain();
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override { return {}; }

  void processTrace(libkineto::ActivityLogger& logger) override { processTrace(logger, nullptr, 0, 0); }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked,
                    int64_t window_start, int64_t window_end) override {
    // The events point at their span: it lives in a buffer that moves only as a pointer.
    buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
    buffer_->span = libkineto::TraceSpan(window_start, window_end, "neuron");
    const bool runtime = types_.count(ActivityType::PRIVATEUSE1_RUNTIME) > 0;
    const int32_t pid = static_cast<int32_t>(::getpid());
    std::set<std::pair<int, int64_t>> lanes;
    for (const auto& r : records_) {
      const auto type = deviceType(r.kind);
      if (!types_.count(type)) continue;
      // Work launched inside another launch's body is part of that one's time: only the outermost is
      // the op's device time (key_averages() would count it twice), and it was no launch of the host's.
      const auto* op = linked && r.correlation != 0 && !r.nested ? linked(static_cast<int32_t>(r.correlation)) : nullptr;
      const auto id = static_cast<int32_t>(r.sequence);
      // The work on the device's stream.
      auto work = std::make_unique<libkineto::GenericTraceActivity>(buffer_->span, type, r.name);
      work->startTime = r.start_ns;
      work->endTime = r.end_ns;
      work->id = id;
      work->device = r.device;
      work->resource = static_cast<int32_t>(r.stream);
      work->linked = op;
      work->flow.id = static_cast<uint32_t>(r.sequence);
      work->flow.type = libkineto::kLinkAsyncCpuGpu;
      work->flow.start = false;
      work->addMetadata("device", r.device);
      work->addMetadata("stream", r.stream);
      work->addMetadata("correlation", r.sequence);
      if (r.bytes > 0) work->addMetadata("bytes", r.bytes);
      if (r.nested) work->addMetadata("nested", 1);
      for (const auto& [key, value] : r.args) work->addMetadataQuoted(key, value);
      lanes.emplace(r.device, r.stream);
      logger.handleActivity(*work);
      buffer_->activities.push_back(std::move(work));
      ++buffer_->gpuOpCount;
      if (!runtime || r.nested) continue;
      // Its launch on the host thread, until the work started (the host then waits in the op, as
      // for a synchronous launch: work the device did is not the launch's).
      auto launch = std::make_unique<libkineto::GenericTraceActivity>(buffer_->span, ActivityType::PRIVATEUSE1_RUNTIME,
                                                                      launchName(r.kind));
      launch->startTime = r.launch_ns;
      launch->endTime = std::max(r.start_ns, r.launch_ns + 1);
      launch->id = id;
      launch->device = pid;
      launch->resource = r.host_thread;
      launch->threadId = r.host_thread;
      launch->linked = op;
      launch->flow.id = static_cast<uint32_t>(r.sequence);
      launch->flow.type = libkineto::kLinkAsyncCpuGpu;
      launch->flow.start = true;
      launch->addMetadata("correlation", r.sequence);
      logger.handleActivity(*launch);
      buffer_->activities.push_back(std::move(launch));
    }
    // A process per device, a lane per stream.
    std::set<int> devices;
    for (const auto& [device, stream] : lanes) {
      if (devices.insert(device).second && device != 0) {
        logger.handleDeviceInfo(deviceInfo(device), window_start);
      }
      resources_.push_back(libkineto::ResourceInfo{stream, stream, device, "stream " + std::to_string(stream)});
    }
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    // Device 0 here (the others are logged with their events); having one also keeps Kineto
    // from labelling processes 0-15 "GPU n".
    return std::make_unique<libkineto::DeviceInfo>(deviceInfo(0));
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override { return resources_; }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override {
    return std::move(buffer_);
  }

  void pushCorrelationId(uint64_t id) override { rt::activityPushExternalCorrelation(id); }
  void popCorrelationId() override { rt::activityPopExternalCorrelation(); }

  std::string getDeviceProperties() override {
    rt::DeviceProperties props{};
    std::string out;
    for (int d = 0; d < rt::deviceCount(); ++d) {
      if (rt::getDeviceProperties(d, &props) != rt::Status::Success) continue;
      if (!out.empty()) out += ",";
      out += "\n    {\"id\": " + std::to_string(d) + ", \"name\": \"" + props.name +
             "\", \"totalGlobalMem\": " + std::to_string(props.total_memory) + "}";
    }
    return out;
  }

 private:
  static libkineto::DeviceInfo deviceInfo(int device) {
    return libkineto::DeviceInfo{device, kSortAfterHost + device, "neuron " + std::to_string(device),
                                 "neuron " + std::to_string(device)};
  }

  const std::set<ActivityType> types_;
  std::vector<rt::ActivityRecord> records_;
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
  std::vector<libkineto::ResourceInfo> resources_;
};

class NeuronActivityProfiler : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }

  const std::set<ActivityType>& availableActivities() const override { return supported(); }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<ActivityType>& activity_types,
                                                                 const libkineto::Config& /*config*/) override {
    std::set<ActivityType> types;
    for (auto t : activity_types)
      if (supported().count(t)) types.insert(t);
    // A profile of the CPU alone asks for none of the device's activities: no session, no cost.
    bool device_work = false;
    for (auto t : types) device_work = device_work || t != ActivityType::PRIVATEUSE1_RUNTIME;
    if (!device_work) return nullptr;
    return std::make_unique<Session>(std::move(types));
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t /*ts_ms*/, int64_t /*duration_ms*/,
                                                                 const std::set<ActivityType>& activity_types,
                                                                 const libkineto::Config& config) override {
    return configure(activity_types, config);
  }

 private:
  std::string name_ = "neuron";
};

REGISTER_PRIVATEUSE1_PROFILER(NeuronActivityProfiler);

}  // namespace
}  // namespace torchneuron::profiler
