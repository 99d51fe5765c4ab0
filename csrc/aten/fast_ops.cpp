// The zero-copy path without boxing, for the most frequent ops.
//
// The boxed fallback handles every op, but packing arguments into a stack and
// unpacking them again costs more than a small op itself. For functional ops
// (fresh results, no generator), out= variants and in-place ops without a
// generator the same work is done here with the op's own C++ signature: check
// devices, alias the tensor arguments as CPU tensors, call the CPU kernel, move
// the result to the device (or reflect what the kernel did to the written one).
#include "dispatch_stub.h"  // first: it declares DispatchStub as PyTorch's build does
#include "launch.h"
#include "allocator.h"
#include "host_addressable.h"
#include "fallback.h"
#include "widening.h"

#include <ATen/EmptyTensor.h>
#include <ATen/Operators.h>
#include <ATen/native/Activation.h>
#include <ATen/native/BinaryOps.h>
#include <ATen/native/Copy.h>
#include <ATen/native/Fill.h>
#include <ATen/native/Lerp.h>
#include <ATen/native/PointwiseOps.h>
#include <ATen/native/Pow.h>
#include <ATen/native/ReduceOps.h>
#include <ATen/native/TensorCompare.h>
#include <ATen/native/UnaryOps.h>
#include <ATen/ops/add_native.h>
#include <ATen/ops/addcdiv_native.h>
#include <ATen/ops/addcmul_native.h>
#include <ATen/ops/addmm_native.h>
#include <ATen/ops/amax_native.h>
#include <ATen/ops/amin_native.h>
#include <ATen/ops/cat_native.h>
#include <ATen/ops/clamp_min_native.h>
#include <ATen/ops/cos_native.h>
#include <ATen/ops/div_native.h>
#include <ATen/ops/elu_native.h>
#include <ATen/ops/eq_native.h>
#include <ATen/ops/erf_native.h>
#include <ATen/ops/exp_native.h>
#include <ATen/ops/ge_native.h>
#include <ATen/ops/gt_native.h>
#include <ATen/ops/le_native.h>
#include <ATen/ops/leaky_relu_native.h>
#include <ATen/ops/lerp_native.h>
#include <ATen/ops/log_native.h>
#include <ATen/ops/lt_native.h>
#include <ATen/ops/maximum_native.h>
#include <ATen/ops/minimum_native.h>
#include <ATen/ops/mm_native.h>
#include <ATen/ops/mul_native.h>
#include <ATen/ops/ne_native.h>
#include <ATen/ops/neg_native.h>
#include <ATen/ops/pow_native.h>
#include <ATen/ops/reciprocal_native.h>
#include <ATen/ops/rsqrt_native.h>
#include <ATen/ops/sigmoid_native.h>
#include <ATen/ops/sigmoid_backward_native.h>
#include <ATen/ops/silu_native.h>
#include <ATen/ops/silu_backward_native.h>
#include <ATen/ops/sin_native.h>
#include <ATen/ops/softplus_native.h>
#include <ATen/ops/sqrt_native.h>
#include <ATen/ops/sub_native.h>
#include <ATen/ops/sum_native.h>
#include <ATen/ops/tanh_native.h>
#include <ATen/ops/tanh_backward_native.h>
#include <ATen/ops/threshold_backward_native.h>
#include <ATen/ops/_softmax_native.h>
#include <ATen/ops/_log_softmax_native.h>
#include <ATen/ops/_softmax_backward_data_native.h>
#include <ATen/ops/_log_softmax_backward_data_native.h>
#include <ATen/ops/native_layer_norm_native.h>
#include <ATen/ops/native_layer_norm_backward_native.h>
#include <ATen/ops/index_select_native.h>
#include <ATen/ops/embedding_dense_backward_native.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_native.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward_native.h>
#include <c10/core/DynamicCast.h>
#include <ATen/core/boxing/impl/boxing.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace torchneuron {
namespace {

class Scan {
 public:
  void add(const at::Tensor& t) {
    ++position_;
    if (!t.defined()) return;
    const auto device = t.device();
    if (device.type() == kNeuron) {
      const auto index = device.index();
      if (device_ < 0) {
        device_ = index;
      } else if (index != device_) {
        other_ = index;
        other_position_ = position_;
      }
    } else if (device.is_cpu() && t.dim() > 0 && cpu_position_ == 0) {
      cpu_position_ = position_;
    }
  }
  void add(const std::optional<at::Tensor>& t) {
    if (t.has_value()) add(*t);
    else ++position_;
  }
  // A written argument (out=, in-place self) must be on the device, even a CPU scalar.
  void add(at::Tensor& t) {
    if (t.defined() && t.device().is_cpu() && cpu_position_ == 0) cpu_position_ = position_ + 1;
    add(std::as_const(t));
  }
  // A list of tensors (cat's) is one argument: its tensors are checked at its position.
  void add(const at::ITensorListRef& list) {
    const int position = position_;
    for (const at::Tensor& t : list) {
      position_ = position;
      add(t);
    }
    position_ = position + 1;
  }
  template <class T>
  void add(const T&) { ++position_; }

  // Raises PyTorch's usual error for tensors on two devices.
  c10::DeviceIndex check(const char* name, const char* overload) const {
    if (other_ >= 0 || cpu_position_ > 0) {
      const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
      const int position = other_ >= 0 ? other_position_ : cpu_position_;
      const auto& arg = op.schema().arguments().at(position - 1).name();
      failDeviceMismatch(device_, other_ >= 0 ? "neuron:" + std::to_string(other_) : std::string("cpu"), arg,
                         op.schema().operator_name());
    }
    return device_ < 0 ? currentDevice() : device_;
  }

