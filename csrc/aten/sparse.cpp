// Sparse tensors on the device.
//
// A neuron sparse tensor is PyTorch's own sparse tensor (SparseTensorImpl for COO,
// SparseCsrTensorImpl for CSR, CSC, BSR and BSC) under the SparsePrivateUse1 or
// SparseCsrPrivateUse1 key, whose indices and values are dense neuron tensors: device memory.
//
// Ops run as dense ones do, on the zero-copy path: each neuron sparse argument becomes a CPU
// sparse tensor whose indices and values are CPU aliases of the device memory, dense neuron
// arguments become CPU aliases, PyTorch's SparseCPU (or SparseCsrCPU) kernel runs with its new
// buffers served by the device's caching allocator, and the CPU sparse results become neuron
// sparse tensors over that memory without a copy. Reading a sparse tensor's parts (indices,
// values, nnz, dims) and building one from parts on the device are direct kernels; copy_ between
// devices copies the parts. An op PyTorch has no CPU sparse kernel for raises NotImplementedError.
#include "arguments.h"
#include "launch.h"
#include "host_addressable.h"
#include "fallback.h"

#include <ATen/SparseCsrTensorImpl.h>
#include <ATen/SparseTensorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/_coalesced_native.h>
#include <ATen/ops/_indices_native.h>
#include <ATen/ops/_nnz_native.h>
#include <ATen/ops/_values_native.h>
#include <ATen/ops/dense_dim_native.h>
#include <ATen/ops/indices_native.h>
#include <ATen/ops/is_coalesced_native.h>
#include <ATen/ops/sparse_dim_native.h>
#include <ATen/ops/values_native.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <sstream>

