// Lazy initialisation of the neuron devices, and fork poisoning, as CUDA has them.
//
// Loading torchneuron creates no device state. The devices are initialised at their first real use:
// the first allocation, stream, kernel launch, event or generator on a device (initDevice(), called
// by the allocator, the guard's stream and event calls, and the hooks), or torch.neuron._lazy_init()
// (PyTorch's Python bindings call it through torch::utils::device_lazy_init before they make a
// tensor on the device). A process forked after that cannot use the devices: the runtime's
// streams and the memory it manages belong to the parent, as a CUDA context does, so every such
// use in the child raises the error CUDA's runtime gives there, whether it comes from Python or
// from C++. A process forked before the first use initialises the devices itself, and a child
// that never uses them (a DataLoader worker) is unaffected.
#include "device_init.h"

#include <c10/util/Exception.h>
#include <torch/csrc/utils/device_lazy_init.h>

#include <pthread.h>

#include <array>
#include <atomic>
#include <mutex>

namespace torchneuron {
namespace detail {

std::atomic<int> device_state{kDevicesNotInitialized};
std::array<std::atomic<bool>, kMaxDevices> device_used{};

}  // namespace detail

namespace {

std::mutex init_mutex;
std::once_flag fork_handler_once;

// In the child of a fork: the parent's initialised devices are not this process's.
void afterForkInChild() {
  if (detail::device_state.load(std::memory_order_relaxed) != kDevicesNotInitialized)
    detail::device_state.store(kDevicesInBadFork, std::memory_order_relaxed);
  for (auto& used : detail::device_used) used.store(false, std::memory_order_relaxed);
}

[[noreturn]] void failBadFork() {
  TORCH_CHECK(false,
      "Cannot re-initialize neuron in forked subprocess. To use neuron with multiprocessing, you must use "
      "the 'spawn' start method");
}

}  // namespace

void initDevices() {
  const int state = detail::device_state.load(std::memory_order_acquire);
  if (state == kDevicesInitialized) return;
  if (state == kDevicesInBadFork) failBadFork();
  std::lock_guard<std::mutex> lock(init_mutex);
  if (detail::device_state.load(std::memory_order_relaxed) == kDevicesInitialized) return;
  // Before the state changes: a fork from now on makes a child that cannot use the devices.
  std::call_once(fork_handler_once, [] { pthread_atfork(nullptr, nullptr, &afterForkInChild); });
  // PyTorch's own record of it, for torch::utils::is_device_in_bad_fork and for its Python bindings,
  // which then call torch.neuron._lazy_init() again in the child (where it raises).
  torch::utils::register_fork_handler_for_device_init(kNeuron);
  detail::device_state.store(kDevicesInitialized, std::memory_order_release);
}

namespace detail {

void initDeviceSlow(c10::DeviceIndex index) {
  initDevices();
  // Only a device that exists is marked used: useDevice() then skips the check for it.
  if (index >= 0 && index < kMaxDevices && index < deviceCount())
    device_used[index].store(true, std::memory_order_release);
}

}  // namespace detail

bool devicesInitialized() {
  return detail::device_state.load(std::memory_order_acquire) == kDevicesInitialized;
}

bool devicesInBadFork() { return detail::device_state.load(std::memory_order_acquire) == kDevicesInBadFork; }

bool deviceUsed(c10::DeviceIndex index) {
  return devicesInitialized() && index >= 0 && index < kMaxDevices &&
         detail::device_used[index].load(std::memory_order_acquire);
}

}  // namespace torchneuron
