// Quantized tensors on the device.
//
// A quantized neuron tensor is PyTorch's QTensorImpl under the QuantizedPrivateUse1 key: its
// integers are device memory, its quantizer is PyTorch's (per-tensor parameters are numbers;
// per-channel scales and zero points are neuron tensors, as CUDA keeps them on CUDA). Ops run on
// the zero-copy path (fallback.cpp): a quantized argument becomes a quantized CPU tensor over the
// same memory with the quantizer's parameters on the host, PyTorch's QuantizedCPU kernel runs,
// and quantized results become quantized neuron tensors over device memory.
#include "quantized.h"
#include "device.h"

#include <ATen/ops/_empty_affine_quantized_native.h>
#include <ATen/ops/_empty_per_channel_affine_quantized_native.h>
#include <ATen/ops/_to_copy_native.h>
#include <ATen/ops/empty_quantized_native.h>
#include <ATen/quantized/QTensorImpl.h>
#include <ATen/quantized/Quantizer.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace torchneuron {

at::QuantizerPtr quantizerOn(const at::QuantizerPtr& q, c10::Device device) {
  switch (q->qscheme()) {
    case c10::kPerChannelAffine: {
      auto* pc = static_cast<at::PerChannelAffineQuantizer*>(q.get());
      if (pc->scales().device() == device) return q;
      return at::make_per_channel_affine_quantizer(pc->scales().to(device), pc->zero_points().to(device),
                                                   pc->axis(), pc->scalar_type());
    }
    case c10::kPerChannelAffineFloatQParams: {
      auto* pc = static_cast<at::PerChannelAffineFloatQParamsQuantizer*>(q.get());
      if (pc->scales().device() == device) return q;
      return c10::make_intrusive<at::PerChannelAffineFloatQParamsQuantizer>(
          pc->scalar_type(), pc->scales().to(device), pc->zero_points().to(device), pc->axis());
    }
    default:
      return q;
  }
}

namespace {

// The device a factory's result goes to, guarded (PyTorch allocates on the current device).
c10::Device factoryDevice(std::optional<c10::Device> device) {
  const auto index = device && device->has_index() ? device->index() : currentDevice();
  checkDevice(index);
  return c10::Device(kNeuron, index);
}

at::Tensor emptyAffineQuantized(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                                std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                                std::optional<bool> pin_memory, double scale, int64_t zero_point,
                                std::optional<c10::MemoryFormat> memory_format) {
  const auto target = factoryDevice(device);
  c10::DeviceGuard guard(target);
  return at::native::empty_affine_quantized(size, dtype, layout, target, pin_memory, scale, zero_point,
                                            memory_format);
}

at::Tensor emptyPerChannelAffineQuantized(c10::IntArrayRef size, const at::Tensor& scales,
                                          const at::Tensor& zero_points, int64_t axis,
                                          std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                                          std::optional<c10::Device> device, std::optional<bool> pin_memory,
                                          std::optional<c10::MemoryFormat> memory_format) {
  if (device && device->is_cpu())  // neuron parameters for a CPU tensor (.cpu() of a neuron one)
    return at::native::empty_per_channel_affine_quantized(size, scales.cpu(), zero_points.cpu(), axis, dtype,
                                                          layout, device, pin_memory, memory_format);
  const auto target = factoryDevice(device);
  c10::DeviceGuard guard(target);
  // The quantizer's parameters live where the tensor does, as on CUDA.
  return at::native::empty_per_channel_affine_quantized(size, scales.to(target), zero_points.to(target), axis,
                                                        dtype, layout, target, pin_memory, memory_format);
}

at::Tensor emptyQuantized(c10::IntArrayRef size, const at::Tensor& qtensor, std::optional<c10::ScalarType> dtype,
                          std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                          std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  if (device && device->is_cpu())  // .cpu() of a neuron tensor: the CPU's own
    return at::native::empty_quantized(size, qtensor, dtype, layout, device, pin_memory, memory_format);
  const auto target = device ? factoryDevice(device) : qtensor.device();
  c10::DeviceGuard guard(target);
  return at::native::empty_quantized(size, qtensor, dtype, layout, target, pin_memory, memory_format);
}

// A quantized tensor's integers as a dense tensor of its underlying type (uint8 for quint8, ...)
// over the same storage: what copies move.
at::Tensor integers(const at::Tensor& q) {
  const auto key = q.device().type() == kNeuron ? c10::DispatchKey::PrivateUse1 : c10::DispatchKey::CPU;
  auto out = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(q.storage()), c10::DispatchKeySet(key), c10::scalarTypeToTypeMeta(c10::toUnderlying(q.scalar_type())));
  out.unsafeGetTensorImpl()->set_sizes_and_strides(q.sizes(), q.strides(), q.storage_offset());
  return out;
}

// copy_ between quantized tensors, one of them on neuron: PyTorch's copy_ has checked the schemes
// and dtypes and given the destination the source's quantizer; the integers are copied as dense
// tensors (the dense copy kernels: a launch or a runtime copy).
at::Tensor copyFrom(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(self.is_quantized() && dst.is_quantized(),
              "copying between a quantized and a non-quantized tensor on neuron: quantize or dequantize first");
  TORCH_CHECK(self.scalar_type() == dst.scalar_type(), "Quantized Copy only works with same qtype and same scalar type");
  auto* impl = at::get_qtensorimpl(dst);
  impl->set_quantizer_(quantizerOn(at::get_qtensorimpl(self)->quantizer(), dst.device()));
  integers(dst).copy_(integers(self), non_blocking);
  return dst;
}

at::Tensor copyFromAndResize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) dst.resize_(self.sizes());
  return copyFrom(self, dst, false);
}

// .to(device) of a quantized tensor. PyTorch's generic kernel gives a tensor that is not dense
// (a strided slice) an empty_like(self): a tensor on self's device, whatever the target. Such a
// tensor is made contiguous on its own device first, then moved.
at::Tensor toCopy(const at::Tensor& self, std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                  std::optional<c10::Device> device, std::optional<bool> pin_memory, bool non_blocking,
                  std::optional<c10::MemoryFormat> memory_format) {
  const bool moves = device && *device != self.device();
  const at::Tensor source = moves && !self.is_non_overlapping_and_dense() ? self.contiguous() : self;
  return at::native::_to_copy(source, dtype, layout, device, pin_memory, non_blocking, memory_format);
}

}  // namespace

}  // namespace torchneuron

namespace torchneuron {

TORCH_LIBRARY_IMPL(aten, QuantizedPrivateUse1, m) {
  m.impl("_empty_affine_quantized", TORCH_FN(emptyAffineQuantized));
  m.impl("_empty_per_channel_affine_quantized", TORCH_FN(emptyPerChannelAffineQuantized));
  m.impl("empty_quantized", TORCH_FN(emptyQuantized));
  m.impl("_copy_from", TORCH_FN(copyFrom));
  m.impl("_copy_from_and_resize", TORCH_FN(copyFromAndResize));
  m.impl("_to_copy", TORCH_FN(toCopy));
}

// Factories with a quantized dtype may be selected for the dense key.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_empty_affine_quantized", TORCH_FN(emptyAffineQuantized));
  m.impl("_empty_per_channel_affine_quantized", TORCH_FN(emptyPerChannelAffineQuantized));
  m.impl("empty_quantized", TORCH_FN(emptyQuantized));
}

}  // namespace torchneuron
