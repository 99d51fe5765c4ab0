// Per-device random number generators.
//
// A neuron generator owns a Philox/MT state of its own (a CPU generator that
// nothing else touches): neuron random ops draw from it, so seeding a device
// makes its programs reproducible without consuming the CPU stream, and a
// device seeded like the CPU yields the very numbers the CPU would.
#include "neuron.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/util/Exception.h>

#include <memory>
#include <mutex>
#include <vector>

namespace torchneuron {
namespace {

struct NeuronGeneratorImpl final : public c10::GeneratorImpl {
  explicit NeuronGeneratorImpl(c10::DeviceIndex index, at::Generator cpu)
      : c10::GeneratorImpl(c10::Device(kNeuron, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        cpu_(std::move(cpu)) {}

  explicit NeuronGeneratorImpl(c10::DeviceIndex index)
      : NeuronGeneratorImpl(index, at::detail::createCPUGenerator(c10::default_rng_seed_val)) {}

  void set_current_seed(uint64_t seed) override { cpu_.set_current_seed(seed); }
  uint64_t current_seed() const override { return cpu_.current_seed(); }
  uint64_t seed() override { return cpu_.seed(); }
  void set_offset(uint64_t offset) override { cpu_.set_offset(offset); }
  uint64_t get_offset() const override { return cpu_.get_offset(); }

  void set_state(const c10::TensorImpl& new_state) override {
    cpu_.unsafeGetGeneratorImpl()->set_state(new_state);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    return cpu_.unsafeGetGeneratorImpl()->get_state();
  }

  static c10::DeviceType device_type() { return kNeuron; }

  const at::Generator& cpu() const { return cpu_; }

 private:
  NeuronGeneratorImpl* clone_impl() const override {
    return new NeuronGeneratorImpl(device().index(), cpu_.clone());
  }

  at::Generator cpu_;
};

}  // namespace

const at::Generator& defaultGenerator(c10::DeviceIndex index) {
  static std::vector<at::Generator> generators = [] {
    std::vector<at::Generator> g;
    for (c10::DeviceIndex i = 0; i < deviceCount(); ++i)
      g.push_back(at::make_generator<NeuronGeneratorImpl>(i));
    return g;
  }();
  if (index < 0) index = currentDevice();
  checkDevice(index);
  return generators[index];
}

at::Generator newGenerator(c10::DeviceIndex index) {
  if (index < 0) index = currentDevice();
  checkDevice(index);
  return at::make_generator<NeuronGeneratorImpl>(index);
}

at::Generator cpuGeneratorOf(const at::Generator& neuron_generator) {
  auto* impl = dynamic_cast<NeuronGeneratorImpl*>(neuron_generator.unsafeGetGeneratorImpl());
  TORCH_CHECK(impl != nullptr, "Expected a neuron generator, got one for ",
              neuron_generator.device());
  return impl->cpu();
}

}  // namespace torchneuron