 private:
  c10::DeviceIndex device_ = -1;
  c10::DeviceIndex other_ = -1;
  int position_ = 0;
  int other_position_ = 0;
  int cpu_position_ = 0;
};

// The host views of one call's arguments: HostViewLease's, and a list of tensors as host views
// (a vector the call's full expression keeps alive).
class Lender {
 public:
  template <class T>
  decltype(auto) arg(const T& value) { return views_.arg(value); }
  std::vector<at::Tensor> arg(const at::ITensorListRef& list) {
    std::vector<at::Tensor> out;
    out.reserve(list.size());
    for (const at::Tensor& t : list) out.push_back(hostArgument(t));
    return out;
  }

 private:
  HostViewLease views_;
};

// Runs Op's CPU kernel on already converted arguments, its buffers allocated on `device`.
template <class Op, class... Args>
decltype(auto) cpuKernel(c10::DeviceIndex device, Args&&... args) {
  DeviceOutputScope scope(device);
  return launch(device, {rt::ActivityKind::Kernel, kKernelName<Op>}, [&]() -> decltype(auto) {
    return Op::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), std::forward<Args>(args)...);
  });
}

// Fused eager records every op through the boxed fallback (fused.cpp).
template <class Op, class R, class... Args>
R throughFallback(Args... args) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
  torch::jit::Stack stack = c10::impl::boxArgs<Args...>(args...);
  neuronFallback(op, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), &stack);
  return c10::impl::PopResult<R>::call(stack);
}

template <class Op, class Schema = typename Op::schema>
struct Fast;

// An op of the widening table whose CPU kernel lacks the dtype (sin of complex32, ...) runs
// through widenedFallback (widening.cpp); nothing is added to a successful call.
template <class Op, class R, class... Args>
R throughWidening(Args... args) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
  torch::jit::Stack stack = c10::impl::boxArgs<Args...>(args...);
  widenedFallback(op, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), &stack);
  return c10::impl::PopResult<R>::call(stack);
}

template <class Op, class... Args>
struct Fast<Op, at::Tensor(Args...)> {
  static at::Tensor call(Args... args) {
    static const bool widened = widens(Op::name);
    if (recordingOps()) {
      // Recorded ops run later: a dtype the CPU kernel lacks is widened when recorded.
      return widened ? throughWidening<Op, at::Tensor, Args...>(args...)
                     : throughFallback<Op, at::Tensor, Args...>(args...);
    }
    return run(args...);
  }
  // The call when fused eager does not record it.
  static at::Tensor run(Args... args) {
    static const bool widened = widens(Op::name);
    try {
      KernelArguments arguments;  // strict mode: the memory of the host views made here
      Scan scan;
      (scan.add(args), ...);
      const auto device = scan.check(Op::name, Op::overload_name);
      Lender views;
      return deviceResult(cpuKernel<Op>(device, views.arg(args)...), device);
    } catch (const c10::NotImplementedError&) {
      if (!widened) throw;
    }
    return throughWidening<Op, at::Tensor, Args...>(args...);
  }
};

// out= variants and in-place ops (the out tensor, or `self`, is their only non-const Tensor&
// argument; it must be on the device, as in the fallback): the CPU kernel writes through an alias
// of `out`, and whatever it did to the alias (a resize, new strides) is made true of `out`
// afterwards. An input on out's storage gets an alias over the same CPU storage (the same alias
// when it is `out` itself), so the CPU kernel's overlap checks see what the device sees.
class OutAlias {
 public:
  explicit OutAlias(at::Tensor& out) : out_(out), alias_(hostView(out)) {}

  at::Tensor& arg(at::Tensor&) { return alias_; }
  at::Tensor arg(const at::Tensor& t) {
    if (!t.defined() || t.device().type() != kNeuron) return t;
    if (t.unsafeGetTensorImpl() == out_.unsafeGetTensorImpl()) return alias_;
    if (t.storage().unsafeGetStorageImpl() == out_.storage().unsafeGetStorageImpl())
      return hostViewSharing(t, alias_.storage());
    return hostView(t);
  }
  std::optional<at::Tensor> arg(const std::optional<at::Tensor>& t) {
    if (!t.has_value()) return t;
    return arg(*t);
  }
  template <class T>
  const T& arg(const T& value) { return value; }

  at::Tensor& finish() {
    updateFromHostView(out_, alias_);
    return out_;
  }

 private:
  at::Tensor& out_;
  at::Tensor alias_;
};

template <class... Args>
at::Tensor& outArgument(Args&... args) {
  at::Tensor* out = nullptr;
  auto pick = [&](auto& a) {
    if constexpr (std::is_same_v<std::remove_reference_t<decltype(a)>, at::Tensor>) out = &a;
  };
  (pick(args), ...);
  return *out;
}

// Ops returning several fresh tensors (a gradient output_mask leaves out is undefined).
template <class Op, class... Outs, class... Args>
struct Fast<Op, std::tuple<Outs...>(Args...)> {
  static_assert((std::is_same_v<Outs, at::Tensor> && ...), "only ops returning tensors");
  static std::tuple<Outs...> call(Args... args) {
    if (recordingOps()) return throughFallback<Op, std::tuple<Outs...>, Args...>(args...);
    KernelArguments arguments;  // strict mode: the memory of the host views made here
    Scan scan;
    (scan.add(args), ...);
    const auto device = scan.check(Op::name, Op::overload_name);
    Lender views;
    auto outs = cpuKernel<Op>(device, views.arg(args)...);
    return std::apply(
        [&](auto&... t) { return std::tuple<Outs...>(deviceResult(std::move(t), device)...); },
        outs);
  }
};

