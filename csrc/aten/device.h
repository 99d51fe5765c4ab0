// Devices of the PyTorch integration: their number, the current one, and the errors that name one
// (guard.cpp; failDeviceMismatch in fallback.cpp).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <string>

namespace c10 {
struct OperatorName;
}  // namespace c10

namespace torchneuron {

constexpr c10::DeviceType kNeuron = c10::DeviceType::PrivateUse1;

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

}  // namespace torchneuron
