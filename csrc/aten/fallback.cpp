// The boxed fallback that runs every ATen op without a kernel of its own.
//
// Asynchronous mode queues what it can on the stream instead (deferred.cpp); the rest runs here,
// after the stream's earlier work (launch() waits for it).
//
// Neuron tensors among the arguments are replaced by CPU aliases of their
// memory, a neuron device argument by the CPU, a neuron generator (or none)
// by a CPU generator keyed from the device generator's stream; PyTorch's CPU kernel runs; what it did
// to mutable arguments is reflected back, and its outputs become neuron
// tensors on the op's device without a copy.
#include "arguments.h"
#include "host_addressable.h"
#include "fallback.h"
#include "deferred.h"
#include "quantized.h"
#include "../runtime/neuron_runtime.h"

#include <ATen/NestedTensorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <string>
#include <string_view>
#include <utility>

namespace torchneuron {
namespace {

struct Alias {
  at::Tensor neuron;
  at::Tensor cpu;
  bool written;
};

// Ops whose CUDA kernels accept CPU index tensors; the same holds here.
bool acceptsCpuTensors(const c10::OperatorHandle& op) {
  const auto& name = op.schema().name();
  return name == "aten::index" || name == "aten::index_put_" || name == "aten::index_put" ||
         name == "aten::_index_put_impl_" || name == "aten::_index_put_impl";
}

class Call {
 public:
  explicit Call(const c10::OperatorHandle& op) : op_(op) {}

  at::Tensor hostArgument(const at::Tensor& t, const c10::Argument& arg, bool written) {
    if (!t.defined()) return t;
    nested_ = nested_ || t.is_nested();
    const auto device = t.device();
    if (device.type() == kNeuron && t.is_nested()) {
      noteDevice(device, arg);
      aliases_.push_back(Alias{t, nestedHostView(t), written});
      return aliases_.back().cpu;
    }
    if (device.type() == kNeuron && t.is_quantized()) {
      noteDevice(device, arg);
      quantized_ = true;
      for (auto& a : aliases_) {
        if (a.neuron.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
          a.written = a.written || written;
          return a.cpu;
        }
      }
      c10::Storage host_storage;
      for (const auto& a : aliases_)
        if (a.neuron.storage().is_alias_of(t.storage())) host_storage = a.cpu.storage();
      if (!host_storage) host_storage = hostStorageOf(t);
      aliases_.push_back(Alias{t, quantizedHostView(t, std::move(host_storage)), written});
      return aliases_.back().cpu;
    }
    if (device.type() == kNeuron) {
      noteDevice(device, arg);
      for (auto& a : aliases_) {  // the same tensor twice (self and out=self): one alias, as on the CPU
        if (a.neuron.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
          a.written = a.written || written;
          return a.cpu;
        }
      }
      const auto* storage = t.storage().unsafeGetStorageImpl();
      at::Tensor alias;
      for (const auto& a : aliases_) {
        if (a.neuron.storage().unsafeGetStorageImpl() == storage) {
          alias = hostViewSharing(t, a.cpu.storage());
          break;
        }
      }
      aliases_.push_back(Alias{t, alias.defined() ? std::move(alias) : hostView(t), written});
      return aliases_.back().cpu;
    }
    // A CPU scalar may join a neuron op as an input, as with CUDA; never as an output.
    if (device.is_cpu() && (t.dim() > 0 || written) && cpu_arg_ == nullptr) cpu_arg_ = &arg;
    return t;
  }

  void noteDevice(c10::Device device, const c10::Argument& arg) {
    const auto index = device.has_index() ? device.index() : currentDevice();
    if (device_ < 0) {
      device_ = index;
    } else if (index != device_) {
      failDeviceMismatch(device_, "neuron:" + std::to_string(index), arg.name(), op_.schema().operator_name());
    }
  }

  void convertArguments(torch::jit::Stack* stack) {
    to_cpu_ = torchneuron::convertArguments(
        op_, stack, [&](const at::Tensor& t, const c10::Argument& arg, bool written) { return hostArgument(t, arg, written); },
        [&](c10::Device device, const c10::Argument& arg) { noteDevice(device, arg); });
    if (device_ < 0) device_ = currentDevice();
    if (cpu_arg_ != nullptr && !aliases_.empty() && !acceptsCpuTensors(op_)) {
      failDeviceMismatch(device_, "cpu", cpu_arg_->name(), op_.schema().operator_name());
    }
    replaceGenerators(op_, stack, device_);
  }