template <class Op, class... Args>
struct Fast<Op, at::Tensor&(Args...)> {
  static at::Tensor& call(Args... args) {
    if (recordingOps()) {
      at::Tensor& out = outArgument<Args...>(args...);
      throughFallback<Op, at::Tensor, Args...>(args...);
      return out;
    }
    return run(args...);
  }
  // The call when fused eager does not record it.
  static at::Tensor& run(Args... args) {
    KernelArguments arguments;  // strict mode: the memory of the host views made here
    Scan scan;
    (scan.add(args), ...);
    const auto device = scan.check(Op::name, Op::overload_name);
    OutAlias out(outArgument<Args...>(args...));
    cpuKernel<Op>(device, out.arg(args)...);
    return out.finish();
  }
};

// ---- structured kernels on device memory ---------------------------------------------------------
//
// The commonest elementwise ops run as PyTorch's structured kernels run on CUDA: the op's meta
// function builds its TensorIterator over the neuron tensors themselves, the result is allocated on
// the device, and the DispatchStub the op's impl calls reaches its PrivateUse1 kernel (DeviceStub),
// which launches the stub's CPU kernel over device memory. No host view, no second dispatch, no
// result to adopt: the op costs what it costs on the CPU. TensorIterator casts inputs to the common
// dtype only on the CPU, so an op takes this path only when its tensors are neuron tensors of one
// dtype on one device (floating point, for ops that compute in it); anything else runs through
// Fast<Op>. Only ops whose CPU impl does nothing but call stubs with the iterator's device (no
// branch on the device, no hard-coded kCPU) are listed; tests/test_structured_ops.py checks that
// each launches its kernel.

// The device allocation of a structured kernel's output, as the CPU's create_out allocates it.
at::Tensor emptyOnDevice(c10::IntArrayRef sizes, c10::IntArrayRef strides, const at::TensorOptions& options) {
  c10::Allocator* allocator = allocatorFor(options.device().index());
  constexpr c10::DispatchKeySet keys(c10::DispatchKey::PrivateUse1);
  if (strides.empty())
    return at::detail::empty_generic(sizes, allocator, keys, options.dtype().toScalarType(),
                                     options.memory_format_opt());
  return at::detail::empty_strided_generic(sizes, strides, allocator, keys, options.dtype().toScalarType());
}

// A structured kernel class whose output is a new device tensor (the functional variant).
template <class Kernel>
struct Functional final : Kernel {
  void set_output_strided(int64_t i, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                          at::TensorOptions options) override {
    set(i, sizes, strides, options);
  }
  void set_output_raw_strided(int64_t i, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                              at::TensorOptions options) override {
    set(i, sizes, strides, options);
  }
  const at::Tensor& maybe_get_output(int64_t) override { return output; }
  at::Tensor output;

 private:
  void set(int64_t i, c10::IntArrayRef sizes, c10::IntArrayRef strides, const at::TensorOptions& options) {
    output = emptyOnDevice(sizes, strides, options);
    if constexpr (std::is_base_of_v<at::TensorIteratorBase, Kernel>)
      Kernel::set_output_raw_strided(i, sizes, strides, options);
  }
};

// A TensorIterator kernel class writing into `self` (the in-place variant). The iterator checks
// what an in-place op needs (the broadcast shape, overlap, the dtype it may write).
template <class Kernel>
struct InPlace final : Kernel {
  static_assert(std::is_base_of_v<at::TensorIteratorBase, Kernel>, "in-place: TensorIterator kernels only");
  explicit InPlace(const at::Tensor& self) : output(self) {}
  void set_output_strided(int64_t i, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                          at::TensorOptions options) override {
    set_output_raw_strided(i, sizes, strides, options);
  }
  void set_output_raw_strided(int64_t i, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                              at::TensorOptions options) override {
    TORCH_CHECK(sizes == output.sizes(), "Bad in-place call: input tensor size ", output.sizes(),
                " and output tensor size ", sizes, " should match");
    Kernel::set_output_raw_strided(i, sizes, strides, options);
  }
  const at::Tensor& maybe_get_output(int64_t) override { return output; }
  const at::Tensor& output;
};

// The dtypes a structured op takes on the device: any; floating point only (the op promotes an
// integer input, which TensorIterator does only on the CPU); or all but bfloat16 and float16 (the
// CPU's impl takes another path for those: sum's float32 accumulation buffer). Or tensors of
// several dtypes, for a CPU function that handles them itself (an index beside the values, layer
// norm's float32 weight beside a bfloat16 input).
enum class Takes { AnyDtype, FloatingPoint, FullPrecision, MixedDtypes };

