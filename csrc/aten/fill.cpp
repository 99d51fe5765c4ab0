// Zero-filling device memory through the runtime's memset, as CUDA's zero_ is a cudaMemset.
//
// zero_ and fill_ with a zero value (and so torch.zeros, zeros_like, new_zeros, which are empty plus
// zero_) over a dense range of device memory of kRuntimeFillBytes or more set it with rt::memset,
// which hands the range's whole pages back to the host instead of writing them: a large zeroed
// tensor costs host memory only where it is written later, as on a device whose memory is not the
// host's. Everything else runs the CPU's fill kernel over the device memory (the fill DispatchStub's
// PrivateUse1 kernel, fast_ops.cpp), or, for what that cannot take (ops fused eager records,
// asynchronous mode, quantized, conjugate or negative views), through the boxed fallback.
#include "dispatch_stub.h"  // first: it declares DispatchStub as PyTorch's build does
#include "fallback.h"
#include "launch.h"

#include <ATen/Dispatch_v2.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/fill_native.h>
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
// `self` is a plain device tensor (plainDeviceTensor) that fused eager does not record.
bool fillZeroThroughRuntime(const at::Tensor& self) {
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

// aten::fill_.Scalar through the boxed fallback.
at::Tensor& fillThroughFallback(at::Tensor& self, const c10::Scalar& value) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::fill_", "Scalar");
  torch::jit::Stack stack{self, value};
  neuronFallback(op, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), &stack);
  return self;
}

// A dense device tensor of PyTorch's plain kind (not quantized, nested, conjugate or negative).
bool plainDeviceTensor(const at::Tensor& self) {
  return self.defined() && self.device().type() == kNeuron && self.layout() == c10::kStrided &&
         !self.is_quantized() && !self.is_nested() && !self.is_conj() && !self.is_neg() && self.has_storage();
}

// What the CPU does for a one-element tensor (at::detail::scalar_fill, which libtorch does not
// export): the value, converted, written through the data pointer.
void fillOne(const at::Tensor& self, const c10::Scalar& value) {
  AT_DISPATCH_V2(self.scalar_type(), "fill_out", AT_WRAP([&]() {
    *static_cast<scalar_t*>(self.data_ptr()) = value.to<scalar_t>();
  }), c10::kComplexHalf, c10::kHalf, c10::kBool, c10::kBFloat16, AT_EXPAND(AT_ALL_TYPES_AND_COMPLEX),
      AT_EXPAND(AT_FLOAT8_TYPES), AT_EXPAND(AT_BAREBONES_UNSIGNED_TYPES));
}

// Fills `self` with `value`, launching as `name`.
at::Tensor& fillAs(at::Tensor& self, const c10::Scalar& value, const char* name) {
  // Recorded by fused eager, or another kind of tensor: the fallback (which asks fused eager again).
  if (!plainDeviceTensor(self) || recordingOps()) return fillThroughFallback(self, value);
  if (zeroBits(value, self.scalar_type()) && fillZeroThroughRuntime(self)) return self;
  // Queued by the fallback (asynchronous mode), or the fill stub has no device kernel (fast_ops.cpp)
  if (rt::asyncMode() || !TORCHNEURON_CPU_STUBS) return fillThroughFallback(self, value);
  if (self.numel() == 1) {  // the CPU's shortcut (a reduction's kernel zeroes its one-element result so)
    if (rt::insideKernel()) {  // part of the running kernel
      fillOne(self, value);
      return self;
    }
    launchWith(self.device().index(), name, [&] { fillOne(self, value); }, self);  // strict mode: self's memory
    return self;
  }
  KernelNameScope scope(name);
  return at::native::fill_(self, value);  // the CPU's kernel, launched by the fill stub's device kernel
}

// aten::fill_.Scalar(Tensor(a!) self, Scalar value) -> Tensor(a!)
at::Tensor& fill(at::Tensor& self, const c10::Scalar& value) { return fillAs(self, value, "fill_"); }

// aten::zero_(Tensor(a!) self) -> Tensor(a!)
at::Tensor& zero(at::Tensor& self) { return fillAs(self, 0, "zero_"); }

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("zero_", TORCH_FN(zero));
  m.impl("fill_.Scalar", TORCH_FN(fill));
}

}  // namespace torchneuron
