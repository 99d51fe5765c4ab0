// Lazy initialisation and fork poisoning of the neuron devices (device_init.cpp), as CUDA's. The
// devices are initialised at their first use; a process forked after that cannot use them:
// initDevices() and initDevice() raise "Cannot re-initialize neuron in forked subprocess..." there.
#pragma once

#include "device.h"

#include <c10/macros/Macros.h>

#include <array>
#include <atomic>

namespace torchneuron {

constexpr int kMaxDevices = 64;  // TORCHNEURON_NUM_DEVICES is at most this

enum DevicesState : int { kDevicesNotInitialized = 0, kDevicesInitialized = 1, kDevicesInBadFork = 2 };
namespace detail {
extern std::atomic<int> device_state;
extern std::array<std::atomic<bool>, kMaxDevices> device_used;
void initDeviceSlow(c10::DeviceIndex index);
}  // namespace detail

void initDevices();                       // torch.neuron._lazy_init and the hooks' init()
bool devicesInitialized();                // by this process (not inherited across a fork)
bool devicesInBadFork();                  // forked after the parent initialised them
bool deviceUsed(c10::DeviceIndex index);  // initialised and used here (the hooks' hasPrimaryContext)

// The first use of device `index` (a valid index) initialises the devices; raises in a bad fork.
inline void initDevice(c10::DeviceIndex index) {
  if (C10_LIKELY(detail::device_state.load(std::memory_order_relaxed) == kDevicesInitialized &&
                 detail::device_used[index].load(std::memory_order_relaxed)))
    return;
  detail::initDeviceSlow(index);
}

// A use of device `index`: checks that it exists, then initialises the devices at their first use.
// A device used before exists (initDeviceSlow marks only valid indices), so that is all it checks.
inline void useDevice(c10::DeviceIndex index) {
  if (C10_LIKELY(index >= 0 && index < kMaxDevices &&
                 detail::device_state.load(std::memory_order_relaxed) == kDevicesInitialized &&
                 detail::device_used[index].load(std::memory_order_relaxed)))
    return;
  checkDevice(index);
  initDevice(index);
}

}  // namespace torchneuron