// Whether an op's tensor arguments allow the structured path: defined neuron tensors of one dtype on
// one device, of a dtype the op `Takes`, and at most one 0-dim CPU tensor (a Python number) that
// does not change the result's dtype and is not a bool (which some metas refuse). That one is handed
// to the kernel in the tensors' dtype, as the CPU's TensorIterator would cast it (only for float32,
// float64, int64 and int32: the reduced-precision kernels read a scalar's original value).
class Uniform {
 public:
  explicit Uniform(Takes takes) : takes_(takes) {}
  void add(const at::Tensor& t) {
    if (!ok_) return;
    if (!t.defined()) {
      ok_ = false;
    } else if (t.device().type() != kNeuron) {
      ok_ = t.dim() == 0 && t.device().is_cpu() && scalar_ == nullptr;
      scalar_ = &t;
    } else if (dtype_ == c10::ScalarType::Undefined) {
      dtype_ = t.scalar_type();
      device_ = t.device().index();
      ok_ = takes_ == Takes::FloatingPoint   ? c10::isFloatingType(dtype_)
            : takes_ == Takes::FullPrecision ? !c10::isReducedFloatingType(dtype_)
                                             : true;
    } else {
      ok_ = (takes_ == Takes::MixedDtypes || t.scalar_type() == dtype_) && t.device().index() == device_;
    }
  }
  // An optional tensor counts when it holds one.
  void add(const std::optional<at::Tensor>& t) {
    if (t.has_value() && t->defined()) add(*t);
  }
  // A result dtype asked for (sum's dtype=).
  void add(const std::optional<c10::ScalarType>& dtype) {
    if (dtype.has_value() && takes_ == Takes::FullPrecision && c10::isReducedFloatingType(*dtype)) ok_ = false;
  }
  template <class T>
  void add(const T&) {}
  // Whether the op may take the path; makes the scalar's copy in the tensors' dtype.
  bool ok() {
    if (!ok_ || dtype_ == c10::ScalarType::Undefined) return false;
    if (scalar_ == nullptr) return true;
    const auto from = scalar_->scalar_type();
    if (from == c10::ScalarType::Bool) return false;  // metas refuse some ops with one (sub): keep it
    const void* value = scalar_->const_data_ptr();
    switch (dtype_) {
      case c10::ScalarType::Float: return convert<float>(from, value, !c10::isComplexType(from));
      case c10::ScalarType::Double: return convert<double>(from, value, !c10::isComplexType(from));
      case c10::ScalarType::Long: return convert<int64_t>(from, value, c10::isIntegralType(from, true));
      case c10::ScalarType::Int: return convert<int32_t>(from, value, c10::isIntegralType(from, true));
      default: return false;
    }
  }
  // The tensors' device (once ok()), and whether a CPU scalar came with them.
  c10::DeviceIndex device() const { return device_; }
  bool hasScalar() const { return scalar_ != nullptr; }
  // An argument as the kernel takes it.
  const at::Tensor& pass(const at::Tensor& t) const { return &t == scalar_ ? converted_ : t; }
  template <class T>
  const T& pass(const T& value) const { return value; }

 private:
  template <class T>
  bool convert(c10::ScalarType from, const void* value, bool keeps_dtype) {
    if (!keeps_dtype) return false;
    converted_ = at::detail::empty_cpu({}, c10::CppTypeToScalarType<T>::value, std::nullopt, std::nullopt,
                                       std::nullopt, std::nullopt);
    *converted_.mutable_data_ptr<T>() = c10::fetch_and_cast<T>(from, value);
    return true;
  }
  Takes takes_;
  bool ok_ = true;
  c10::ScalarType dtype_ = c10::ScalarType::Undefined;
  c10::DeviceIndex device_ = -1;
  const at::Tensor* scalar_ = nullptr;
  at::Tensor converted_;
};

// Kernel: the op's CPU structured class (at::native::structured_*); Dtypes: what it takes here.
template <class Op, class Kernel, Takes Dtypes, class Schema = typename Op::schema>
struct Structured;
template <class Op, class Kernel, Takes Dtypes, class... Args>
struct Structured<Op, Kernel, Dtypes, at::Tensor(Args...)> {
  static at::Tensor call(Args... args) {
    if (recordingOps()) return Fast<Op>::call(args...);  // fused eager records it
    Uniform uniform(Dtypes);
    (uniform.add(args), ...);
    if (!uniform.ok()) return Fast<Op>::run(args...);
    try {
      KernelNameScope name(kKernelName<Op>);
      Functional<Kernel> op;
      op.meta(uniform.pass(args)...);
      op.impl(uniform.pass(args)..., op.output);
      return std::move(op.output);
    } catch (const c10::NotImplementedError&) {  // the CPU kernel lacks the dtype (raised before writing)
    }
    return Fast<Op>::run(args...);  // which widens the dtype, or raises the CPU's error again
  }
};
template <class Op, class Kernel, Takes Dtypes, class... Rest>
struct Structured<Op, Kernel, Dtypes, at::Tensor&(at::Tensor&, Rest...)> {
  static at::Tensor& call(at::Tensor& self, Rest... rest) {
    if (recordingOps()) return Fast<Op>::call(self, rest...);  // fused eager records it
    Uniform uniform(Dtypes);
    uniform.add(self);
    (uniform.add(rest), ...);
    if (self.device().type() != kNeuron || !uniform.ok()) return Fast<Op>::run(self, rest...);
    KernelNameScope name(kKernelName<Op>);
    InPlace<Kernel> op(self);
    op.meta(self, uniform.pass(rest)...);
    op.impl(self, uniform.pass(rest)..., self);  // (no in-place op of the widening table is listed)
    return self;
  }
};

