// Per-device random number generators: counter-based, like CUDA's.
//
// A neuron generator is a seed and an offset into a Philox 4x32-10 stream
// (at::philox_engine): its state is CUDA's 16 bytes (seed: uint64, then
// offset: uint64), so PyTorch code that reads or moves a device generator's
// offset (DTensor's random-op tracker, checkpointing, fork_rng) works as on
// CUDA. A random op reserves as many offset units as it draws elements
// (rounded up to 4) and draws element i from offset + i (random_ops.cpp).
#include "device.h"
#include "generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/DistributionsHelper.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/PhiloxRNGEngine.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <mutex>
#include <vector>

namespace torchneuron {
namespace {

constexpr size_t kStateBytes = 2 * sizeof(uint64_t);
// The size of a CPU generator's state (its Mersenne Twister and cached normal samples).
constexpr int64_t kCpuStateBytes = 5056;

struct NeuronGeneratorImpl final : public c10::GeneratorImpl {
  explicit NeuronGeneratorImpl(c10::DeviceIndex index, uint64_t seed = c10::default_rng_seed_val)
      : c10::GeneratorImpl(c10::Device(kNeuron, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        seed_(seed) {}

  // As on CUDA, seeding starts the stream over.
  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    set_current_seed(c10::detail::getNonDeterministicRandom(/*is_cuda=*/true));
    return seed_;
  }
  void set_offset(uint64_t offset) override {
    TORCH_CHECK(offset % 4 == 0, "offset must be a multiple of 4, got ", offset);
    offset_ = offset;
  }
  uint64_t get_offset() const override { return offset_; }

  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto state = at::detail::empty_cpu({static_cast<int64_t>(kStateBytes)}, at::kByte, std::nullopt,
                                       std::nullopt, std::nullopt, std::nullopt);
    auto* bytes = state.data_ptr<uint8_t>();
    std::memcpy(bytes, &seed_, sizeof(uint64_t));
    std::memcpy(bytes + sizeof(uint64_t), &offset_, sizeof(uint64_t));
    return state.getIntrusivePtr();
  }

  void set_state(const c10::TensorImpl& new_state) override {
    at::detail::check_rng_state(new_state);
    const auto size = new_state.numel();
    TORCH_CHECK(size == static_cast<int64_t>(kStateBytes) || size == sizeof(uint64_t),
                "RNG state is wrong size: a neuron generator's state is ", kStateBytes,
                " bytes (seed: uint64, offset: uint64), like CUDA's; got ", size, " bytes",
                size == kCpuStateBytes
                    ? " (a CPU generator's Mersenne Twister state, which a neuron generator cannot take)"
                    : "");
    const auto* bytes = new_state.data_dtype_initialized<uint8_t>();
    uint64_t seed = 0, offset = 0;
    std::memcpy(&seed, bytes, sizeof(uint64_t));
    if (size == static_cast<int64_t>(kStateBytes)) std::memcpy(&offset, bytes + sizeof(uint64_t), sizeof(uint64_t));
    TORCH_CHECK(offset % 4 == 0, "RNG state's offset must be a multiple of 4, got ", offset);
    seed_ = seed;
    offset_ = offset;
  }

  // CUDA graphs capture a generator's state by reference; with no graphs to capture, the
  // graph-safe forms are the plain ones.
  void graphsafe_set_state(const c10::intrusive_ptr<c10::GeneratorImpl>& state) override {
    auto* other = dynamic_cast<NeuronGeneratorImpl*>(state.get());
    TORCH_CHECK(other != nullptr, "graphsafe_set_state expects a neuron generator's state, got one for ",
                state->device());
    std::lock_guard<std::mutex> lock(other->mutex_);
    seed_ = other->seed_;
    offset_ = other->offset_;
  }
  c10::intrusive_ptr<c10::GeneratorImpl> graphsafe_get_state() const override {
    return c10::intrusive_ptr<c10::GeneratorImpl>::reclaim(clone_impl());
  }

  static c10::DeviceType device_type() { return kNeuron; }

  PhiloxDraw reserve(uint64_t count) {
    const PhiloxDraw draw{seed_, offset_};
    offset_ += (count + 3) / 4 * 4;
    return draw;
  }

 private:
  NeuronGeneratorImpl* clone_impl() const override {
    auto* copy = new NeuronGeneratorImpl(device().index(), seed_);
    copy->offset_ = offset_;
    return copy;
  }

  uint64_t seed_;
  uint64_t offset_ = 0;
};

NeuronGeneratorImpl* neuronImpl(const std::optional<at::Generator>& gen, c10::DeviceIndex device) {
  if (!gen.has_value() || !gen->defined())
    return static_cast<NeuronGeneratorImpl*>(defaultGenerator(device).unsafeGetGeneratorImpl());
  TORCH_CHECK(gen->device().type() == kNeuron, "Expected a 'neuron' device type for generator but found '",
              gen->device().type(), "'");
  auto* impl = dynamic_cast<NeuronGeneratorImpl*>(gen->unsafeGetGeneratorImpl());
  TORCH_CHECK(impl != nullptr, "Expected a neuron generator, got one for ", gen->device());
  return impl;
}

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

PhiloxDraw reservePhilox(const std::optional<at::Generator>& gen, c10::DeviceIndex device, uint64_t count) {
  auto* impl = neuronImpl(gen, device);
  std::lock_guard<std::mutex> lock(impl->mutex_);
  return impl->reserve(count);
}

at::Generator cpuGeneratorFor(const std::optional<at::Generator>& gen, c10::DeviceIndex device) {
  const PhiloxDraw draw = reservePhilox(gen, device, 4);
  // Subsequences 0 to 3 hold the element streams (random_ops.cpp); each draw of a CPU kernel
  // takes the subsequence named by its offset, above those, so no two share a word.
  at::philox_engine words(draw.seed, /*subsequence=*/draw.offset / 4 + 4);
  at::mt19937 engine(draw.seed);
  auto data = engine.data();
  for (auto& w : data.state_) w = words();
  data.left_ = 1;
  data.next_ = 0;
  engine.set_data(data);
  auto cpu = at::detail::createCPUGenerator();
  cpu.get<at::CPUGeneratorImpl>()->set_engine(engine);
  return cpu;
}

}  // namespace torchneuron
