// Quantized tensors on the device (quantized.cpp): PyTorch's QTensorImpl under the
// QuantizedPrivateUse1 key, its integers in device memory, its quantizer's parameters (per-channel
// scales and zero points) neuron tensors, as CUDA's are CUDA tensors.
#pragma once

#include "host_addressable.h"  // quantized host views (quantizedHostView) and device tensors

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace torchneuron {

// The quantizer `q` with its parameter tensors on `device` (a quantizer without tensors as it is).
at::QuantizerPtr quantizerOn(const at::QuantizerPtr& q, c10::Device device);

}  // namespace torchneuron
