// Random numbers (generator.cpp; the kernels in random_ops.cpp): each device's Philox generator.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>

namespace torchneuron {

const at::Generator& defaultGenerator(c10::DeviceIndex index);
at::Generator newGenerator(c10::DeviceIndex index);
// Where a random op's draws start in a neuron generator's Philox stream.
struct PhiloxDraw {
  uint64_t seed;
  uint64_t offset;
};
// Reserves `count` offset units (one per element drawn) of a neuron generator (`device`'s default
// one when `gen` is none or undefined) and returns where they start; raises for a generator of
// another device type.
PhiloxDraw reservePhilox(const std::optional<at::Generator>& gen, c10::DeviceIndex device, uint64_t count);
// A CPU generator for a PyTorch CPU kernel that draws its own random numbers (the random ops
// without a kernel in random_ops.cpp): its Mersenne Twister state is Philox words of a subsequence
// of its own, named by the neuron generator's offset, which advances by 4.
at::Generator cpuGeneratorFor(const std::optional<at::Generator>& gen, c10::DeviceIndex device);

}  // namespace torchneuron