  void reflectWrites() {
    for (const auto& a : aliases_)
      if (a.written && !a.neuron.is_nested()) updateFromHostView(a.neuron, a.cpu);
  }

  // The device the op runs on.
  c10::DeviceIndex device() const { return device_; }

  // The device the CPU kernel's buffers are allocated on: none for an explicit device=cpu.
  c10::DeviceIndex outputDevice() const { return to_cpu_ ? -1 : device_; }

  // The keys to run the CPU kernel under: nested arguments take the CPU's nested-tensor kernels.
  c10::DispatchKeySet cpuKeys() const {
    if (quantized_) return c10::DispatchKeySet({c10::DispatchKey::QuantizedCPU, c10::DispatchKey::CPU});
    return nested_ ? c10::DispatchKeySet({c10::DispatchKey::NestedTensorCPU, c10::DispatchKey::CPU})
                   : c10::DispatchKeySet(c10::DispatchKey::CPU);
  }

  at::Tensor deviceResult(at::Tensor out) {
    if (!out.defined() || !out.device().is_cpu()) return out;
    auto* impl = out.unsafeGetTensorImpl();
    for (const auto& a : aliases_)  // an in-place op returns its argument
      if (a.cpu.unsafeGetTensorImpl() == impl) return a.neuron;
    if (out.is_nested()) return nestedDeviceResult(std::move(out));
    TORCH_CHECK_NOT_IMPLEMENTED(out.layout() == c10::kStrided,
        op_.schema().operator_name(), " produced a tensor of layout ", out.layout(),
        ", which neuron does not support; only dense (torch.strided) tensors are.");
    if (out.is_quantized()) return quantizedDeviceResult(std::move(out));
    auto* storage = out.storage().unsafeGetStorageImpl();
    for (const auto& a : aliases_)  // a view of an argument
      if (a.cpu.storage().unsafeGetStorageImpl() == storage) return deviceTensorOver(a.neuron.storage(), out);
    for (const auto& [cpu_storage, neuron_storage] : adopted_)  // outputs sharing one buffer
      if (cpu_storage == storage) return deviceTensorOver(neuron_storage, out);
    if (out.use_count() > 1 || out.storage().use_count() > 1 + shared_outputs_) {
      // Someone else holds this buffer: copy it, leave theirs alone.
      return deviceTensorOver(deviceStorageCopy(storage, device_), out);
    }
    c10::Storage adopted = deviceStorage(storage, device_);
    adopted_.emplace_back(storage, adopted);
    if (shared_outputs_ == 0) return deviceTensorReusing(std::move(out), std::move(adopted));
    return deviceTensorOver(std::move(adopted), out);
  }

  void convertReturns(torch::jit::Stack* stack) {
    const size_t n = op_.schema().returns().size();
    if (n > 1) countSharedOutputs(stack, stack->size() - n);
    convertResults(op_, stack, [&](at::Tensor t) { return deviceResult(std::move(t)); });
  }

 private:
  // A CPU nested tensor over the memory of a neuron one (same nested sizes, strides and offsets).
  static at::Tensor nestedHostView(const at::Tensor& t) {
    const auto* nt = at::native::get_nested_tensor_impl(t);
    // Strict mode: the kernel reads the nested metadata too, which may be device memory (a nested
    // result's, made by a CPU kernel from the device's cache).
    if (auto* arguments = KernelArguments::current())
      for (const auto* m : {&nt->get_nested_sizes(), &nt->get_nested_strides(), &nt->get_storage_offsets()})
        if (m->defined()) arguments->add(m->storage());
    return at::detail::make_tensor<at::native::NestedTensorImpl>(
        hostView(nt->get_unsafe_storage_as_tensor()), nt->get_nested_sizes(), nt->get_nested_strides(),
        nt->get_storage_offsets());
  }