namespace torchneuron {
namespace {

using c10::DispatchKey;

bool isCoo(const at::Tensor& t) { return t.layout() == c10::kSparse; }

bool isCompressed(const at::Tensor& t) {
  const auto layout = t.layout();
  return layout == c10::kSparseCsr || layout == c10::kSparseCsc || layout == c10::kSparseBsr ||
         layout == c10::kSparseBsc;
}

at::SparseTensorImpl* cooImpl(const at::Tensor& t) {
  return static_cast<at::SparseTensorImpl*>(t.unsafeGetTensorImpl());
}

at::SparseCsrTensorImpl* compressedImpl(const at::Tensor& t) {
  return static_cast<at::SparseCsrTensorImpl*>(t.unsafeGetTensorImpl());
}

// A COO tensor of `key` made of `indices` and `values` as they are (no copy). A neuron one is
// built under a guard for its parts' device, which PyTorch takes for the tensor's own.
at::Tensor assembleCoo(DispatchKey key, caffe2::TypeMeta dtype, int64_t sparse_dim, int64_t dense_dim,
                       c10::IntArrayRef sizes, const at::Tensor& indices, const at::Tensor& values, bool coalesced) {
  c10::OptionalDeviceGuard guard;
  if (key == DispatchKey::SparsePrivateUse1) guard.reset_device(values.device());
  auto out = at::detail::make_tensor<at::SparseTensorImpl>(c10::DispatchKeySet(key), dtype);
  auto* impl = cooImpl(out);
  impl->raw_resize_(sparse_dim, dense_dim, sizes);
  impl->set_indices_and_values_unsafe(indices, values);
  impl->set_coalesced(coalesced);
  return out;
}

// A compressed tensor (CSR, CSC, BSR, BSC) of `key` on `device` made of its parts as they are.
at::Tensor assembleCompressed(DispatchKey key, c10::Device device, c10::Layout layout, caffe2::TypeMeta dtype,
                              const at::Tensor& compressed, const at::Tensor& plain, const at::Tensor& values,
                              c10::IntArrayRef sizes) {
  auto out = at::detail::make_tensor<at::SparseCsrTensorImpl>(c10::DispatchKeySet(key), device, layout, dtype);
  compressedImpl(out)->set_member_tensors(compressed, plain, values, sizes);
  return out;
}

// A handle on a tensor without its autograd metadata, sharing its version counter: what a sparse
// tensor keeps of the indices and values it is built from, as PyTorch's constructors do.
at::Tensor detached(const at::Tensor& t) {
  auto* impl = t.unsafeGetTensorImpl();
  return at::Tensor(impl->shallow_copy_and_detach(impl->version_counter(), /*allow_tensor_metadata_change=*/true));
}

// ---- building a COO tensor on the device -----------------------------------------------------

at::Tensor cooWithDimsAndTensors(int64_t sparse_dim, int64_t dense_dim, c10::SymIntArrayRef size,
                                 const at::Tensor& indices, const at::Tensor& values,
                                 std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                                 std::optional<c10::Device> device, std::optional<bool> pin_memory,
                                 std::optional<bool> is_coalesced) {
  TORCH_CHECK(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned");
  TORCH_CHECK(!layout || *layout == c10::kSparse, "expected sparse layout, but got layout ", *layout);
  c10::Device target = values.device();
  if (device && device->has_index()) target = *device;
  else if (target.type() != kNeuron) target = c10::Device(kNeuron, currentDevice());
  checkDevice(target.index());
  c10::DeviceGuard guard(target);
  auto out = at::detail::make_tensor<at::SparseTensorImpl>(
      c10::DispatchKeySet(DispatchKey::SparsePrivateUse1),
      c10::scalarTypeToTypeMeta(dtype.value_or(values.scalar_type())));
  auto* impl = cooImpl(out);
  impl->resize_(sparse_dim, dense_dim, C10_AS_INTARRAYREF_SLOW(size));
  impl->set_indices_and_values_unsafe(detached(indices), detached(values));
  if (is_coalesced) impl->set_coalesced(*is_coalesced);
  return out;
}

// The layout as Python names it.
std::string layoutName(c10::Layout layout) {
  switch (layout) {
    case c10::kSparse: return "torch.sparse_coo";
    case c10::kSparseCsr: return "torch.sparse_csr";
    case c10::kSparseCsc: return "torch.sparse_csc";
    case c10::kSparseBsr: return "torch.sparse_bsr";
    case c10::kSparseBsc: return "torch.sparse_bsc";
    default: {
      std::ostringstream s;
      s << layout;
      return s.str();
    }
  }
}

// ---- copy_ ------------------------------------------------------------------------------------

// copy_ into or out of a neuron sparse tensor: the parts are copied to the destination's device
// (the dense copy kernels), as the CPU and CUDA do within one device.
at::Tensor& copySparse(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  TORCH_CHECK(self.layout() == src.layout(), "copy_() between tensors of layouts ", layoutName(self.layout()),
              " and ", layoutName(src.layout()), " is not supported; convert with to_dense() or to_sparse() first (self is on ",
              self.device(), ", src on ", src.device(), ")");
  if (self.is_same(src)) return self;
  if (isCoo(self)) {
    const auto* from = cooImpl(src);
    auto* to = cooImpl(self);
    c10::DeviceGuard guard(self.device());
    auto indices = from->indices().to(self.device(), at::kLong, non_blocking, /*copy=*/true);
    auto values = from->values().to(self.device(), self.scalar_type(), non_blocking, /*copy=*/true);
    to->raw_resize_(from->sparse_dim(), from->dense_dim(), src.sizes());
    to->set_indices_and_values_unsafe(indices, values);
    to->set_coalesced(from->coalesced());
    return self;
  }
  // Compressed layouts copy into the destination's parts, which must have the same shape.
  TORCH_CHECK(self.sizes() == src.sizes(), "copy_ between compressed sparse tensors of different shapes (",
              self.sizes(), " and ", src.sizes(), ") is not supported");
  const auto* from = compressedImpl(src);
  auto* to = compressedImpl(self);
  TORCH_CHECK(to->nnz() == compressedImpl(src)->nnz(),
              "copy_ between compressed sparse tensors with different numbers of specified elements (",
              to->nnz(), " and ", compressedImpl(src)->nnz(), ") is not supported");
  to->compressed_indices().copy_(from->compressed_indices(), non_blocking);
  to->plain_indices().copy_(from->plain_indices(), non_blocking);
  to->values().copy_(from->values(), non_blocking);
  return self;
}

// ---- the zero-copy path for sparse ops ------------------------------------------------------------

// A neuron argument and the CPU tensor standing for it in the kernel.
struct Alias {
  at::Tensor neuron;
  at::Tensor cpu;
  bool written;
};

// One sparse op's run on the CPU's kernel: its arguments made CPU tensors, the kernel's writes
// reflected on the device, its results made neuron tensors. One class of about 200 lines because every
// step reads the same state (the op, the device found, the aliases made for the arguments, their
// layouts): split, each piece would take all of it as arguments.
class SparseCall {
 public:
  SparseCall(const c10::OperatorHandle& op, c10::DispatchKeySet keys) : op_(op) {
    coo_ = keys.has(DispatchKey::SparsePrivateUse1);
    compressed_ = keys.has(DispatchKey::SparseCsrPrivateUse1);
  }

  void convertArguments(torch::jit::Stack* stack) {
    torchneuron::convertArguments(
        op_, stack, [&](const at::Tensor& t, const c10::Argument& arg, bool written) { return hostArgument(t, arg, written); },
        [&](c10::Device device, const c10::Argument& arg) { noteDevice(device, arg); });
    if (device_ < 0) device_ = currentDevice();
    if (cpu_arg_ != nullptr && (!dense_.empty() || !sparse_.empty()))
      failDeviceMismatch(device_, "cpu", cpu_arg_->name(), op_.schema().operator_name());
    replaceGenerators(op_, stack, device_);
  }

  // The CPU keys the kernel runs under, after checking that PyTorch has a CPU kernel there.
  c10::DispatchKeySet cpuKeys() const {
    c10::DispatchKeySet keys(DispatchKey::CPU);
    if (coo_) keys = keys.add(DispatchKey::SparseCPU);
    if (compressed_) keys = keys.add(DispatchKey::SparseCsrCPU);
    const auto key = compressed_ ? DispatchKey::SparseCsrCPU : coo_ ? DispatchKey::SparseCPU : DispatchKey::CPU;
    TORCH_CHECK_NOT_IMPLEMENTED(op_.hasComputedKernelForDispatchKey(key),
        op_.schema().operator_name(), " is not supported for ", describeLayouts(),
        " tensors on neuron: neuron runs sparse ops with PyTorch's CPU kernels, and the CPU has none for this op. "
        "Convert with .to_dense() first, or run it on the CPU.");
    return keys;
  }

  c10::DeviceIndex device() const { return device_; }

  void reflectWrites() {
    for (const auto& d : dense_)
      if (d.written) updateFromHostView(d.neuron, d.cpu);
    for (const auto& s : sparse_) {
      if (!s.written) continue;
      c10::DeviceGuard guard(s.neuron.device());
      if (isCoo(s.neuron)) {
        const auto* cpu = cooImpl(s.cpu);
        auto* neuron = cooImpl(s.neuron);
        // The CPU tensor holds its parts besides us: it is dropped after the op.
        auto indices = denseDeviceResult(cpu->indices(), 2);
        auto values = denseDeviceResult(cpu->values(), 2);
        neuron->raw_resize_(cpu->sparse_dim(), cpu->dense_dim(), s.cpu.sizes());
        neuron->set_indices_and_values_unsafe(indices, values);
        neuron->set_coalesced(cpu->coalesced());
      } else {
        const auto* cpu = compressedImpl(s.cpu);
        auto* neuron = compressedImpl(s.neuron);
        neuron->set_layout(s.cpu.layout());
        neuron->set_member_tensors(denseDeviceResult(cpu->compressed_indices(), 2),
                                   denseDeviceResult(cpu->plain_indices(), 2), denseDeviceResult(cpu->values(), 2),
                                   s.cpu.sizes());
      }
    }
  }

  void convertReturns(torch::jit::Stack* stack) {
    convertResults(op_, stack, [&](at::Tensor t) { return deviceResult(std::move(t)); });
  }

 private:
  std::string describeLayouts() const {
    std::string s;
    for (const auto& a : sparse_) {
      const auto name = layoutName(a.neuron.layout());
      if (s.find(name) == std::string::npos) s += (s.empty() ? "" : " and ") + name;
    }
    if (s.empty()) s = coo_ ? "torch.sparse_coo" : "sparse compressed";
    return s;
  }

  void noteDevice(c10::Device device, const c10::Argument& arg) {
    const auto index = device.has_index() ? device.index() : currentDevice();
    if (device_ < 0) device_ = index;
    else if (index != device_)
      failDeviceMismatch(device_, "neuron:" + std::to_string(index), arg.name(), op_.schema().operator_name());
  }

  at::Tensor hostArgument(const at::Tensor& t, const c10::Argument& arg, bool written) {
    if (!t.defined()) return t;
    if (t.device().type() != kNeuron) {
      // A CPU scalar may join a neuron op as an input, as with CUDA; never as an output.
      if (t.device().is_cpu() && (t.layout() != c10::kStrided || t.dim() > 0 || written) && cpu_arg_ == nullptr)
        cpu_arg_ = &arg;
      return t;
    }
    noteDevice(t.device(), arg);
    TORCH_CHECK_NOT_IMPLEMENTED(!t.is_nested(), op_.schema().operator_name(),
                                " does not take nested and sparse tensors together on neuron");
    if (isCoo(t) || isCompressed(t)) {
      for (auto& s : sparse_) {
        if (s.neuron.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
          s.written = s.written || written;
          return s.cpu;
        }
      }
      at::Tensor cpu;
      if (isCoo(t)) {
        coo_ = true;
        const auto* impl = cooImpl(t);
        cpu = assembleCoo(DispatchKey::SparseCPU, t.dtype(), impl->sparse_dim(), impl->dense_dim(), t.sizes(),
                          denseToCpu(impl->indices(), written), denseToCpu(impl->values(), written),
                          impl->coalesced());
      } else {
        compressed_ = true;
        const auto* impl = compressedImpl(t);
        cpu = assembleCompressed(DispatchKey::SparseCsrCPU, c10::Device(c10::kCPU), t.layout(), t.dtype(),
                                 denseToCpu(impl->compressed_indices(), written),
                                 denseToCpu(impl->plain_indices(), written), denseToCpu(impl->values(), written),
                                 t.sizes());
      }
      if (t.requires_grad()) cpu.unsafeGetTensorImpl()->set_requires_grad(true);
      sparse_.push_back(Alias{t, cpu, written});
      return cpu;
    }
    at::Tensor cpu = denseToCpu(t, written);
    if (t.requires_grad() && !cpu.requires_grad()) {
      // Some CPU sparse kernels keep what the backward pass needs only for inputs that require
      // gradients (sparse.mm's amax and amin reductions): the alias says so too. It is a tensor of
      // its own, never one of the pooled aliases.
      cpu = hostViewSharing(t, cpu.storage());
      cpu.unsafeGetTensorImpl()->set_requires_grad(true);
      for (auto& d : dense_)
        if (d.neuron.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) d.cpu = cpu;
    }
    return cpu;
  }

  at::Tensor denseToCpu(const at::Tensor& t, bool written) {
    for (auto& d : dense_) {
      if (d.neuron.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
        d.written = d.written || written;
        return d.cpu;
      }
    }
    at::Tensor cpu;
    for (const auto& d : dense_) {  // tensors sharing device memory share it on the CPU too
      if (d.neuron.storage().is_alias_of(t.storage())) {
        cpu = hostViewSharing(t, d.cpu.storage());
        break;
      }
    }
    if (!cpu.defined()) cpu = hostView(t);
    dense_.push_back(Alias{t, cpu, written});
    return cpu;
  }

  at::Tensor deviceResult(at::Tensor out) {
    if (!out.defined() || !out.device().is_cpu()) return out;
    for (const auto& s : sparse_)  // an in-place op returns its argument
      if (s.cpu.unsafeGetTensorImpl() == out.unsafeGetTensorImpl()) return s.neuron;
    if (isCoo(out)) {
      const auto* impl = cooImpl(out);
      const auto dtype = out.dtype();
      const int64_t sparse_dim = impl->sparse_dim(), dense_dim = impl->dense_dim();
      const bool coalesced = impl->coalesced();
      const std::vector<int64_t> sizes(out.sizes().begin(), out.sizes().end());
      at::Tensor indices = impl->indices(), values = impl->values();
      out = at::Tensor();  // its parts may now be ours alone, to take over without a copy
      auto neuron_indices = denseDeviceResult(std::move(indices));
      auto neuron_values = denseDeviceResult(std::move(values));
      return assembleCoo(DispatchKey::SparsePrivateUse1, dtype, sparse_dim, dense_dim, sizes, neuron_indices,
                         neuron_values, coalesced);
    }
    if (isCompressed(out)) {
      const auto* impl = compressedImpl(out);
      const auto dtype = out.dtype();
      const auto layout = out.layout();
      const std::vector<int64_t> sizes(out.sizes().begin(), out.sizes().end());
      at::Tensor compressed = impl->compressed_indices(), plain = impl->plain_indices(), values = impl->values();
      out = at::Tensor();
      auto neuron_compressed = denseDeviceResult(std::move(compressed));
      auto neuron_plain = denseDeviceResult(std::move(plain));
      auto neuron_values = denseDeviceResult(std::move(values));
      return assembleCompressed(DispatchKey::SparseCsrPrivateUse1, c10::Device(kNeuron, device_), layout, dtype,
                                neuron_compressed, neuron_plain, neuron_values, sizes);
    }
    return denseDeviceResult(std::move(out));
  }

  // A dense CPU result (or part of a sparse one) as a neuron tensor: an argument itself, a view of
  // one, or a buffer taken over (copied when someone else holds it). `ours` counts the references
  // to `out` that go away with the op.
  at::Tensor denseDeviceResult(at::Tensor out, long ours = 1) {
    TORCH_CHECK_NOT_IMPLEMENTED(out.layout() == c10::kStrided && !out.is_nested(), op_.schema().operator_name(),
        " produced a tensor of layout ", out.layout(), ", which neuron does not support");
    for (const auto& d : dense_)
      if (d.cpu.unsafeGetTensorImpl() == out.unsafeGetTensorImpl()) return d.neuron;
    auto* storage = out.storage().unsafeGetStorageImpl();
    for (const auto& d : dense_)
      if (d.cpu.storage().unsafeGetStorageImpl() == storage) return deviceTensorOver(d.neuron.storage(), out);
    for (const auto& [cpu_storage, neuron_storage] : adopted_)
      if (cpu_storage == storage) return deviceTensorOver(neuron_storage, out);
    if (out.use_count() > ours || out.storage().use_count() > 1) return deviceTensorOver(deviceStorageCopy(storage, device_), out);
    c10::Storage adopted = deviceStorage(storage, device_);
    adopted_.emplace_back(storage, adopted);
    return deviceTensorOver(std::move(adopted), out);
  }

  const c10::OperatorHandle& op_;
  c10::SmallVector<Alias, 6> dense_;   // dense arguments and sparse ones' parts
  c10::SmallVector<Alias, 3> sparse_;
  c10::SmallVector<std::pair<const c10::StorageImpl*, c10::Storage>, 3> adopted_;
  c10::DeviceIndex device_ = -1;
  const c10::Argument* cpu_arg_ = nullptr;
  bool coo_ = false;
  bool compressed_ = false;
};

void sparseFallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  KernelArguments arguments;  // strict mode: the memory of the host views made for the CPU kernel
  SparseCall call(op, keys);
  call.convertArguments(stack);
  const auto cpu_keys = call.cpuKeys();
  {
    DeviceOutputScope scope(call.device());
    launch(call.device(), {rt::ActivityKind::Kernel, kernelName(op.schema().name())},
           [&] { op.redispatchBoxed(cpu_keys, stack); });
  }
  call.reflectWrites();
  call.convertReturns(stack);
}

torch::CppFunction fallback() { return torch::CppFunction::makeFromBoxedFunction<&sparseFallback>(); }

}  // namespace

// Reading a COO tensor's parts and building one: PyTorch's kernels for these are device-generic.
TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  m.impl("_sparse_coo_tensor_with_dims_and_tensors", TORCH_FN(cooWithDimsAndTensors));
  m.impl("_indices", TORCH_FN(at::native::_indices_sparse));
  m.impl("_values", TORCH_FN(at::native::_values_sparse));
  m.impl("indices", TORCH_FN(at::native::indices_sparse));
  m.impl("values", TORCH_FN(at::native::values_sparse));
  m.impl("_nnz", TORCH_FN(at::native::_nnz_sparse));
  m.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("_dimI", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("_dimV", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("is_coalesced", TORCH_FN(at::native::is_coalesced_sparse));
  m.impl("_coalesced_", TORCH_FN(at::native::_coalesced_sparse_));
  m.impl("copy_", TORCH_FN(copySparse));
}

TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
  m.impl("copy_", TORCH_FN(copySparse));
}

// Every other sparse op: PyTorch's CPU sparse kernel on the zero-copy path, or NotImplementedError.
TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) { m.fallback(fallback()); }
TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) { m.fallback(fallback()); }

