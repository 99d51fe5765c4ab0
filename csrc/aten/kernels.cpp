// The basic kernels PyTorch needs from a device: allocation, views,
// resizing, storage swaps, copies and reading a scalar back.
#include "launch.h"
#include "allocator.h"
#include "host_addressable.h"
#include "transfers.h"
#include "../runtime/neuron_runtime.h"

#include <ATen/EmptyTensor.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/copy.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace torchneuron {

TransferStats& transferStats() {
  static TransferStats stats;
  return stats;
}

namespace {

void checkPinMemory(std::optional<bool> pin_memory) {
  TORCH_CHECK(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned");
}

void checkLayout(std::optional<c10::Layout> layout) {
  TORCH_CHECK_NOT_IMPLEMENTED(!layout || *layout == c10::kStrided,
      "tensors of layout ", *layout, " are not supported on neuron; only dense (torch.strided) "
      "tensors are. Create the tensor on the CPU, or use a dense layout.");
}

c10::DeviceIndex targetDevice(std::optional<c10::Device> device) {
  const auto index = device && device->has_index() ? device->index() : currentDevice();
  checkDevice(index);
  return index;
}

at::Tensor empty(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                 std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                 std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  checkLayout(layout);
  checkPinMemory(pin_memory);
  return at::detail::empty_generic(size, allocatorFor(targetDevice(device)),
                                   c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor emptyStrided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                        std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                        std::optional<bool> pin_memory) {
  checkLayout(layout);
  checkPinMemory(pin_memory);
  return at::detail::empty_strided_generic(size, stride, allocatorFor(targetDevice(device)),
      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), c10::dtype_or_default(dtype));
}

// Grows a storage so that `nbytes` fit, keeping its contents.
void ensureStorageBytes(const at::Tensor& self, size_t nbytes) {
  const auto& storage = self.storage();
  if (nbytes > storage.nbytes())
    at::detail::getPrivateUse1Hooks().resizePrivateUse1Bytes(storage, nbytes);
}

size_t requiredBytes(const at::Tensor& self) {
  if (self.numel() == 0) return 0;
  int64_t last = self.storage_offset();
  for (int64_t d = 0; d < self.dim(); ++d) last += (self.size(d) - 1) * self.stride(d);
  return static_cast<size_t>(last + 1) * self.itemsize();
}

const at::Tensor& resize(const at::Tensor& self, c10::IntArrayRef size,
                         std::optional<c10::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  if (impl->sizes() == size && !memory_format) return self;
  impl->set_sizes_contiguous(size);
  ensureStorageBytes(self, requiredBytes(self));
  if (memory_format) impl->empty_tensor_restride(*memory_format);
  return self;
}

at::Tensor& setStorage(at::Tensor& self, c10::Storage source, int64_t offset, c10::IntArrayRef size,
                       c10::IntArrayRef stride) {
  TORCH_CHECK(source.device().type() == kNeuron,
      "Expected a neuron storage for a neuron tensor, but got a storage on ", source.device());
  auto* impl = self.unsafeGetTensorImpl();
  if (!impl->storage().is_alias_of(source)) impl->set_storage_keep_dtype(std::move(source));
  impl->set_storage_offset(offset);
  if (stride.empty()) impl->set_sizes_contiguous(size);
  else impl->set_sizes_and_strides(size, stride);
  ensureStorageBytes(self, requiredBytes(self));
  return self;
}

at::Tensor& setSourceStorageOffset(at::Tensor& self, c10::Storage source, int64_t offset,
                                   c10::IntArrayRef size, c10::IntArrayRef stride) {
  return setStorage(self, std::move(source), offset, size, stride);
}

at::Tensor& setSourceStorage(at::Tensor& self, c10::Storage source) {
  const int64_t n = static_cast<int64_t>(source.nbytes() / self.itemsize());
  return setStorage(self, std::move(source), 0, {n}, {});
}

at::Tensor& setSourceTensor(at::Tensor& self, const at::Tensor& source) {
  if (self.is_same(source)) return self;
  return setStorage(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

at::Tensor& setEmpty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, allocateOn(self.device().index(), 0),
                       deviceAllocator(), /*resizable=*/true);
  return setStorage(self, std::move(storage), 0, {0}, {});
}

// Asynchronous mode: whether a copy may be queued on the stream rather than run by the host once
// the stream is idle. Between the device's own memory it may; from pinned host memory and into it
// with non_blocking=True too (the host synchronizes before it reads or reuses that memory, as
// with CUDA). Copies from or to pageable memory, and copies between two devices, are the host's.
bool queueCopy(const at::Tensor& self, const at::Tensor& dst, bool from_device, bool to_device, bool non_blocking) {
  if (!rt::asyncMode() || rt::insideKernel()) return false;  // see tnrtInsideKernel (neuron_runtime.h)
  if (from_device && to_device) {  // overlapping copies within one storage: the CPU's checks, at the op
    return self.device() == dst.device() &&
           (!self.storage().is_alias_of(dst.storage()) ||
            at::get_overlap_status(self, dst) == at::MemOverlapStatus::No);
  }
  if (!non_blocking) return false;
  return rt::isHostPinned(from_device ? dst.const_data_ptr() : self.const_data_ptr());
}

at::Tensor copyFrom(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  const bool from_device = self.device().type() == kNeuron;
  const bool to_device = dst.device().type() == kNeuron;
  TORCH_CHECK((from_device || self.device().is_cpu()) && (to_device || dst.device().is_cpu()),
      "neuron can copy to and from the CPU only, not from ", self.device(), " to ", dst.device());
  auto& stats = transferStats();
  const int64_t bytes = static_cast<int64_t>(self.numel()) * self.itemsize();
  if (from_device && to_device) {
    stats.device_to_device_bytes += bytes;
  } else if (to_device) {
    stats.host_to_device_bytes += bytes;
    stats.host_to_device_copies++;
  } else {
    stats.device_to_host_bytes += bytes;
    stats.device_to_host_copies++;
  }
  const bool queued = queueCopy(self, dst, from_device, to_device, non_blocking);
  // Strict mode: the copy reaches the memory of the views made here, and a CPU side's own (a CPU
  // kernel's result may be device memory from the caching allocator: quantized.cpp's parameters).
  KernelArguments arguments;
  if (rt::strictMode()) {
    if (!from_device) arguments.add(self.storage());
    if (!to_device) arguments.add(dst.storage());
  }
  // Source and destination on one device storage share one CPU storage, so
  // that PyTorch's overlap checks see them as the CPU would. A queued copy's
  // views own nothing, on either side: the device memory is referred to by
  // address, and the host memory is kept alive by the copy (HostReleased).
  auto view = [&](const at::Tensor& t) { return queued ? hostViewSharing(t, hostStorageOf(t)) : hostView(t); };
  if (queued && !to_device) (void)dst.storage().mutable_data();  // a lazily copied destination, materialized now
  at::Tensor cpu_dst = !to_device && !queued ? dst : view(dst);
  at::Tensor cpu_src = from_device && to_device && self.storage().is_alias_of(dst.storage())
                           ? hostViewSharing(self, cpu_dst.storage())
                       : !from_device && !queued ? self
                                                 : view(self);
  // A copy is work of the device's current stream (the source's, between devices), named as
  // CUDA's profiler names its copies. Asking whether host memory is pinned takes the runtime's
  // lock: it is only asked while activity is recorded. Its direction is in the name always (fused
  // eager tells the host's boundaries by it).
  const char* name = from_device && to_device ? "Memcpy DtoD" : to_device ? "Memcpy HtoD" : "Memcpy DtoH";
  if (rt::activityRecording()) {
    name = from_device && to_device ? "Memcpy DtoD (Device -> Device)"
           : to_device ? (rt::isHostPinned(self.const_data_ptr()) ? "Memcpy HtoD (Pinned -> Device)"
                                                                  : "Memcpy HtoD (Pageable -> Device)")
           : (rt::isHostPinned(dst.const_data_ptr()) ? "Memcpy DtoH (Device -> Pinned)"
                                                      : "Memcpy DtoH (Device -> Pageable)");
  }
  const auto device = from_device ? self.device().index() : dst.device().index();
  const rt::LaunchInfo info{rt::ActivityKind::Memcpy, name, static_cast<uint64_t>(bytes)};
  if (!(from_device && to_device)) handOverHeldWork(HostNeed::HostCopy, name);
  if (queued) {
    const bool host_side = !(from_device && to_device);
    enqueue(device, info,
            [cpu_dst, cpu_src, keep = HostReleased{host_side ? (to_device ? self : dst).storage() : c10::Storage()}] {
              cpu_dst.copy_(cpu_src);
            });
    return dst;
  }
  if (from_device && to_device && rt::asyncMode()) {  // another device's stream may still be writing dst
    const auto other = dst.device().index();
    checkRuntime(runtime::synchronizeStream(other, currentStream(other).id()), other, "a copy between devices");
  }
  // PyTorch's CPU copy_ itself: the views are the kernel's own, below every key a dispatch would pass.
  launch(device, info, [&] { at::native::copy_(cpu_dst, cpu_src, /*non_blocking=*/false); });
  return dst;
}

// copy_ between neuron tensors. PyTorch's copy_ (copy_impl) sends every copy that involves a device
// it does not know to _copy_from, and for dense tensors that are not zero tensors its only check
// before that is is_same: such copies go to copyFrom from here, one dispatch sooner. Any other copy
// (a CPU side, a zero tensor) is PyTorch's copy_.
at::Tensor& copyInPlace(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  const bool direct = self.defined() && src.defined() && self.device().type() == kNeuron &&
                      src.device().type() == kNeuron && self.layout() == c10::kStrided &&
                      src.layout() == c10::kStrided &&
                      !self._is_zerotensor() && !src._is_zerotensor() && !self.is_quantized() &&
                      !src.is_quantized();
  if (!direct) return at::native::copy_(self, src, non_blocking);
  if (!self.is_same(src)) copyFrom(src, self, non_blocking);
  return self;
}

at::Tensor copyFromAndResize(const at::Tensor& self, const at::Tensor& dst) {
  resize(dst, self.sizes(), std::nullopt);
  return copyFrom(self, dst, false);
}

c10::Scalar localScalarDense(const at::Tensor& self) {
  transferStats().scalar_reads++;
  handOverHeldWork(HostNeed::HostCopy, "Memcpy DtoH");
  return launch(self.device().index(), {rt::ActivityKind::Memcpy, "Memcpy DtoH (Device -> Pageable)", self.itemsize()},
                [&] { return at::_local_scalar_dense(hostView(self)); });
}

// Asynchronous mode: the caching allocator keeps the block from reuse by other streams until
// `stream` has passed the point where the tensor is freed.
void recordStream(at::Tensor& self, c10::Stream stream) {
  deviceAllocator()->recordStream(self.storage().data_ptr(), stream);
}

// Dense tensors of CPU and neuron may trade data in place (`param.data = t`),
// so that module.to("neuron") keeps the Parameter objects, as with CUDA.
bool hasCompatibleShallowCopyType(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && !t.is_nested() &&
           (t.device().type() == kNeuron || t.device().is_cpu());
  };
  if (dense(self) && dense(from)) return true;
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(empty));
  m.impl("empty_strided", TORCH_FN(emptyStrided));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("resize_", TORCH_FN(resize));
  m.impl("set_.source_Storage", TORCH_FN(setSourceStorage));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(setSourceStorageOffset));
  m.impl("set_.source_Tensor", TORCH_FN(setSourceTensor));
  m.impl("set_", TORCH_FN(setEmpty));
  m.impl("copy_", TORCH_FN(copyInPlace));
  m.impl("_copy_from", TORCH_FN(copyFrom));
  m.impl("_copy_from_and_resize", TORCH_FN(copyFromAndResize));
  m.impl("_local_scalar_dense", TORCH_FN(localScalarDense));
  m.impl("record_stream", TORCH_FN(recordStream));
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(hasCompatibleShallowCopyType));
}

// The copy kernels handle conjugate and negative views themselves (the CPU
// aliases carry the bits), so those keys must not resolve them first.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

}  // namespace torchneuron
