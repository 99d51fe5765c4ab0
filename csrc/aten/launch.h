// Launching work on a device (launch.cpp): launch() runs a kernel's host code as work of the current
// stream and waits for it, enqueue() queues it; both hand fused eager's held work over first and give
// strict mode the kernel's own memory (KernelArguments; launchWith() gathers it from the kernel's tensors).
// `Launched` registers a kernel in one line.
#pragma once

#include "device.h"
#include "held_work.h"

#include <ATen/core/IListRef.h>
#include <ATen/core/Tensor.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/Storage.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace torchneuron {

// Raises the error for a launch the runtime refused.
[[noreturn]] void failLaunch(rt::Status status, c10::DeviceIndex device, const char* name);
// The name of an op's kernel: the op's name without its namespace ("addmm" for aten::addmm).
constexpr const char* kernelName(const char* op_name) {
  for (const char* c = op_name; *c != '\0'; ++c)
    if (c[0] == ':' && c[1] == ':') return c + 2;
  return op_name;
}
// The same for an op of ATen's generated at::_ops, found when compiling.
template <class Op>
inline constexpr const char* kKernelName = kernelName(Op::name);
inline const char* kernelName(const std::string& op_name) { return kernelName(op_name.c_str()); }
// The device memory of a kernel's arguments, which strict mode opens for its launch alone
// (rt::LaunchInfo::ranges). While a KernelArguments lives on a thread, each host view made there
// (hostView, hostViewSharing, hostStorageOf: host_addressable.cpp) adds its device storage to it, and launch()
// and enqueue() there launch with it, unless given ranges of their own. Inside a running launch,
// a host view (and a block the allocator hands out) joins that launch's window at once. Scopes nest;
// outside strict mode they cost a thread-local pointer and gather nothing.
class KernelArguments {
 public:
  KernelArguments();
  ~KernelArguments();
  KernelArguments(const KernelArguments&) = delete;
  KernelArguments& operator=(const KernelArguments&) = delete;
  static KernelArguments* current();  // this thread's innermost, or none
  void add(const c10::Storage& neuron);
  const std::vector<rt::MemoryRange>& ranges() const { return ranges_; }
  // What was gathered, for work launched later than the scope lives (a deferred op's kernel).
  std::vector<rt::MemoryRange> take() { return std::move(ranges_); }

 private:
  std::vector<rt::MemoryRange> ranges_;
  KernelArguments* previous_;
};
// The name of the op being run, for the kernels it launches from code that does not know it (a
// DispatchStub's device kernel, fast_ops.cpp): set for this thread while alive. Scopes nest.
class KernelNameScope {
 public:
  explicit KernelNameScope(const char* name);
  ~KernelNameScope();
  KernelNameScope(const KernelNameScope&) = delete;
  KernelNameScope& operator=(const KernelNameScope&) = delete;
  static const char* current();  // this thread's innermost, or nullptr

 private:
  const char* previous_;
};
// `info` launched with `ranges` (which must outlive the launch call).
inline rt::LaunchInfo withRanges(rt::LaunchInfo info, const std::vector<rt::MemoryRange>& ranges) {
  info.ranges = ranges.data();
  info.range_count = ranges.size();
  return info;
}
// `info` with the memory of this thread's innermost KernelArguments when it names none itself.
inline rt::LaunchInfo withArguments(const rt::LaunchInfo& info) {
  if (info.range_count != 0 || !rt::strictMode()) return info;
  const KernelArguments* arguments = KernelArguments::current();
  return arguments != nullptr ? withRanges(info, arguments->ranges()) : info;
}

// Runs `body` (a kernel's host code: a CPU kernel over device memory, a copy, a
// collective) as work of `device`'s current stream through the runtime
// (rt::launchKernel), and returns what `body` returns. Exceptions pass through.
template <class F>
decltype(auto) launch(c10::DeviceIndex device, const rt::LaunchInfo& info, F&& body) {
  using R = decltype(body());
  if constexpr (std::is_void_v<R>) {
    // A blocking launch waits for the stream's earlier work first: with asynchronous streams, a
    // synchronization of the host's.
    handOverHeldWork(rt::asyncMode() ? HostNeed::Synchronization : HostNeed::Launch, info.name);
    auto trampoline = [](void* p) { (*static_cast<std::remove_reference_t<F>*>(p))(); };
    const auto status = rt::launchKernel(device, currentStream(device).id(), trampoline, &body, withArguments(info));
    if (status != rt::Status::Success) failLaunch(status, device, info.name);
  } else if constexpr (std::is_reference_v<R>) {
    std::remove_reference_t<R>* result = nullptr;
    launch(device, info, [&] { result = &body(); });
    return static_cast<R>(*result);
  } else {
    std::optional<R> result;
    launch(device, info, [&] { result.emplace(body()); });
    return R(std::move(*result));
  }
}