  // A nested CPU result as a neuron nested tensor: its buffer is an argument's (a view), or is
  // adopted (copied when someone else holds it). With an explicit device=cpu it stays on the CPU.
  at::Tensor nestedDeviceResult(at::Tensor out) {
    if (to_cpu_) return out;
    const auto* nt = at::native::get_nested_tensor_impl(out);
    auto* storage = out.storage().unsafeGetStorageImpl();
    c10::Storage device_storage;
    for (const auto& a : aliases_)
      if (a.cpu.storage().unsafeGetStorageImpl() == storage) device_storage = a.neuron.storage();
    const bool exclusive = out.use_count() == 1 && out.storage().use_count() == 1;
    const at::Tensor like = nt->get_unsafe_storage_as_tensor();  // the whole buffer, 1-d
    if (!device_storage)
      device_storage = exclusive ? deviceStorage(storage, device_) : deviceStorageCopy(storage, device_);
    auto buffer = deviceTensorOver(std::move(device_storage), like);
    return at::detail::make_tensor<at::native::NestedTensorImpl>(
        buffer, nt->get_nested_sizes(), nt->get_nested_strides(), nt->get_storage_offsets());
  }

  // A quantized CPU result as a quantized neuron tensor: a view of an argument, or its buffer
  // adopted (copied when someone else holds it). With an explicit device=cpu it stays on the CPU.
  at::Tensor quantizedDeviceResult(at::Tensor out) {
    if (to_cpu_) return out;
    auto* storage = out.storage().unsafeGetStorageImpl();
    for (const auto& a : aliases_)
      if (a.cpu.storage().unsafeGetStorageImpl() == storage)
        return quantizedDeviceTensorOver(a.neuron.storage(), out, device_);
    for (const auto& [cpu_storage, neuron_storage] : adopted_)
      if (cpu_storage == storage) return quantizedDeviceTensorOver(neuron_storage, out, device_);
    const bool exclusive = out.use_count() == 1 && out.storage().use_count() == 1 + shared_outputs_;
    c10::Storage device_storage = exclusive ? deviceStorage(storage, device_) : deviceStorageCopy(storage, device_);
    adopted_.emplace_back(storage, device_storage);
    return quantizedDeviceTensorOver(std::move(device_storage), out, device_);
  }

  // Several returned tensors may share one new buffer (each holds a reference).
  void countSharedOutputs(torch::jit::Stack* stack, size_t first) {
    c10::SmallVector<const c10::StorageImpl*, 4> seen;
    for (size_t i = first; i < stack->size(); ++i) {
      const auto& iv = (*stack)[i];
      if (!iv.isTensor()) continue;
      const auto& t = iv.toTensor();
      if (!t.defined() || !t.has_storage()) continue;
      const auto* s = t.storage().unsafeGetStorageImpl();
      for (const auto* o : seen)
        if (o == s) ++shared_outputs_;
      seen.push_back(s);
    }
  }

  const c10::OperatorHandle& op_;
  c10::SmallVector<Alias, 4> aliases_;
  c10::SmallVector<std::pair<const c10::StorageImpl*, c10::Storage>, 2> adopted_;
  c10::DeviceIndex device_ = -1;
  const c10::Argument* cpu_arg_ = nullptr;
  size_t shared_outputs_ = 0;
  bool to_cpu_ = false;  // an explicit device=cpu argument
  bool nested_ = false;  // a nested tensor among the arguments
  bool quantized_ = false;  // a quantized tensor among the arguments
};

// An op that reaches the fallback without a CPU kernel (flash attention and other ops PyTorch
// implements only for GPUs) has nothing to run on the device's memory. Say so, with the devices
// that have kernels for it, rather than PyTorch's "Could not run ... from the 'CPU' backend".
[[noreturn]] void failNoCpuKernel(const c10::OperatorHandle& op) {
  static const std::pair<c10::DispatchKey, const char*> kDevices[] = {
      {c10::DispatchKey::CUDA, "cuda"}, {c10::DispatchKey::HIP, "hip"},   {c10::DispatchKey::XPU, "xpu"},
      {c10::DispatchKey::MPS, "mps"},   {c10::DispatchKey::HPU, "hpu"},   {c10::DispatchKey::MTIA, "mtia"},
      {c10::DispatchKey::Meta, "meta (shapes only)"}};
  std::string devices;
  for (const auto& [key, name] : kDevices) {
    if (!op.hasKernelForDispatchKey(key)) continue;
    if (!devices.empty()) devices += ", ";
    devices += name;
  }
  const bool attention = op.schema().name().find("attention") != std::string::npos;
  TORCH_CHECK_NOT_IMPLEMENTED(false, op.operator_name(),
                              " is not implemented for neuron: neuron runs PyTorch's CPU kernels, and PyTorch has "
                              "no CPU kernel for it; this build of PyTorch has kernels for it only on ",
                              devices.empty() ? std::string("no device") : devices, ". Use an op that runs on the CPU",
                              attention ? " (for attention: scaled_dot_product_attention or flex_attention)." : ".");
}

}  // namespace

void neuronFallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  if (recordingOps() && recordOp(op, stack)) return;       // recorded (fused eager: into its group); results allocated
  if (rt::asyncMode() && !rt::insideKernel() && enqueueOp(op, stack)) return;  // queued; results allocated
  KernelArguments arguments;  // strict mode: the memory of the host views made for the CPU kernel
  Call call(op);
  call.convertArguments(stack);
  {
    DeviceOutputScope scope(call.outputDevice());
    try {
      launch(call.device(), {rt::ActivityKind::Kernel, kernelName(op.schema().name())},
             [&] { op.redispatchBoxed(call.cpuKeys(), stack); });
    } catch (const c10::NotImplementedError&) {
      if (!op.hasKernelForDispatchKey(c10::DispatchKey::CPU)) failNoCpuKernel(op);
      throw;
    }
  }
  call.reflectWrites();
  call.convertReturns(stack);
}

