// The emulator's one assumption above the runtime: device memory is host-addressable
// (host_addressable.cpp). Every host view of device memory is made here; nothing else above the
// runtime builds a CPU tensor or storage over device memory.
//
// A port to silicon replaces three things: the runtime (csrc/runtime/, behind neuron_runtime.h),
// this unit, and the kernel library under csrc/aten, whose kernels are PyTorch's CPU kernels run on
// host views (fallback.cpp, fast_ops.cpp, kernels.cpp, the sparse, nested and quantized paths, which
// assemble their CPU tensors from the host views made here), or over the device tensors themselves
// (fast_ops.cpp's structured kernels: their DispatchStubs' PrivateUse1 kernels launch the CPU's, the
// same assumption made by the stub instead of a host view; and its launched CPU functions, matrix
// products, normalizations, softmaxes, attention, embeddings and cat, which read the device tensors'
// pointers inside their launch), and which a port replaces with the
// device's own kernels. Nothing above aten changes (docs/runtime.md, "What a port replaces").
// Further host code that reads device memory inside a launch, and so goes with the kernel library:
// the C++ kernels torch.compile generates (torchneuron/compile/inductor.py), NKI's host harness, and
// vLLM's catch-all CPU ops (torchneuron/vllm/kernels.py), all run through _C._launch.
//
// The assumption is made in three places, all here:
// - host views: a CPU tensor over a neuron tensor's device memory, what a CPU kernel runs on inside
//   a launch (and, held, what gloo's threads read and write during a collective);
// - the CPU allocator's redirection: while a CPU kernel runs for a device (DeviceOutputScope), the
//   buffers it allocates are blocks of that device's caching allocator, so its results are device
//   memory when it returns;
// - device results: a neuron tensor made from what a CPU kernel returned, its buffer taken over when
//   it is device memory already or the kernel's alone to give, else copied.
#pragma once

#include "device.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>
#include <c10/core/StorageImpl.h>

#include <cstdint>
#include <forward_list>
#include <optional>

namespace torchneuron {

// Two ideas, one name each (docs/runtime.md, "The zero-copy path"):
//
// A host view is a CPU tensor over a neuron tensor's device memory (same sizes, strides, offset,
// dtype, conj/neg bits): what a CPU kernel runs on inside a launch.
//
// A device result is a neuron tensor made from what a CPU kernel returned: its buffer is taken
// over when it is device memory already or the kernel's alone to give, else copied.

// The host view of `neuron`, which must outlive it. Valid inside a launch (kernel, copy).
at::Tensor hostView(const at::Tensor& neuron);
// A host view over an existing host view's storage, for a second tensor on the same device
// storage: one op's arguments that share memory on the device share it on the CPU too, so
// PyTorch's overlap checks see it.
at::Tensor hostViewSharing(const at::Tensor& neuron, const c10::Storage& host_storage);
// A host view that holds the device memory alive and cannot be resized, for work that keeps it
// past the call that made it. `open`: in strict mode its memory stays reachable to every thread
// while the view lives (a collective in flight: gloo's threads reach it); else only inside the
// launches that reach it (a CPU autograd graph kept between its forward and backward launches).
at::Tensor hostViewHolding(const at::Tensor& neuron, bool open);
// A tensor of dispatch key `key` (CPU: a host view; PrivateUse1: a neuron tensor; Meta: a stand-in)
// over `storage`, with the sizes, strides, offset, dtype and conjugate and negative bits of `like`.
at::Tensor tensorOver(c10::Storage storage, c10::DispatchKey key, const at::Tensor& like);
// The same for a quantized tensor (PyTorch's QTensorImpl; QuantizedCPU: a quantized host view,
// QuantizedPrivateUse1: a quantized neuron tensor) with `quantizer`.
at::Tensor quantizedTensorOver(c10::Storage storage, c10::DispatchKey key, const at::Tensor& like,
                               at::QuantizerPtr quantizer);
// A quantized CPU tensor over a quantized neuron tensor's memory, over `host_storage` (a host
// view's storage: hostStorageOf, or a host view's of the same storage), with the same quantizer,
// its per-channel parameters copied to the host (quantized.cpp). Made before the launch; valid inside it.
at::Tensor quantizedHostView(const at::Tensor& neuron, c10::Storage host_storage);
// A quantized neuron tensor over `storage` with the sizes, strides, offset and quantizer of the
// quantized CPU tensor `like` (its per-channel parameters copied to `device`).
at::Tensor quantizedDeviceTensorOver(c10::Storage storage, const at::Tensor& like, c10::DeviceIndex device);
// A CPU storage over a neuron tensor's device memory that does not own it, for host views that
// work queued on a stream keeps (hostViewSharing over it): the device memory is referred to by
// address, as a real kernel's arguments are.
c10::Storage hostStorageOf(const at::Tensor& neuron);
// An argument as a CPU kernel takes it: the host view of a neuron tensor, anything else as it is.
inline at::Tensor hostArgument(const at::Tensor& t) {
  return t.defined() && t.device().type() == kNeuron ? hostView(t) : t;
}
inline std::optional<at::Tensor> hostArgument(const std::optional<at::Tensor>& t) {
  return t.has_value() ? std::optional<at::Tensor>(hostArgument(*t)) : t;
}
template <class T>
const T& hostArgument(const T& value) { return value; }

// Host views lent for one kernel call (fast_ops.cpp): a pooled host view is lent by reference, so
// the call changes no reference count, and it is lent to nothing else until the lease ends. A view
// the kernel kept (a result over its memory) is not reused while that lives. Leases nest.
class HostViewLease {
 public:
  HostViewLease() noexcept;
  ~HostViewLease();
  HostViewLease(const HostViewLease&) = delete;
  HostViewLease& operator=(const HostViewLease&) = delete;
  // An argument as a CPU kernel takes it: the host view of a neuron tensor, anything else as it is.
  const at::Tensor& arg(const at::Tensor& t) { return t.defined() && t.device().type() == kNeuron ? lend(t) : t; }
  std::optional<at::Tensor> arg(const std::optional<at::Tensor>& t) {
    return t.has_value() ? std::optional<at::Tensor>(arg(*t)) : t;
  }
  template <class T>
  const T& arg(const T& value) { return value; }