// Dense neuron tensors converted to sparse layouts.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* name : {"_to_sparse", "_to_sparse.sparse_dim", "_to_sparse_csr", "_to_sparse_csc",
                           "_to_sparse_bsr", "_to_sparse_bsc"})
    m.impl(name, fallback());
}

// An op with a CPU sparse kernel may also have a generic kernel that PyTorch would pick for a
// device sparse tensor (copy_, sum, add for compressed layouts, ...) and that expects a dense one:
// such ops, like all with a CPU sparse kernel, run the CPU's sparse kernel instead.
void preferSparseCpuKernels() {
  static torch::Library* coo = nullptr;
  static torch::Library* compressed = nullptr;
  if (coo != nullptr) return;
  coo = new torch::Library(torch::Library::IMPL, "aten", DispatchKey::SparsePrivateUse1, __FILE__, __LINE__);
  compressed = new torch::Library(torch::Library::IMPL, "aten", DispatchKey::SparseCsrPrivateUse1, __FILE__,
                                  __LINE__);
  forEachAtenOp([&](const c10::OperatorHandle& op, const std::string& qualified) {
    if (op.hasKernelForDispatchKey(DispatchKey::SparseCPU) && !op.hasKernelForDispatchKey(DispatchKey::SparsePrivateUse1))
      coo->impl(qualified.c_str(), fallback());
    if (op.hasKernelForDispatchKey(DispatchKey::SparseCsrCPU) &&
        !op.hasKernelForDispatchKey(DispatchKey::SparseCsrPrivateUse1))
      compressed->impl(qualified.c_str(), fallback());
  });
}

}  // namespace torchneuron
