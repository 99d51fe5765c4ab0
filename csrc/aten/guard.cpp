// The current device and stream of each thread, and PyTorch's device guard.
#include "launch.h"
#include "device_init.h"
#include "allocator.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>

namespace torchneuron {
namespace {

constexpr int kStreamsPerPool = 32;

thread_local c10::DeviceIndex tls_device = 0;
thread_local std::array<c10::StreamId, kMaxDevices> tls_streams{};  // 0: default stream

std::array<std::atomic<uint32_t>, kMaxDevices> pool_counters{};
std::atomic<c10::StreamId> next_stream_id{kStreamsPerPool + 1};

}  // namespace

c10::DeviceIndex deviceCount() { return static_cast<c10::DeviceIndex>(rt::deviceCount()); }

void checkDevice(c10::DeviceIndex index) {
  const auto count = deviceCount();
  if (C10_LIKELY(index >= 0 && index < count)) return;
  TORCH_CHECK(false,
      "Invalid device neuron:", int(index), ": there ", count == 1 ? "is " : "are ", int(count),
      " neuron device", count == 1 ? "" : "s",
      count > 0 ? " (valid indices are 0 to " + std::to_string(count - 1) + ")" : std::string(),
      ". Set TORCHNEURON_NUM_DEVICES to emulate more.");
}

c10::DeviceIndex currentDevice() { return tls_device; }

void setDevice(c10::DeviceIndex index) {
  checkDevice(index);
  tls_device = index;
}

// A device given without an index means the current one.
c10::Device resolve(c10::Device d) {
  return d.has_index() ? d : c10::Device(kNeuron, tls_device);
}

c10::Stream currentStream(c10::DeviceIndex index) {
  if (index < 0) index = tls_device;
  useDevice(index);  // every launch asks for its stream: the first is the device's first use
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNeuron, index), tls_streams[index]);
}

namespace {

struct NeuronGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType static_type = kNeuron;

  c10::DeviceType type() const override { return kNeuron; }

  c10::Device exchangeDevice(c10::Device d) const override {
    const auto old = getDevice();
    if (d.index() != old.index()) torchneuron::setDevice(d.index());
    return old;
  }

  c10::Device getDevice() const override { return c10::Device(kNeuron, tls_device); }

  void setDevice(c10::Device d) const override {
    TORCH_INTERNAL_ASSERT(d.type() == kNeuron);
    torchneuron::setDevice(d.index());
  }

  void uncheckedSetDevice(c10::Device d) const noexcept override { tls_device = d.index(); }

  c10::Stream getStream(c10::Device d) const override { return currentStream(d.index()); }

