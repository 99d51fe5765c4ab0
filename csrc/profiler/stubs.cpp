// The neuron device's methods for PyTorch's legacy (event-pair) profiler.
//
// torch.autograd.profiler.profile(use_device="neuron") runs Kineto in the state
// KINETO_PRIVATEUSE1_FALLBACK: at each op's start and end PyTorch's observer
// (profiler_kineto.cpp, ThreadLocalSubqueue::begin_op and onFunctionExit) asks
// the PrivateUse1 backend's ProfilerStubs (torch/csrc/profiler/stubs/base.h) to
// record an event, and after the profile it asks for the time between the two:
// that is the op's device time (KinetoEvent::privateuse1ElapsedUs, in
// microseconds), shown in key_averages()' device columns. CUDA's stubs record
// cudaEvents on the current stream; these record the runtime's events on the
// current neuron stream, the same ones torch.neuron.Event uses.
//
// Without a registration PyTorch's default stubs raise from every record: the
// observer's start callback fails after the op's event was begun, its end
// callback then finds no context (an internal assertion with a backtrace, per
// op, logged by RecordFunction), the op's event keeps neither start nor end time (negative
// CPU times) and each op pays for two exceptions with symbolized backtraces.
#include "../aten/device.h"
#include "../aten/held_work.h"
#include "../aten/launch.h"

#include <c10/core/DeviceGuard.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <functional>
#include <memory>

namespace torchneuron::profiler {
namespace {

using torch::profiler::impl::ProfilerVoidEventStub;

// What the profiler keeps of an op's start or end: the runtime's event and where it was recorded.
struct Marker {
  rt::Event event = nullptr;
  c10::DeviceIndex device = 0;
  rt::Stream stream = 0;
  ~Marker() {
    if (event != nullptr) rt::eventDestroy(event);
  }
};

const Marker& markerOf(const ProfilerVoidEventStub* stub) {
  TORCH_CHECK(stub != nullptr && *stub != nullptr, "neuron profiler: an op's event was not recorded");
  return *static_cast<const Marker*>(stub->get());
}

struct NeuronProfilerStubs final : torch::profiler::impl::ProfilerStubs {
  // An event on the current device's current stream: it happens when the stream reaches it, after
  // the work launched before it (on the emulator's synchronous streams, at once).
  void record(c10::DeviceIndex* device, ProfilerVoidEventStub* event, int64_t* cpu_ns) const override {
    auto marker = std::make_shared<Marker>();
    marker->device = currentDevice();
    marker->stream = currentStream(marker->device).id();
    if (device != nullptr) *device = marker->device;
    TORCH_CHECK(rt::eventCreate(&marker->event, /*enable_timing=*/true) == rt::Status::Success &&
                    marker->event != nullptr,
                "neuron profiler: could not create an event");
    if (cpu_ns != nullptr) *cpu_ns = c10::getTime();
    // Straight to the runtime: work fused eager holds back stays held (an event the user records
    // hands it over; the profiler must not change how the program runs). Held work's device time
    // then belongs to the op that hands it over, as in torch.profiler's device timeline.
    checkRuntime(rt::eventRecord(marker->event, marker->device, marker->stream), marker->device,
                 "profiler event record");
    *event = std::move(marker);
  }

  // Microseconds between two events (privateuse1ElapsedUs takes this as microseconds, as it does
  // CUDA's). Two events of different streams (a range that switched the current device or stream
  // before it ended) bound no interval of one stream's work: no time (PyTorch then counts no
  // device time of the range's own, only its children's).
  float elapsed(const ProfilerVoidEventStub* event, const ProfilerVoidEventStub* event2) const override {
    const Marker& start = markerOf(event);
    const Marker& end = markerOf(event2);
    if (start.device != end.device || start.stream != end.stream) return 0.0f;
    for (const Marker* m : {&start, &end})
      if (rt::eventQuery(m->event) != rt::Status::Success)
        checkRuntime(rt::eventSynchronize(m->event), m->device, "profiler event");
    float ms = 0;
    const rt::Status status = rt::eventElapsedTime(&ms, start.event, end.event);
    TORCH_CHECK(status == rt::Status::Success, "neuron profiler: no time between an op's events: ",
                rt::statusString(status));
    return ms * 1000.0f;
  }

  // Markers and ranges are for an external tracer (NVTX's role for CUDA); the emulated device has
  // none: its timeline is torch.profiler's (kineto.cpp).
  void mark(const char* /*name*/) const override {}
  void rangePush(const char* /*name*/) const override {}
  void rangePop() const override {}

  bool enabled() const override { return true; }

  void onEachDevice(std::function<void(int)> op) const override {
    for (c10::DeviceIndex d = 0; d < deviceCount(); ++d) {
      c10::DeviceGuard guard(c10::Device(kNeuron, d));
      op(d);
    }
  }

  void synchronize() const override {
    for (c10::DeviceIndex d = 0; d < deviceCount(); ++d)
      checkRuntime(runtime::synchronizeDevice(d), d, "synchronize");
  }
};

struct Registration {
  Registration() {
    static NeuronProfilerStubs stubs;
    torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  }
};
Registration registration;

}  // namespace
}  // namespace torchneuron::profiler