// Strict mode: the memory of a kernel's neuron tensors (a tensor, an optional one, a list of them;
// any other argument adds nothing).
inline void addMemory(KernelArguments& arguments, const at::Tensor& t) {
  if (t.defined() && t.device().type() == kNeuron) arguments.add(t.storage());
}
inline void addMemory(KernelArguments& arguments, const std::optional<at::Tensor>& t) {
  if (t.has_value()) addMemory(arguments, *t);
}
inline void addMemory(KernelArguments& arguments, const at::ITensorListRef& list) {
  for (const at::Tensor& t : list) addMemory(arguments, t);
}
template <class T>
void addMemory(KernelArguments&, const T&) {}

// launch() of `body` as the kernel `name`; strict mode opens the memory of `tensors` for it (the
// kernel's arguments and results: what it allocates inside joins the launch by itself). Outside
// strict mode no KernelArguments is made.
template <class F, class... T>
decltype(auto) launchWith(c10::DeviceIndex device, const char* name, F&& body, const T&... tensors) {
  std::optional<KernelArguments> arguments;
  if (rt::strictMode()) {
    arguments.emplace();
    (addMemory(*arguments, tensors), ...);
  }
  return launch(device, {rt::ActivityKind::Kernel, name}, std::forward<F>(body));
}

// Checks a status of the runtime's waiting calls (synchronize, an event's synchronize): raises for
// a bad device, and for work run asynchronously that failed, with what failed.
void checkRuntime(rt::Status status, c10::DeviceIndex device, const char* what);
// A host storage that queued work keeps alive (a pinned buffer a copy reads or writes). The work
// may end on a stream's worker; the storage is then let go of by the host, at its next enqueue:
// Python may know the storage, and its release would need the interpreter's lock, which the host
// may hold while it waits for that worker.
struct HostReleased {
  c10::Storage storage;
  HostReleased(c10::Storage s) : storage(std::move(s)) {}
  HostReleased(HostReleased&&) = default;
  HostReleased(const HostReleased&) = delete;
  ~HostReleased();
};
void releaseHostStorages();  // on the host: lets go of the storages work has finished with

// Queues `work` (a callable that owns what it needs: host views over device memory, CPU tensors it
// reads) as work of `device`'s current stream, in the inference mode of this call (its host views are
// inference tensors or not). Synchronous mode: it runs before this returns and its exceptions reach
// the caller. Asynchronous mode: it runs on the stream's worker later; an exception becomes the
// device's asynchronous error (PyTorch's message, without the C++ frames), raised by the next
// synchronization.
template <class F>
void enqueue(c10::DeviceIndex device, const rt::LaunchInfo& info, F work) {
  releaseHostStorages();
  handOverHeldWork(HostNeed::Launch, info.name);
  auto body = [inference = c10::InferenceMode::is_enabled(), work = std::move(work)]() mutable {
    c10::InferenceMode mode(inference);
    if (!rt::asyncMode()) return work();
    try {
      work();
    } catch (const c10::Error& e) {
      throw std::runtime_error(e.what_without_backtrace());
    }
  };
  using Body = decltype(body);
  auto* arg = new Body(std::move(body));
  const auto status = rt::enqueueKernel(
      device, currentStream(device).id(), [](void* p) { (*static_cast<Body*>(p))(); }, arg,
      [](void* p) { delete static_cast<Body*>(p); }, withArguments(info));
  if (status != rt::Status::Success) failLaunch(status, device, info.name);
}

// The device a kernel's argument puts it on: a neuron tensor's, else none (-1).
inline c10::DeviceIndex neuronDeviceOf(const at::Tensor& t) {
  return t.defined() && t.device().type() == kNeuron ? t.device().index() : c10::DeviceIndex(-1);
}
inline c10::DeviceIndex neuronDeviceOf(const std::optional<at::Tensor>& t) {
  return t.has_value() ? neuronDeviceOf(*t) : c10::DeviceIndex(-1);
}
template <class T>
c10::DeviceIndex neuronDeviceOf(const T&) { return -1; }

// A kernel function `Fn` registered to run through launch(), named `Name`, on the device of its
// first neuron tensor argument (the current device when it has none):
// m.impl("uniform_", TORCH_FN((Launched<kUniformName, &uniform>::call))).
template <const char* Name, auto Fn>
struct Launched;
template <const char* Name, class R, class... Args, R (*Fn)(Args...)>
struct Launched<Name, Fn> {
  static R call(Args... args) {
    c10::DeviceIndex device = -1;
    ((device = device >= 0 ? device : neuronDeviceOf(args)), ...);
    if (device < 0) device = currentDevice();
    return launch(device, {rt::ActivityKind::Kernel, Name}, [&]() -> R { return Fn(args...); });
  }
};

}  // namespace torchneuron