 private:
  const at::Tensor& lend(const at::Tensor& neuron);
  uint32_t previous_;                  // the thread's pooled views lent before this lease
  std::forward_list<at::Tensor> own_;  // views made when every pooled one is lent or held
};

// The device result of a dense CPU tensor on `device` (an undefined tensor stays undefined).
// When nothing else refers to `cpu`, its TensorImpl is reused.
at::Tensor deviceResult(at::Tensor cpu, c10::DeviceIndex device);
// The same, one step at a time: a device storage from a CPU storage's buffer (taken, or copied
// when it is not the kernel's to give), one holding a copy, and a neuron tensor over a device
// storage with the metadata of `like`.
c10::Storage deviceStorage(c10::StorageImpl* host_storage, c10::DeviceIndex device);
c10::Storage deviceStorageCopy(const c10::StorageImpl* host_storage, c10::DeviceIndex device);
at::Tensor deviceTensorOver(c10::Storage storage, const at::Tensor& like);
// Turns a CPU tensor that nothing else references into a neuron tensor over `storage` (same
// sizes, strides and offset), reusing its TensorImpl.
at::Tensor deviceTensorReusing(at::Tensor cpu, c10::Storage storage);
// Makes `neuron` reflect what a kernel did to its host view: new sizes, strides, offset, or a new
// buffer after a resize.
void updateFromHostView(const at::Tensor& neuron, const at::Tensor& view);

// While alive, buffers that CPU kernels on this thread allocate through the CPU allocator are
// blocks of `device`'s caching allocator (seen as host memory): the kernels' results need no
// adoption and no copy. Scopes nest; -1 turns the redirection off.
class DeviceOutputScope {
 public:
  explicit DeviceOutputScope(c10::DeviceIndex device);
  ~DeviceOutputScope();
  DeviceOutputScope(const DeviceOutputScope&) = delete;
  DeviceOutputScope& operator=(const DeviceOutputScope&) = delete;

 private:
  c10::DeviceIndex previous_;
};

}  // namespace torchneuron