void failDeviceMismatch(c10::DeviceIndex device, const std::string& other, const std::string& arg,
                        const c10::OperatorName& op) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, neuron:",
              int(device), " and ", other, "! (when checking argument '", arg, "' of ", op, ")");
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&neuronFallback>());
}

// Quantized tensors on the device run the CPU's quantized kernels the same way (quantized.cpp).
TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&neuronFallback>());
}

// Nested tensors on the device run the CPU's nested-tensor kernels the same way.
TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&neuronFallback>());
}

// Generic kernels that call a per-device DispatchStub, which neuron does not
// fill: run them on CPU aliases instead.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("conj_physical_", torch::CppFunction::makeFromBoxedFunction<&neuronFallback>());
  m.impl("mode.values", torch::CppFunction::makeFromBoxedFunction<&neuronFallback>());
  // addr_'s generic kernel calls addr.out(self, ...): the CPU kernel recognizes
  // an in-place call only when it is handed self itself.
  m.impl("addr_", torch::CppFunction::makeFromBoxedFunction<&neuronFallback>());
}

// Many ops have both a CPU kernel and a generic one that every other backend
// gets: structured ops (add, mul, ...) allocate the result and call their out=
// variant; others (layer_norm, group_norm, ...) decompose into several ops.
// Running the CPU's own kernel instead gives the CPU's exact numbers and saves
// allocations, aliases and dispatches, so the fallback is registered
// explicitly for each such op. Views keep their generic kernels.
void preferCpuKernels() {
  static torch::Library* library = nullptr;
  static torch::Library* nested = nullptr;
  static torch::Library* quantized = nullptr;
  if (library != nullptr) return;
  library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  nested = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::NestedTensorPrivateUse1, __FILE__,
                              __LINE__);
  const auto fallback = [] { return torch::CppFunction::makeFromBoxedFunction<&neuronFallback>(); };
  quantized = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::QuantizedPrivateUse1, __FILE__,
                                 __LINE__);
  forEachAtenOp([&](const c10::OperatorHandle& op, const std::string& qualified) {
    // Quantized tensors: the CPU's quantized kernel (clone, ...), also where a generic kernel would win.
    if (op.hasKernelForDispatchKey(c10::DispatchKey::QuantizedCPU) &&
        !op.hasKernelForDispatchKey(c10::DispatchKey::QuantizedPrivateUse1)) {
      bool is_view = false;
      for (const auto& ret : op.schema().returns())
        if (ret.alias_info() != nullptr && !ret.alias_info()->isWrite()) is_view = true;
      if (!is_view) quantized->impl(qualified.c_str(), fallback());
    }
    // Nested tensors: the CPU's nested kernel, also where a generic kernel would otherwise win.
    if (op.hasKernelForDispatchKey(c10::DispatchKey::NestedTensorCPU) &&
        !op.hasKernelForDispatchKey(c10::DispatchKey::NestedTensorPrivateUse1))
      nested->impl(qualified.c_str(), fallback());
    if (!op.hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
        op.hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1))
      return;
    if (!op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) &&
        !op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd))
      return;
    bool is_view = false;
    for (const auto& ret : op.schema().returns())
      if (ret.alias_info() != nullptr && !ret.alias_info()->isWrite()) is_view = true;
    if (is_view) return;
    library->impl(qualified.c_str(), fallback());
  });
}

}  // namespace torchneuron
