// Quantized tensors on the device (quantized.cpp): PyTorch's QTensorImpl under the
// QuantizedPrivateUse1 key, its integers in device memory, its quantizer's parameters (per-channel
// scales and zero points) neuron tensors, as CUDA's are CUDA tensors.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

namespace torchneuron {

// A quantized CPU tensor over a quantized neuron tensor's memory, over `host_storage` (a host
// view's storage), with the same quantizer, its per-channel parameters copied to the host. Made
// before the launch; valid inside it.
at::Tensor quantizedHostView(const at::Tensor& neuron, c10::Storage host_storage);
// A quantized neuron tensor over `storage` with the sizes, strides, offset and quantizer of the
// quantized CPU tensor `like` (its per-channel parameters copied to `device`).
at::Tensor quantizedDeviceTensorOver(c10::Storage storage, const at::Tensor& like, c10::DeviceIndex device);

}  // namespace torchneuron