  c10::Stream getDefaultStream(c10::Device d) const override {
    d = resolve(d);
    useDevice(d.index());
    return c10::Stream(c10::Stream::UNSAFE, d, 0);
  }

  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*isHighPriority*/) const override {
    d = resolve(d);
    useDevice(d.index());
    const auto id = 1 + pool_counters[d.index()]++ % kStreamsPerPool;
    return c10::Stream(c10::Stream::UNSAFE, d, static_cast<c10::StreamId>(id));
  }

  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    d = resolve(d);
    useDevice(d.index());
    return c10::Stream(c10::Stream::UNSAFE, d, next_stream_id++);
  }

  c10::Stream exchangeStream(c10::Stream s) const override {
    const auto index = s.device_index();
    if (index < 0 || index >= kMaxDevices) checkDevice(index);  // raises; currentStream checks the rest
    const auto old = currentStream(index);
    tls_streams[index] = s.id();
    return old;
  }

  c10::DeviceIndex deviceCount() const noexcept override { return torchneuron::deviceCount(); }

  // torch.accelerator.get_device_capability: the dtypes whose tensors can be allocated on a device
  // and converted into each other. The device's kernels are the CPU's, so it is the CPU's set: every
  // dtype with a copy kernel. Not the quantized ones (no .to()), nor the sub-byte (Int1-7, UInt1-7),
  // bit (Bits*) and packed Float4 ones, which PyTorch only allocates (tests/test_accelerator.py
  // probes each dtype and checks that this is exactly the set that works).
  c10::DeviceCapability getDeviceCapability(c10::Device d) const override {
    checkDevice(resolve(d).index());
    c10::DeviceCapability capability;
    auto& has = capability.capability_data.supported_scalar_types;
    has.has_QInt8 = has.has_QUInt8 = has.has_QInt32 = has.has_QUInt4x2 = has.has_QUInt2x4 = 0;
    has.has_Bits1x8 = has.has_Bits2x4 = has.has_Bits4x2 = has.has_Bits8 = has.has_Bits16 = 0;
    has.has_UInt1 = has.has_UInt2 = has.has_UInt3 = has.has_UInt4 = has.has_UInt5 = has.has_UInt6 = 0;
    has.has_UInt7 = has.has_Int1 = has.has_Int2 = has.has_Int3 = has.has_Int4 = has.has_Int5 = 0;
    has.has_Int6 = has.has_Int7 = 0;
    has.has_Float4_e2m1fn_x2 = 0;
    return capability;
  }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(),
        "Event device index ", int(device_index), " does not match recording stream's device index ",
        int(stream.device_index()), ".");
    useDevice(stream.device_index());
    auto*& ev = *reinterpret_cast<rt::Event*>(event);
    if (ev == nullptr) rt::eventCreate(&ev, flag == c10::EventFlag::BACKEND_DEFAULT);
    checkRuntime(runtime::recordEvent(ev, stream.device_index(), stream.id()), stream.device_index(), "event record");
  }

  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) return;
    useDevice(stream.device_index());
    checkRuntime(runtime::streamWaitEvent(stream.device_index(), stream.id(), static_cast<rt::Event>(event)),
                 stream.device_index(), "wait_event");
  }

  bool queryEvent(void* event) const override {
    if (event != nullptr) initDevices();
    return event == nullptr || rt::eventQuery(static_cast<rt::Event>(event)) == rt::Status::Success;
  }

  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    rt::eventDestroy(static_cast<rt::Event>(event));
  }

  bool queryStream(const c10::Stream& stream) const override {
    useDevice(stream.device_index());
    return runtime::queryStream(stream.device_index(), stream.id()) == rt::Status::Success;
  }

  void synchronizeStream(const c10::Stream& stream) const override {
    useDevice(stream.device_index());
    checkRuntime(runtime::synchronizeStream(stream.device_index(), stream.id()), stream.device_index(),
                 "stream synchronize");
  }

  void synchronizeEvent(void* event) const override {
    if (event == nullptr) return;
    initDevices();
    auto* ev = static_cast<rt::Event>(event);
    checkRuntime(rt::eventSynchronize(ev), rt::eventDevice(ev), "event synchronize");
  }

  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    useDevice(device_index);
    checkRuntime(runtime::synchronizeDevice(device_index), device_index, "device synchronize");
  }

  void recordDataPtrOnStream(const c10::DataPtr& ptr, const c10::Stream& stream) const override {
    deviceAllocator()->recordStream(ptr, stream);
  }

  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*device_index*/) const override {
    TORCH_CHECK(start != nullptr && end != nullptr,
        "Both events must be recorded before calculating elapsed time.");
    initDevices();
    auto* s = static_cast<rt::Event>(start);
    auto* e = static_cast<rt::Event>(end);
    float ms = 0;
    const auto status = rt::eventElapsedTime(&ms, s, e);
    TORCH_CHECK(status != rt::Status::NotReady,
        "Both events must have completed before calculating elapsed time (synchronize the later one first).");
    TORCH_CHECK(status == rt::Status::Success,
        "Both events must be created with argument 'enable_timing=True' and recorded "
        "before calculating elapsed time.");
    return ms;
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, NeuronGuardImpl);

}  // namespace
}  // namespace torchneuron