// CPU functions that call their kernels themselves run on device memory as a whole, inside the op's
// launch: matrix products (addmm_impl_cpu_ calls BLAS on the tensors' pointers), the softmaxes and
// cat (their impls call their stubs with kCPU, or copy_stub with the iterator's device, which runs
// inline there), layer norm, SDPA's CPU kernels, index_select and embedding's backward. Structured
// ones (LaunchedStructured, catOnDevice) get their result allocated on the device by their meta; the
// others (LaunchedNative) allocate theirs with the input's options, which are the device's. What such
// a function dispatches inside (addmm's copy of its input, the clone of an operand of unusual strides,
// a zero_) runs as nested work of that launch, as it would inside the CPU's kernel. Only functions
// whose code has no other dependence on the device are listed (gelu takes oneDNN only for a CPU
// tensor, mean sums then divides only on the CPU: those stay on host views); each is compared with
// the CPU bit for bit in tests/test_structured_ops.py. They take neuron tensors of one device and no
// CPU tensor, and only their functional variants are listed.

template <class Op, class Kernel, class Schema = typename Op::schema>
struct LaunchedStructured;
template <class Op, class Kernel, class... Args>
struct LaunchedStructured<Op, Kernel, at::Tensor(Args...)> {
  static at::Tensor call(Args... args) {
    if (recordingOps()) return Fast<Op>::call(args...);  // fused eager records it
    Uniform uniform(Takes::AnyDtype);
    (uniform.add(args), ...);
    if (!uniform.ok() || uniform.hasScalar()) return Fast<Op>::run(args...);
    try {
      Functional<Kernel> op;
      op.meta(args...);
      launchWith(uniform.device(), kKernelName<Op>, [&] { op.impl(args..., op.output); }, args..., op.output);
      return std::move(op.output);
    } catch (const c10::NotImplementedError&) {  // the CPU kernel lacks the dtype (raised before writing)
    }
    return Fast<Op>::run(args...);  // which widens the dtype, or raises the CPU's error again
  }
};

// cat's meta returns what its impl takes besides the tensors (the dimension, the first tensor not
// skipped, whether the tensors share a layout and a dtype).
at::Tensor catOnDevice(const at::ITensorListRef& tensors, int64_t dim) {
  using Op = at::_ops::cat;
  if (recordingOps()) return Fast<Op>::call(tensors, dim);  // fused eager records it
  Uniform uniform(Takes::AnyDtype);
  for (const at::Tensor& t : tensors) uniform.add(t);
  if (!uniform.ok() || uniform.hasScalar()) return Fast<Op>::run(tensors, dim);
  Functional<at::native::structured_cat_out_cpu> op;
  const auto pre = op.meta(tensors, dim);
  launchWith(uniform.device(), kKernelName<Op>, [&] {
    op.impl(tensors, pre.dim, pre.valid, pre.all_contiguous, pre.all_same_dtype, pre.all_same_sizes_and_stride,
            pre.memory_format, op.output);
  }, tensors, op.output);
  return std::move(op.output);
}

// The CPU function's arguments from the op's (symbolic sizes are concrete on this device).
inline c10::IntArrayRef concrete(c10::SymIntArrayRef sizes) { return C10_AS_INTARRAYREF_SLOW(sizes); }
inline int64_t concrete(const c10::SymInt& size) { return size.expect_int(); }
template <class T>
const T& concrete(const T& value) { return value; }

// Fn: the CPU function, in any dtypes (it handles a mix itself: an index beside the values, layer
// norm's float32 weight beside a bfloat16 input).
template <class Op, auto Fn, class Schema = typename Op::schema>
struct LaunchedNative;
template <class Op, auto Fn, class R, class... Args>
struct LaunchedNative<Op, Fn, R(Args...)> {
  static R call(Args... args) {
    if (recordingOps()) return Fast<Op>::call(args...);  // fused eager records it
    Uniform uniform(Takes::MixedDtypes);
    (uniform.add(args), ...);
    if (!uniform.ok() || uniform.hasScalar()) return Fast<Op>::call(args...);
    try {
      return launchWith(uniform.device(), kKernelName<Op>, [&]() -> R { return Fn(concrete(args)...); }, args...);
    } catch (const c10::NotImplementedError&) {  // the CPU kernel lacks the dtype (raised before writing)
    }
    return Fast<Op>::call(args...);  // which widens the dtype, or raises the CPU's error again
  }
};

// relu is clamp_min(self, 0) on the CPU (its kernel calls at::clamp_min), here without the second
// dispatch.
at::Tensor relu(const at::Tensor& self) {
  if (recordingOps()) return Fast<at::_ops::relu>::call(self);
  Uniform uniform(Takes::AnyDtype);
  uniform.add(self);
  if (self.scalar_type() == c10::ScalarType::Bool || !uniform.ok()) return Fast<at::_ops::relu>::run(self);
  KernelNameScope name("relu");
  Functional<at::native::structured_clamp_min_out> op;
  op.meta(self, 0);
  op.impl(self, 0, op.output);
  return std::move(op.output);
}
at::Tensor& relu_(at::Tensor& self) {
  if (recordingOps()) return Fast<at::_ops::relu_>::call(self);
  Uniform uniform(Takes::AnyDtype);
  uniform.add(self);
  if (self.scalar_type() == c10::ScalarType::Bool || !uniform.ok()) return Fast<at::_ops::relu_>::run(self);
  KernelNameScope name("relu_");
  InPlace<at::native::structured_clamp_min_out> op(self);
  op.meta(self, 0);
  op.impl(self, 0, self);
  return self;
}

