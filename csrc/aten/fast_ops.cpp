// The zero-copy path without boxing, for the most frequent ops.
//
// The boxed fallback handles every op, but packing arguments into a stack and
// unpacking them again costs more than a small op itself. For functional ops
// (fresh results, no generator), out= variants and in-place ops without a
// generator the same work is done here with the op's own C++ signature: check
// devices, alias the tensor arguments as CPU tensors, call the CPU kernel, move
// the result to the device (or reflect what the kernel did to the written one).
#include "launch.h"
#include "host_addressable.h"
#include "fallback.h"
#include "widening.h"

#include <ATen/Operators.h>
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
  return launch(device, {rt::ActivityKind::Kernel, kernelName(Op::name)}, [&]() -> decltype(auto) {
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
    KernelArguments arguments;  // strict mode: the memory of the host views made here
    Scan scan;
    (scan.add(args), ...);
    const auto device = scan.check(Op::name, Op::overload_name);
    OutAlias out(outArgument<Args...>(args...));
    cpuKernel<Op>(device, out.arg(args)...);
    return out.finish();
  }
};

std::string qualifiedName(const char* name, const char* overload) {
  return overload[0] ? std::string(name) + "." + overload : std::string(name);
}

#define NEURON_FAST(op) \
  m.impl(qualifiedName(at::_ops::op::name, at::_ops::op::overload_name).c_str(), TORCH_FN(Fast<at::_ops::op>::call));

}  // namespace

// Registered before the fallback's explicit registrations (preferCpuKernels), which leave ops that
// have a kernel alone. Asynchronous mode runs these ops through the boxed fallback, which queues
// them (deferred.cpp), so they are not registered there.
void registerFastOps() {
  if (rt::asyncMode()) return;
  static torch::Library* library = nullptr;
  if (library != nullptr) return;
  library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  auto& m = *library;
  // elementwise arithmetic
  NEURON_FAST(add_Tensor) NEURON_FAST(add_Scalar) NEURON_FAST(sub_Tensor) NEURON_FAST(sub_Scalar)
  NEURON_FAST(mul_Tensor) NEURON_FAST(mul_Scalar) NEURON_FAST(div_Tensor) NEURON_FAST(div_Scalar)
  NEURON_FAST(div_Tensor_mode) NEURON_FAST(pow_Tensor_Scalar) NEURON_FAST(pow_Tensor_Tensor)
  NEURON_FAST(maximum) NEURON_FAST(minimum) NEURON_FAST(where_self) NEURON_FAST(lerp_Scalar)
  NEURON_FAST(masked_fill_Scalar) NEURON_FAST(clamp) NEURON_FAST(clamp_min)
  // comparisons
  NEURON_FAST(eq_Tensor) NEURON_FAST(eq_Scalar) NEURON_FAST(ne_Tensor) NEURON_FAST(ne_Scalar)
  NEURON_FAST(lt_Tensor) NEURON_FAST(lt_Scalar) NEURON_FAST(le_Tensor) NEURON_FAST(le_Scalar)
  NEURON_FAST(gt_Tensor) NEURON_FAST(gt_Scalar) NEURON_FAST(ge_Tensor) NEURON_FAST(ge_Scalar)
  NEURON_FAST(logical_not)
  // unary math and activations
  NEURON_FAST(neg) NEURON_FAST(abs) NEURON_FAST(exp)
  NEURON_FAST(log) NEURON_FAST(sqrt) NEURON_FAST(rsqrt)
  NEURON_FAST(reciprocal) NEURON_FAST(sin) NEURON_FAST(cos)
  NEURON_FAST(tanh) NEURON_FAST(sigmoid) NEURON_FAST(relu)
  NEURON_FAST(gelu) NEURON_FAST(silu) NEURON_FAST(erf)
  // their gradients
  NEURON_FAST(threshold_backward) NEURON_FAST(gelu_backward)
  NEURON_FAST(silu_backward) NEURON_FAST(sigmoid_backward)
  NEURON_FAST(tanh_backward)
  // matrix products
  NEURON_FAST(mm) NEURON_FAST(bmm) NEURON_FAST(addmm)
  NEURON_FAST(baddbmm)
  // reductions and normalizations
  NEURON_FAST(sum_dim_IntList) NEURON_FAST(sum) NEURON_FAST(mean_dim)
  NEURON_FAST(amax) NEURON_FAST(amin)
  NEURON_FAST(_softmax) NEURON_FAST(_log_softmax)
  NEURON_FAST(_softmax_backward_data) NEURON_FAST(_log_softmax_backward_data)
  NEURON_FAST(native_layer_norm) NEURON_FAST(native_layer_norm_backward)
  // indexing and embeddings
  NEURON_FAST(index_select) NEURON_FAST(gather)
  NEURON_FAST(embedding_dense_backward) NEURON_FAST(cat)
  // attention (scaled_dot_product_attention's CPU kernels) and losses
  NEURON_FAST(_scaled_dot_product_flash_attention_for_cpu)
  NEURON_FAST(_scaled_dot_product_flash_attention_for_cpu_backward)
  NEURON_FAST(nll_loss_forward) NEURON_FAST(nll_loss_backward)
  // masks and scans
  NEURON_FAST(isneginf) NEURON_FAST(all) NEURON_FAST(all_dim) NEURON_FAST(cumsum)
  // in-place arithmetic (autograd accumulates gradients with add_); none of the widening table,
  // whose in-place ops go through the boxed fallback's widening
  NEURON_FAST(add__Tensor) NEURON_FAST(add__Scalar) NEURON_FAST(sub__Tensor) NEURON_FAST(mul__Tensor)
  NEURON_FAST(mul__Scalar) NEURON_FAST(masked_fill__Scalar)
  // out= variants: Inductor's compiled graphs call them for matrix products; arange and
  // where(condition) are empty plus these
  NEURON_FAST(mm_out) NEURON_FAST(bmm_out) NEURON_FAST(addmm_out) NEURON_FAST(baddbmm_out)
  NEURON_FAST(arange_start_out) NEURON_FAST(where_self_out)
}

}  // namespace torchneuron
