// Launching work on a device: what a refused launch raises, the memory a kernel's arguments reach,
// the host storages queued work kept.
#include "launch.h"

#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdint>

#include <atomic>
#include <mutex>
#include <utility>
#include <vector>

namespace torchneuron {

void failLaunch(rt::Status status, c10::DeviceIndex device, const char* name) {
  if (status == rt::Status::InvalidDevice) checkDevice(device);  // PyTorch's message for a bad index
  if (status == rt::Status::KernelFailed) checkRuntime(status, device, name);
  TORCH_CHECK(false, "neuron:", int(device), ": the runtime refused to launch ", name != nullptr ? name : "a kernel",
              ": ", rt::statusString(status));
}

namespace {
thread_local KernelArguments* t_arguments = nullptr;
thread_local const char* t_kernel_name = nullptr;
}  // namespace

KernelNameScope::KernelNameScope(const char* name) : previous_(t_kernel_name) { t_kernel_name = name; }
KernelNameScope::~KernelNameScope() { t_kernel_name = previous_; }
const char* KernelNameScope::current() { return t_kernel_name; }

KernelArguments::KernelArguments() : previous_(t_arguments) { t_arguments = this; }
KernelArguments::~KernelArguments() { t_arguments = previous_; }
KernelArguments* KernelArguments::current() { return t_arguments; }
void KernelArguments::add(const c10::Storage& neuron) {
  if (rt::strictMode() && neuron.nbytes() > 0) ranges_.push_back({neuron.data(), neuron.nbytes()});
}

namespace {
std::mutex released_mutex;
std::vector<c10::Storage> released;  // guarded by released_mutex
std::atomic<bool> any_released{false};
}  // namespace

HostReleased::~HostReleased() {
  if (!storage) return;
  std::lock_guard<std::mutex> lock(released_mutex);
  released.push_back(std::move(storage));
  any_released.store(true, std::memory_order_release);
}

void releaseHostStorages() {
  if (!any_released.load(std::memory_order_acquire)) return;
  std::vector<c10::Storage> done;
  {
    std::lock_guard<std::mutex> lock(released_mutex);
    done.swap(released);
    any_released.store(false, std::memory_order_relaxed);
  }
}  // the storages go here, on the host

void checkRuntime(rt::Status status, c10::DeviceIndex device, const char* what) {
  if (status == rt::Status::Success || status == rt::Status::NotReady) return;
  if (status == rt::Status::InvalidDevice) checkDevice(device);
  if (status == rt::Status::KernelFailed) {
    const std::string error = rt::asyncError(device);
    TORCH_CHECK(false, "neuron:", int(device), ": work queued earlier failed asynchronously (found by ",
                what != nullptr ? what : "a synchronization", "): ",
                error.empty() ? std::string("the error was already reported") : error,
                ". Kernels run after the host moves on, so the op above is not the one that failed; "
                "run with TORCHNEURON_ASYNC=0 to raise errors at the op that caused them.");
  }
  TORCH_CHECK(false, "neuron:", int(device), ": ", what != nullptr ? what : "the runtime", " failed: ",
              rt::statusString(status));
}

}  // namespace torchneuron

// torchneuron::_launch_host_code(device, body, context): runs body(context), a C function of generated
// host code that addresses device memory directly (a C++ kernel of an AOTInductor model or a
// cpp_wrapper graph),
// as one kernel of the device's current stream. Such code reaches this op through PyTorch's C shim
// (aoti_torch_call_dispatcher), the only entry into this library it can count on, so the two
// pointers travel as integers.
namespace {
constexpr char kHostCodeName[] = "inductor_host_code";

void launchHostCode(int64_t device, int64_t body, int64_t context) {
  TORCH_CHECK_VALUE(body != 0, "_launch_host_code: the body is a null function pointer");
  const auto index = static_cast<c10::DeviceIndex>(device);
  torchneuron::checkDevice(index);
  auto* fn = reinterpret_cast<void (*)(void*)>(static_cast<uintptr_t>(body));
  auto* arg = reinterpret_cast<void*>(static_cast<uintptr_t>(context));
  torchneuron::launch(index, {torchneuron::rt::ActivityKind::Kernel, kHostCodeName}, [&] {
    // Strict mode: such code addresses any of the device's memory, through pointers the runtime is
    // not told of, so all of it is open while it runs.
    torchneuron::rt::deviceAccessAddDevice(index);
    fn(arg);
  });
}
}  // namespace

TORCH_LIBRARY_FRAGMENT(torchneuron, m) {
  m.def("_launch_host_code(int device, int body, int context) -> ()", &launchHostCode);
}
