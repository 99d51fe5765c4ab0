// Zero-filling device memory through the runtime's memset, as CUDA's zero_ is a cudaMemset.
//
// zero_ and fill_ with a zero value (and so torch.zeros, zeros_like, new_zeros, which are empty plus
// zero_) over a dense range of device memory of kRuntimeFillBytes or more set it with rt::memset,
// which hands the range's whole pages back to the host instead of writing them: a large zeroed
// tensor costs host memory only where it is written later, as on a device whose memory is not the
// host's. Everything else (small or strided tensors, other values, ops fused eager records) runs the
// CPU's kernel through the boxed fallback, as before.
#include "fallback.h"
#include "launch.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/complex.h>
#include <torch/library.h>

#include <cmath>

namespace torchneuron {
namespace {

// Below this a range is filled by the CPU's kernel (a memset either way, without the launch of one).
constexpr size_t kRuntimeFillBytes = size_t(1) << 20;

// Whether filling a tensor of `dtype` with `value` writes bytes of zero.
bool zeroBits(const c10::Scalar& value, c10::ScalarType dtype) {
  if (value.isSymbolic()) return false;
  if (dtype == c10::ScalarType::Float8_e8m0fnu) return false;  // no zero: its zero bits are 2^-127
  if (value.isBoolean()) return !value.toBool();
  if (value.isIntegral(/*includeBool=*/false)) return value.isUnsigned() ? value.toUInt64() == 0 : value.toLong() == 0;
  if (value.isFloatingPoint()) {
    const double v = value.toDouble();
    return v == 0 && !std::signbit(v);  // -0.0 has its sign bit set
  }
  if (value.isComplex()) {
    const auto v = value.toComplexDouble();
    return v.real() == 0 && !std::signbit(v.real()) && v.imag() == 0 && !std::signbit(v.imag()) &&
           c10::isComplexType(dtype);  // a complex value into a real tensor: the CPU kernel's checks
  }
  return false;
}

// Sets `self` to zero through the runtime when it is one dense range of device memory big enough.
bool fillZeroThroughRuntime(const at::Tensor& self) {
  if (!self.defined() || self.device().type() != kNeuron || self.layout() != c10::kStrided || self.is_quantized() ||
      self.is_nested() || self.is_conj() || self.is_neg() || !self.has_storage())
    return false;
  if (recordingOps()) return false;  // recorded through the fallback like every op
  const size_t nbytes = static_cast<size_t>(self.numel()) * self.itemsize();
  if (nbytes < kRuntimeFillBytes || !self.is_non_overlapping_and_dense()) return false;
  void* ptr = self.data_ptr();  // a dense tensor covers [ptr, ptr + nbytes) exactly
  const rt::MemoryRange range{ptr, nbytes};
  rt::LaunchInfo info{rt::ActivityKind::Memset, "Memset (Device)", static_cast<uint64_t>(nbytes), &range, 1};
  const auto device = self.device().index();
  // Device memory is referred to by address, as a real kernel's is: the caching allocator hands a
  // freed block out again only after the work queued before on its stream.
  enqueue(device, info, [ptr, nbytes, device] {
    const auto status = rt::memset(ptr, 0, nbytes);
    if (status != rt::Status::Success) failLaunch(status, device, "Memset (Device)");
  });
  return true;
}

// aten::zero_(Tensor(a!) self) -> Tensor(a!)
void zeroKernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const at::Tensor& self = (*stack)[stack->size() - 1].toTensor();
  if (!fillZeroThroughRuntime(self)) return neuronFallback(op, keys, stack);
  // The result is self, which is already on the stack.
}

// aten::fill_.Scalar(Tensor(a!) self, Scalar value) -> Tensor(a!)
void fillKernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto& value = (*stack)[stack->size() - 1];
  const at::Tensor& self = (*stack)[stack->size() - 2].toTensor();
  if (!value.isScalar() || !zeroBits(value.toScalar(), self.scalar_type()) || !fillZeroThroughRuntime(self))
    return neuronFallback(op, keys, stack);
  torch::jit::drop(*stack, 1);  // self stays as the result
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("zero_", torch::CppFunction::makeFromBoxedFunction<&zeroKernel>());
  m.impl("fill_.Scalar", torch::CppFunction::makeFromBoxedFunction<&fillKernel>());
}

}  // namespace torchneuron