// sum of all elements is sum over no dimensions, as its generic kernel says, without the second
// dispatch.
at::Tensor sum(const at::Tensor& self, std::optional<c10::ScalarType> dtype) {
  if (recordingOps()) return Fast<at::_ops::sum>::call(self, dtype);
  Uniform uniform(Takes::FullPrecision);
  uniform.add(self);
  uniform.add(dtype);
  if (!uniform.ok()) return Fast<at::_ops::sum>::run(self, dtype);
  try {
    KernelNameScope name("sum");
    const at::OptionalIntArrayRef all = c10::IntArrayRef{};
    Functional<at::native::structured_sum_out> op;
    op.meta(self, all, false, dtype);
    op.impl(self, all, false, dtype, op.output);
    return std::move(op.output);
  } catch (const c10::NotImplementedError&) {  // the CPU kernel lacks the dtype (raised before writing)
  }
  return Fast<at::_ops::sum>::run(self, dtype);  // which widens the dtype, or raises the CPU's error again
}

// The PrivateUse1 kernel of a DispatchStub over a TensorIterator: the stub's CPU kernel, launched on
// the iterator's device as a kernel named after the op that reached it (KernelNameScope), else after
// the stub. Reached from inside a running kernel (an op a CPU kernel dispatches, as a reduction's
// kernel zeroes its result with fill_), it runs as part of that kernel.
template <auto& Stub, class Fn = typename std::remove_reference_t<decltype(Stub)>::FnPtr>
struct DeviceStub;
template <auto& Stub, class Iterator, class... A>
struct DeviceStub<Stub, void (*)(Iterator&, A...)> {
  static_assert(std::is_base_of_v<at::TensorIteratorBase, Iterator>, "a stub over a TensorIterator");
  static inline const char* name = nullptr;
  static void run(Iterator& iter, A... a) {
    // The CPU kernel reads every input as the common dtype (only the CPU's iterator casts them).
    for (int i = iter.noutputs(); i < iter.ntensors(); ++i)
      TORCH_INTERNAL_ASSERT(iter.dtype(i) == iter.dtype(iter.noutputs()) &&
                                (!iter.device(i).is_cpu() || iter.tensor_base(i).dim() == 0),
                            "neuron: the ", name, " kernel was reached with inputs it cannot read");
    if (rt::insideKernel()) return Stub(c10::DeviceType::CPU, iter, a...);  // a nested op: part of that kernel
    std::optional<KernelArguments> arguments;  // strict mode: the memory of the iterator's tensors
    if (rt::strictMode()) {
      arguments.emplace();
      for (int i = 0; i < iter.ntensors(); ++i)
        if (!iter.device(i).is_cpu()) arguments->add(iter.tensor_base(i).storage());
    }
    const char* op = KernelNameScope::current();
    launch(iter.device().index(), {rt::ActivityKind::Kernel, op != nullptr ? op : name},
           [&] { Stub(c10::DeviceType::CPU, iter, a...); });
  }
  static void install(const char* kernel_name) {
    name = kernel_name;
    Stub.set_privateuse1_dispatch_ptr(&run);
  }
};

std::string qualifiedName(const char* name, const char* overload) {
  return overload[0] ? std::string(name) + "." + overload : std::string(name);
}

#define NEURON_FAST(op) \
  m.impl(qualifiedName(at::_ops::op::name, at::_ops::op::overload_name).c_str(), TORCH_FN(Fast<at::_ops::op>::call));

#if TORCHNEURON_CPU_STUBS
// An op run as a structured kernel (`kernel`: its CPU class; `takes`: the dtypes it takes, Takes).
#define NEURON_STRUCTURED(op, kernel, takes) \
  m.impl(qualifiedName(at::_ops::op::name, at::_ops::op::overload_name).c_str(), \
         TORCH_FN((Structured<at::_ops::op, at::native::kernel, Takes::takes>::call)));
// One whose impl runs inside its launch (matrix products, softmaxes): LaunchedStructured.
#define NEURON_LAUNCHED(op, kernel) \
  m.impl(qualifiedName(at::_ops::op::name, at::_ops::op::overload_name).c_str(), \
         TORCH_FN((LaunchedStructured<at::_ops::op, at::native::kernel>::call)));
// A CPU function that is not structured, run whole inside its launch: LaunchedNative.
#define NEURON_LAUNCHED_NATIVE(op, fn) \
  m.impl(qualifiedName(at::_ops::op::name, at::_ops::op::overload_name).c_str(), \
         TORCH_FN((LaunchedNative<at::_ops::op, &at::native::fn>::call)));
// One written out here (relu, sum): `fn`.
#define NEURON_STRUCTURED_FN(op, fn) \
  m.impl(qualifiedName(at::_ops::op::name, at::_ops::op::overload_name).c_str(), TORCH_FN(fn));
// A stub that those kernels call.
#define NEURON_STUB(stub, name) DeviceStub<at::native::stub>::install(name);
#else  // a stub's CPU kernel cannot be called from here (dispatch_stub.h): every op through Fast<Op>
#define NEURON_STRUCTURED(op, kernel, takes) NEURON_FAST(op)
#define NEURON_STRUCTURED_FN(op, fn) NEURON_FAST(op)
#define NEURON_LAUNCHED(op, kernel) NEURON_FAST(op)
#define NEURON_LAUNCHED_NATIVE(op, fn) NEURON_FAST(op)
#define NEURON_STUB(stub, name)
#endif

}  // namespace

