// Shared declarations of the PyTorch integration of the NeuronCore runtime.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Device.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/Stream.h>

#include "../runtime/neuron_runtime.h"

namespace c10 {
struct OperatorName;
class OperatorHandle;
struct IValue;
}  // namespace c10
namespace torch::jit {
using Stack = std::vector<c10::IValue>;
}  // namespace torch::jit

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace torchneuron {

constexpr c10::DeviceType kNeuron = c10::DeviceType::PrivateUse1;

// ---- devices (guard.cpp; failDeviceMismatch in fallback.cpp) ----------------
c10::DeviceIndex deviceCount();
c10::DeviceIndex currentDevice();
void setDevice(c10::DeviceIndex index);      // raises on a bad index
// Raises a RuntimeError naming the device when index is out of range.
void checkDevice(c10::DeviceIndex index);
// Raises PyTorch's usual error for an op given tensors on two devices: neuron:`device` and
// `other` ("neuron:1", "cpu"), found at argument `arg` of `op`.
[[noreturn]] void failDeviceMismatch(c10::DeviceIndex device, const std::string& other, const std::string& arg,
                                     const c10::OperatorName& op);
c10::Stream currentStream(c10::DeviceIndex index);

// ---- work held back above the runtime (fused.cpp) ---------------------------
// Fused eager holds recorded ops back from the runtime. Before the host asks the runtime for
// anything that must come after them, aten hands them over, saying what the host needs: launch()
// and enqueue() do, and so do the wrappers below, aten's only way to the runtime's waiting and
// copying calls. (The runtime never calls up.)
enum class HostNeed {
  Launch,           // a kernel launched or queued
  HostCopy,         // a copy between host and device memory: a boundary of the host's
  DeviceCopy,       // a copy within device memory
  Synchronization,  // the host waits for, asks about or orders a stream's work: a boundary too
};
// Runs the group fused eager holds, if any; `what` names the need for its report.
void handOverHeldWork(HostNeed need, const char* what);
namespace runtime {  // the runtime's waiting and copying calls, after the held work
inline rt::Status synchronizeDevice(int device) {
  handOverHeldWork(HostNeed::Synchronization, "synchronize");
  return rt::deviceSynchronize(device);
}
inline rt::Status synchronizeStream(int device, rt::Stream stream) {
  handOverHeldWork(HostNeed::Synchronization, "stream synchronize");
  return rt::streamSynchronize(device, stream);
}
inline rt::Status queryStream(int device, rt::Stream stream) {
  handOverHeldWork(HostNeed::Synchronization, "stream query");
  return rt::streamQuery(device, stream);
}
inline rt::Status streamWaitEvent(int device, rt::Stream stream, rt::Event event) {
  handOverHeldWork(HostNeed::Synchronization, "wait_event");
  return rt::streamWaitEvent(device, stream, event);
}
inline rt::Status recordEvent(rt::Event event, int device, rt::Stream stream) {
  handOverHeldWork(HostNeed::Synchronization, "event record");  // after the ops recorded so far
  return rt::eventRecord(event, device, stream);
}
inline rt::Status copyMemory(void* dst, const void* src, size_t nbytes, rt::CopyKind kind) {
  if (kind != rt::CopyKind::HostToHost)
    handOverHeldWork(kind == rt::CopyKind::DeviceToDevice ? HostNeed::DeviceCopy : HostNeed::HostCopy, "copy");
  return rt::memcpy(dst, src, nbytes, kind);
}
}  // namespace runtime

// ---- launching work (launch.cpp) -------------------------------------------
// Raises the error for a launch the runtime refused.
[[noreturn]] void failLaunch(rt::Status status, c10::DeviceIndex device, const char* name);
// The name of an op's kernel: the op's name without its namespace ("addmm" for aten::addmm).
inline const char* kernelName(const char* op_name) {
  for (const char* c = op_name; *c != '\0'; ++c)
    if (c[0] == ':' && c[1] == ':') return c + 2;
  return op_name;
}
inline const char* kernelName(const std::string& op_name) { return kernelName(op_name.c_str()); }
// The device memory of a kernel's arguments, which strict mode opens for its launch alone
// (rt::LaunchInfo::ranges). While a KernelArguments lives on a thread, each host view made there
// (hostView, hostViewSharing, hostStorageOf: alias.cpp) adds its device storage to it, and launch()
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

// ---- asynchronous ops (deferred.cpp) ---------------------------------------
// Asynchronous mode: queues a boxed op on its device's current stream when its results' sizes can
// be known ahead (from its meta kernel). The results are allocated now and returned on the stack;
// the CPU kernel runs on the stream's worker. False (the stack untouched) when the op must run
// synchronously: results whose sizes depend on data, host values returned, random ops, sparse or
// nested tensors, an out= argument resized, anything the meta kernel refuses.
bool enqueueOp(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// ---- fused eager (fused.cpp; the graph compiler's side in fused.h) ----------
// TORCHNEURON_EAGER=fused, torch.neuron.set_eager_mode("fused"): ops on neuron tensors are recorded
// into a group instead of run; the group runs when the host needs the device (a cut: anything that
// reaches the runtime, see handOverHeldWork), as one compiled graph once seen often enough.
extern std::atomic<bool> fused_mode;
inline bool fusedMode() { return fused_mode.load(std::memory_order_relaxed); }
// Fused mode, not inside a running group (whose own ops run at once), and not in a stretch of ops
// the adaptive bypass runs unrecorded (which counts this op): the op is to be recorded.
bool fusedRecordsNext();
inline bool fusedRecording() { return fusedMode() && fusedRecordsNext(); }
void setFusedMode(bool on);  // turning it off runs the pending group first
// Records a boxed op (its results allocated now, as in enqueueOp). False when it must run now.
bool recordOp(const c10::OperatorHandle& op, torch::jit::Stack* stack);
// Runs the pending group, if any; `reason` is what needs it (for the report).
void flushFused(const char* reason);
bool fusedHolding();        // a recorded group is pending
bool fusedRecordingHere();  // this thread is recording an op (a group cannot run now)

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

// ---- memory (allocator.cpp) ----------------------------------------------
c10::DeviceAllocator* deviceAllocator();
// Hands a host buffer that a CPU kernel produced over to a device, without a
// copy: the bytes are charged to the device (raising OutOfMemoryError when it
// is full) and released when the returned DataPtr dies.
c10::DataPtr deviceBlockFromHostBuffer(c10::DataPtr host, size_t nbytes, c10::DeviceIndex device);
// Allocates device memory on a given device (not the current one).
c10::DataPtr allocateOn(c10::DeviceIndex device, size_t nbytes);
// An allocator that always allocates on `device`.
c10::Allocator* allocatorFor(c10::DeviceIndex device);
c10::Allocator* hostAllocator();
// While alive, buffers that CPU kernels on this thread allocate through the CPU allocator are
// blocks of `device`'s caching allocator (seen as host memory): the kernels' results need no
// adoption and no copy. Scopes nest; -1 turns the redirection off.
class DeviceOutputScope {
 public:
  explicit DeviceOutputScope(c10::DeviceIndex device);
  ~DeviceOutputScope();
  DeviceOutputScope(const DeviceOutputScope&) = delete;
  DeviceOutputScope& operator=(const DeviceOutputScope&) = delete;

 private:
  c10::DeviceIndex previous_;
};
// When a CPU storage holds a block of `device`'s caching allocator (allocated in a DeviceOutputScope),
// takes it out of the storage as the device memory it is; otherwise nothing.
std::optional<c10::DataPtr> takeDeviceBlock(c10::StorageImpl* storage, c10::DeviceIndex device);

// Memory history, in the structure of PyTorch's CUDA memory snapshots.
struct MemoryHistoryOptions {
  bool enabled = false;     // blocks keep where they were allocated
  bool trace = false;       // each device also keeps a ring of the allocator's actions
  int context = 0;          // tracebacks for: 0 nothing, 1 live blocks, 2 and allocations, 3 and frees
  bool cpp_frames = false;  // C++ frames besides Python's
  size_t max_entries = SIZE_MAX;
  bool clear_history = false;
};
void recordMemoryHistory(const MemoryHistoryOptions& options);
bool memoryHistoryEnabled();
struct SnapshotBlock {
  uint64_t address = 0;
  size_t size = 0;
  size_t requested_size = 0;
  bool allocated = false;
  std::shared_ptr<c10::GatheredContext> context;  // a torch::CapturedTraceback, or none
};
struct SnapshotSegment {
  c10::DeviceIndex device = 0;
  uint64_t address = 0;
  size_t total_size = 0;
  bool large = false;
  bool adopted = false;  // a host buffer a kernel made, charged to the device
  std::vector<SnapshotBlock> blocks;
};
struct SnapshotTrace {
  const char* action;  // alloc, free_requested, free_completed, segment_alloc, segment_free, oom
  uint64_t addr;
  size_t size;
  int64_t stream;
  int64_t time_us;
  size_t device_free;  // oom only
  std::shared_ptr<c10::GatheredContext> context;
};
struct MemorySnapshot {
  std::vector<SnapshotSegment> segments;         // every device's, by device then address
  std::vector<std::vector<SnapshotTrace>> traces;  // per device, oldest first
};
MemorySnapshot memorySnapshot();
// Called (with no allocator lock held) when an allocation fails while the history is on: writes a
// snapshot and returns its path, which the OutOfMemoryError then names.
using OomSnapshotHook = std::string (*)(c10::DeviceIndex device);
void setOomSnapshotHook(OomSnapshotHook hook);

// ---- random (generator.cpp; the kernels in random_ops.cpp) -----------------
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

// ---- the zero-copy path (alias.cpp) --------------------------------------
// Two ideas, one name each (docs/runtime.md, "The zero-copy path"):
//
// A host view is a CPU tensor over a neuron tensor's device memory (same sizes, strides, offset,
// dtype, conj/neg bits): what a CPU kernel runs on inside a launch.
//
// A device result is a neuron tensor made from what a CPU kernel returned: its buffer is taken
// over when it is device memory already or the kernel's alone to give, else copied.

// The host view of `neuron`, which must outlive it. Valid inside a launch (kernel, copy).
at::Tensor hostView(const at::Tensor& neuron);
// A host view over an existing host view's storage, for a second tensor on the same device
// storage: one op's arguments that share memory on the device share it on the CPU too, so
// PyTorch's overlap checks see it.
at::Tensor hostViewSharing(const at::Tensor& neuron, const c10::Storage& host_storage);
// A host view that holds the device memory alive and cannot be resized, for work that keeps it
// past the call that made it. `open`: in strict mode its memory stays reachable to every thread
// while the view lives (a collective in flight: gloo's threads reach it); else only inside the
// launches that reach it (a CPU autograd graph kept between its forward and backward launches).
at::Tensor hostViewHolding(const at::Tensor& neuron, bool open);
// A tensor of dispatch key `key` (CPU: a host view; PrivateUse1: a neuron tensor; Meta: a stand-in)
// over `storage`, with the sizes, strides, offset, dtype and conjugate and negative bits of `like`.
at::Tensor tensorOver(c10::Storage storage, c10::DispatchKey key, const at::Tensor& like);
// A CPU storage over a neuron tensor's device memory that does not own it, for host views that
// work queued on a stream keeps (hostViewSharing over it): the device memory is referred to by
// address, as a real kernel's arguments are.
c10::Storage hostStorageOf(const at::Tensor& neuron);
// An argument as a CPU kernel takes it: the host view of a neuron tensor, anything else as it is.
inline at::Tensor hostArgument(const at::Tensor& t) {
  return t.defined() && t.device().type() == kNeuron ? hostView(t) : t;
}
inline std::optional<at::Tensor> hostArgument(const std::optional<at::Tensor>& t) {
  return t.has_value() ? std::optional<at::Tensor>(hostArgument(*t)) : t;
}
template <class T>
const T& hostArgument(const T& value) { return value; }

// The device result of a dense CPU tensor on `device` (an undefined tensor stays undefined).
// When nothing else refers to `cpu`, its TensorImpl is reused.
at::Tensor deviceResult(at::Tensor cpu, c10::DeviceIndex device);
// The same, one step at a time: a device storage from a CPU storage's buffer (taken, or copied
// when it is not the kernel's to give), one holding a copy, and a neuron tensor over a device
// storage with the metadata of `like`.
c10::Storage deviceStorage(c10::StorageImpl* host_storage, c10::DeviceIndex device);
c10::Storage deviceStorageCopy(const c10::StorageImpl* host_storage, c10::DeviceIndex device);
at::Tensor deviceTensorOver(c10::Storage storage, const at::Tensor& like);
// Turns a CPU tensor that nothing else references into a neuron tensor over `storage` (same
// sizes, strides and offset), reusing its TensorImpl.
at::Tensor deviceTensorReusing(at::Tensor cpu, c10::Storage storage);
// Makes `neuron` reflect what a kernel did to its host view: new sizes, strides, offset, or a new
// buffer after a resize.
void updateFromHostView(const at::Tensor& neuron, const at::Tensor& view);

// ---- registration of the fallbacks (fallback.cpp, sparse.cpp) --------------
// Registers the fallback for ops that have a CPU kernel besides a generic
// one, so they run the CPU's kernel. Called once, after all registrations. (fallback.cpp)
void preferCpuKernels();
// Registers the unboxed kernels of the most frequent functional ops (fast_ops.cpp); called before
// preferCpuKernels. Nothing in asynchronous mode, where every op goes through the boxed fallback.
void registerFastOps();
// The boxed fallback itself (fallback.cpp).
void neuronFallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);
// The same for sparse tensors (sparse.cpp): ops with a CPU sparse kernel run it on the device's
// sparse tensors, also where PyTorch has a generic kernel that expects a dense tensor.
void preferSparseCpuKernels();

// ---- transfer accounting (kernels.cpp) -----------------------------------
struct TransferStats {
  std::atomic<int64_t> host_to_device_bytes{0};
  std::atomic<int64_t> device_to_host_bytes{0};
  std::atomic<int64_t> device_to_device_bytes{0};
  std::atomic<int64_t> host_to_device_copies{0};
  std::atomic<int64_t> device_to_host_copies{0};
  std::atomic<int64_t> scalar_reads{0};  // .item(), printing, data-dependent control flow
};
TransferStats& transferStats();

}  // namespace torchneuron