// Registered before the fallback's explicit registrations (preferCpuKernels), which leave ops that
// have a kernel alone. Asynchronous mode runs these ops through the boxed fallback, which queues
// them (deferred.cpp), so they are not registered there.
void registerFastOps() {
  if (rt::asyncMode()) return;
  static torch::Library* library = nullptr;
  if (library != nullptr) return;
  // The PrivateUse1 kernels of the stubs that the structured ops below reach.
  NEURON_STUB(add_stub, "add") NEURON_STUB(mul_stub, "mul") NEURON_STUB(div_true_stub, "div")
  NEURON_STUB(div_trunc_stub, "div_trunc") NEURON_STUB(div_floor_stub, "div_floor")
  NEURON_STUB(maximum_stub, "maximum") NEURON_STUB(minimum_stub, "minimum")
  NEURON_STUB(pow_tensor_tensor_stub, "pow") NEURON_STUB(pow_tensor_scalar_stub, "pow")
  NEURON_STUB(lerp_kernel_scalar_weight, "lerp") NEURON_STUB(addcmul_stub, "addcmul")
  NEURON_STUB(addcdiv_stub, "addcdiv")
  NEURON_STUB(eq_stub, "eq") NEURON_STUB(ne_stub, "ne") NEURON_STUB(lt_stub, "lt") NEURON_STUB(le_stub, "le")
  NEURON_STUB(gt_stub, "gt") NEURON_STUB(ge_stub, "ge")
  NEURON_STUB(neg_stub, "neg") NEURON_STUB(exp_stub, "exp") NEURON_STUB(log_stub, "log")
  NEURON_STUB(sqrt_stub, "sqrt") NEURON_STUB(rsqrt_stub, "rsqrt") NEURON_STUB(reciprocal_stub, "reciprocal")
  NEURON_STUB(sin_stub, "sin") NEURON_STUB(cos_stub, "cos") NEURON_STUB(tanh_stub, "tanh")
  NEURON_STUB(sigmoid_stub, "sigmoid") NEURON_STUB(erf_stub, "erf")
  NEURON_STUB(clamp_min_scalar_stub, "clamp_min") NEURON_STUB(silu_stub, "silu")
  NEURON_STUB(silu_backward_stub, "silu_backward") NEURON_STUB(threshold_stub, "threshold")
  NEURON_STUB(sigmoid_backward_stub, "sigmoid_backward") NEURON_STUB(tanh_backward_stub, "tanh_backward")
  NEURON_STUB(leaky_relu_stub, "leaky_relu") NEURON_STUB(elu_stub, "elu") NEURON_STUB(softplus_stub, "softplus")
  NEURON_STUB(max_values_stub, "amax") NEURON_STUB(min_values_stub, "amin")
  NEURON_STUB(sum_stub, "sum") NEURON_STUB(fill_stub, "fill")  // fill_ and zero_ (fill.cpp)
  // The copies of CPU functions run on device memory (index_select of a strided tensor copies its
  // slices with copy_stub of the iterator's device); PyTorch's copy_ never reaches it for neuron
  // (copy_impl sends those copies to _copy_from).
  NEURON_STUB(copy_stub, "copy")
  library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  auto& m = *library;
  // elementwise arithmetic
  NEURON_STRUCTURED(add_Tensor, structured_ufunc_add_CPU, AnyDtype) NEURON_FAST(add_Scalar)
  NEURON_STRUCTURED(sub_Tensor, structured_sub_out, AnyDtype) NEURON_FAST(sub_Scalar)
  NEURON_STRUCTURED(mul_Tensor, structured_mul_out, AnyDtype) NEURON_FAST(mul_Scalar)
  NEURON_STRUCTURED(div_Tensor, structured_div_out, FloatingPoint) NEURON_FAST(div_Scalar)
  NEURON_STRUCTURED(div_Tensor_mode, structured_div_out_mode, FloatingPoint)
  NEURON_STRUCTURED(pow_Tensor_Scalar, structured_pow_Tensor_Scalar_out, AnyDtype)
  NEURON_STRUCTURED(pow_Tensor_Tensor, structured_pow_Tensor_Tensor_out, AnyDtype)
  NEURON_STRUCTURED(maximum, structured_maximum_out, AnyDtype) NEURON_STRUCTURED(minimum, structured_minimum_out, AnyDtype)
  NEURON_FAST(where_self) NEURON_STRUCTURED(lerp_Scalar, structured_lerp_Scalar, FloatingPoint)
  NEURON_STRUCTURED(addcmul, structured_addcmul_out, AnyDtype) NEURON_STRUCTURED(addcdiv, structured_addcdiv_out, FloatingPoint)
  NEURON_FAST(masked_fill_Scalar) NEURON_FAST(clamp) NEURON_STRUCTURED(clamp_min, structured_clamp_min_out, AnyDtype)
  // comparisons
  // (a Scalar overload's meta wraps the scalar itself, uncast: those run through Fast)
  NEURON_STRUCTURED(eq_Tensor, structured_eq_Tensor_out, AnyDtype) NEURON_FAST(eq_Scalar)
  NEURON_STRUCTURED(ne_Tensor, structured_ne_Tensor_out, AnyDtype) NEURON_FAST(ne_Scalar)
  NEURON_STRUCTURED(lt_Tensor, structured_lt_Tensor_out, AnyDtype) NEURON_FAST(lt_Scalar)
  NEURON_STRUCTURED(le_Tensor, structured_le_Tensor_out, AnyDtype) NEURON_FAST(le_Scalar)
  NEURON_STRUCTURED(gt_Tensor, structured_gt_Tensor_out, AnyDtype) NEURON_FAST(gt_Scalar)
  NEURON_STRUCTURED(ge_Tensor, structured_ge_Tensor_out, AnyDtype) NEURON_FAST(ge_Scalar)
  NEURON_FAST(logical_not)
  // unary math and activations
  NEURON_STRUCTURED(neg, structured_neg_out, AnyDtype) NEURON_FAST(abs)
  NEURON_STRUCTURED(exp, structured_exp_out, FloatingPoint) NEURON_STRUCTURED(log, structured_log_out, FloatingPoint)
  NEURON_STRUCTURED(sqrt, structured_sqrt_out, FloatingPoint) NEURON_STRUCTURED(rsqrt, structured_rsqrt_out, FloatingPoint)
  NEURON_STRUCTURED(reciprocal, structured_reciprocal_out, FloatingPoint)
  NEURON_STRUCTURED(sin, structured_sin_out, FloatingPoint) NEURON_STRUCTURED(cos, structured_cos_out, FloatingPoint)
  NEURON_STRUCTURED(tanh, structured_tanh_out, FloatingPoint) NEURON_STRUCTURED(sigmoid, structured_sigmoid_out, FloatingPoint)
  NEURON_STRUCTURED(erf, structured_erf_out, FloatingPoint) NEURON_STRUCTURED(silu, structured_silu_out, FloatingPoint)
  NEURON_STRUCTURED(leaky_relu, structured_leaky_relu_out, FloatingPoint) NEURON_STRUCTURED(elu, structured_elu_out, FloatingPoint)
  NEURON_STRUCTURED(softplus, structured_softplus_out, FloatingPoint)
  NEURON_STRUCTURED_FN(relu, relu) NEURON_STRUCTURED_FN(relu_, relu_)
  NEURON_FAST(gelu)  // (its CPU impl calls the CPU's kernel itself, or oneDNN's)
  // their gradients
  NEURON_STRUCTURED(threshold_backward, structured_threshold_backward_out, AnyDtype) NEURON_FAST(gelu_backward)
  NEURON_STRUCTURED(silu_backward, structured_silu_backward_out, FloatingPoint)
  NEURON_STRUCTURED(sigmoid_backward, structured_sigmoid_backward_out, FloatingPoint)
  NEURON_STRUCTURED(tanh_backward, structured_tanh_backward_out, FloatingPoint)
  // matrix products
  NEURON_LAUNCHED(mm, structured_mm_out_cpu) NEURON_FAST(bmm) NEURON_LAUNCHED(addmm, structured_addmm_out_cpu)
  NEURON_FAST(baddbmm)
  // reductions and normalizations
  NEURON_STRUCTURED(sum_dim_IntList, structured_sum_out, FullPrecision) NEURON_STRUCTURED_FN(sum, sum)
  NEURON_FAST(mean_dim)  // (the CPU's impl is sum, then div_: another path than the stub's)
  NEURON_STRUCTURED(amax, structured_amax_out, AnyDtype) NEURON_STRUCTURED(amin, structured_amin_out, AnyDtype)
  NEURON_LAUNCHED(_softmax, structured_softmax_cpu_out) NEURON_LAUNCHED(_log_softmax, structured_log_softmax_cpu_out)
  NEURON_LAUNCHED(_softmax_backward_data, structured_softmax_backward_cpu_out)
  NEURON_LAUNCHED(_log_softmax_backward_data, structured_log_softmax_backward_cpu_out)
  NEURON_LAUNCHED_NATIVE(native_layer_norm, layer_norm_cpu)
  NEURON_LAUNCHED_NATIVE(native_layer_norm_backward, layer_norm_backward_cpu)
  // indexing and embeddings
  NEURON_LAUNCHED_NATIVE(index_select, index_select_cpu_) NEURON_FAST(gather)
  NEURON_LAUNCHED_NATIVE(embedding_dense_backward, embedding_dense_backward_cpu) NEURON_STRUCTURED_FN(cat, catOnDevice)
  // attention (scaled_dot_product_attention's CPU kernels) and losses
  NEURON_LAUNCHED_NATIVE(_scaled_dot_product_flash_attention_for_cpu, _scaled_dot_product_flash_attention_cpu)
  NEURON_LAUNCHED_NATIVE(_scaled_dot_product_flash_attention_for_cpu_backward,
                         _scaled_dot_product_flash_attention_cpu_backward)
  NEURON_FAST(nll_loss_forward) NEURON_FAST(nll_loss_backward)
  // masks and scans
  NEURON_FAST(isneginf) NEURON_FAST(all) NEURON_FAST(all_dim) NEURON_FAST(cumsum)
  // in-place arithmetic (autograd accumulates gradients with add_); none of the widening table,
  // whose in-place ops go through the boxed fallback's widening
  NEURON_STRUCTURED(add__Tensor, structured_ufunc_add_CPU, AnyDtype) NEURON_FAST(add__Scalar)
  NEURON_STRUCTURED(sub__Tensor, structured_sub_out, AnyDtype) NEURON_STRUCTURED(mul__Tensor, structured_mul_out, AnyDtype)
  NEURON_STRUCTURED(div__Tensor, structured_div_out, FloatingPoint)
  NEURON_FAST(mul__Scalar) NEURON_FAST(masked_fill__Scalar)
  // out= variants: Inductor's compiled graphs call them for matrix products; arange and
  // where(condition) are empty plus these
  NEURON_FAST(mm_out) NEURON_FAST(bmm_out) NEURON_FAST(addmm_out) NEURON_FAST(baddbmm_out)
  NEURON_FAST(arange_start_out) NEURON_FAST(where_self_out)
}

}  // namespace torchneuron
