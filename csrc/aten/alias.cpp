// The zero-copy path: neuron memory seen as CPU tensors, and CPU kernel
// outputs handed over to a device without copying.
#include "neuron.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/impl/COW.h>
#include <ATen/core/TensorBase.h>
#include <ATen/Utils.h>

#include <array>

namespace torchneuron {
namespace {

// Copies the buffer of a CPU storage into new device memory of `device`; the storage keeps its own.
c10::DataPtr copyHostBuffer(const c10::StorageImpl* storage, c10::DeviceIndex device) {
  const size_t nbytes = storage->nbytes();
  c10::DataPtr fresh = allocateOn(device, nbytes);
  if (nbytes > 0) runtime::copyMemory(fresh.get(), storage->data(), nbytes, rt::CopyKind::HostToDevice);
  return fresh;
}

c10::DataPtr takeHostBuffer(c10::StorageImpl* storage, c10::DeviceIndex device) {
  const size_t nbytes = storage->nbytes();
  const auto& current = storage->data_ptr();
  if (auto block = takeDeviceBlock(storage, device)) return std::move(*block);  // device memory already
  const bool owned = current.get_context() != nullptr && !c10::impl::cow::is_cow_data_ptr(current);
  // Not ours to take, or strict or asynchronous mode (where device memory is only the runtime's,
  // and queued work may refer to a block after the host frees it): copy instead.
  if (!owned || rt::asyncMode() || rt::strictMode()) return copyHostBuffer(storage, device);
  c10::DataPtr host = storage->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::kCPU)));
  return deviceBlockFromHostBuffer(std::move(host), nbytes, device);
}

}  // namespace

// ---- the device memory a kernel reaches ----------------------------------------------------------

namespace {
thread_local KernelArguments* t_arguments = nullptr;

// A host view of `neuron`'s memory is being made: strict mode opens that memory for the launch it
// is made in, else for the launch it is gathered for.
void reached(const at::Tensor& neuron) {
  if (!rt::strictMode()) return;
  const auto& storage = neuron.storage();
  rt::deviceAccessAdd(storage.data(), storage.nbytes());
  if (t_arguments != nullptr) t_arguments->add(storage);
}
}  // namespace

KernelArguments::KernelArguments() : previous_(t_arguments) { t_arguments = this; }
KernelArguments::~KernelArguments() { t_arguments = previous_; }
KernelArguments* KernelArguments::current() { return t_arguments; }
void KernelArguments::add(const c10::Storage& neuron) {
  if (rt::strictMode() && neuron.nbytes() > 0) ranges_.push_back({neuron.data(), neuron.nbytes()});
}

at::Tensor tensorOver(c10::Storage storage, c10::DispatchKey key, const at::Tensor& like) {
  auto out = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(key), like.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  if (like.is_conj()) out._set_conj(true);
  if (like.is_neg()) out._set_neg(true);
  return out;
}

// CPU aliases are made for every argument of every op, so each thread keeps
// a few and reuses one as soon as nothing but the pool holds it.
constexpr size_t kPoolSize = 8;
thread_local std::array<at::Tensor, kPoolSize> alias_pool;

void pointAt(const at::Tensor& alias, const at::Tensor& neuron) {
  const auto& storage = neuron.storage();
  auto* s = alias.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(c10::DataPtr(const_cast<void*>(storage.data()), c10::Device(c10::kCPU)));
  s->set_nbytes(storage.nbytes());
  auto* impl = alias.unsafeGetTensorImpl();
  impl->set_storage_and_dtype(alias.storage(), neuron.dtype());
  impl->set_sizes_and_strides(neuron.sizes(), neuron.strides(), neuron.storage_offset());
  impl->_set_conj(neuron.is_conj());
  impl->_set_neg(neuron.is_neg());
}

at::Tensor hostViewSharing(const at::Tensor& neuron, const c10::Storage& cpu_storage) {
  reached(neuron);
  return tensorOver(cpu_storage, c10::DispatchKey::CPU, neuron);
}

at::Tensor hostView(const at::Tensor& neuron) {
  reached(neuron);
  at::Tensor* empty_slot = nullptr;
  for (auto& slot : alias_pool) {
    if (!slot.defined()) {
      empty_slot = &slot;
    } else if (slot.use_count() == 1 && slot.storage().use_count() == 1) {
      pointAt(slot, neuron);
      return slot;
    }
  }
  const auto& storage = neuron.storage();
  auto impl = c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), storage.nbytes(),
      c10::DataPtr(const_cast<void*>(storage.data()), c10::Device(c10::kCPU)),
      c10::GetCPUAllocator(), /*resizable=*/true);
  at::Tensor alias = tensorOver(c10::Storage(std::move(impl)), c10::DispatchKey::CPU, neuron);
  if (empty_slot != nullptr) *empty_slot = alias;
  return alias;
}

c10::Storage hostStorageOf(const at::Tensor& neuron) {
  reached(neuron);
  const auto& storage = neuron.storage();
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), storage.nbytes(),
      c10::DataPtr(const_cast<void*>(storage.data()), c10::Device(c10::kCPU)), nullptr, /*resizable=*/false));
}

at::Tensor hostViewHolding(const at::Tensor& neuron, bool open) {
  TORCH_CHECK(neuron.device().type() == kNeuron, "expected a neuron tensor, got one on ", neuron.device());
  const auto& storage = neuron.storage();
  // The CPU storage keeps the device storage alive for as long as it lives, and (`open`, in
  // strict mode) that memory reachable: whoever holds the view (gloo's threads, through sockets
  // too) may touch it until they let it go.
  struct Held {
    c10::Storage storage;
    std::optional<rt::DeviceAccess> access;
  };
  auto* keep = new Held{storage, std::nullopt};
  const rt::MemoryRange range{storage.data(), storage.nbytes()};
  if (open) keep->access.emplace(&range, 1, rt::DeviceAccess::NoThread);
  else reached(neuron);
  c10::DataPtr ptr(const_cast<void*>(storage.data()), keep,
                   [](void* ctx) { delete static_cast<Held*>(ctx); }, c10::Device(c10::kCPU));
  auto impl = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), storage.nbytes(),
                                                    std::move(ptr), nullptr, /*resizable=*/false);
  return tensorOver(c10::Storage(std::move(impl)), c10::DispatchKey::CPU, neuron);
}

c10::Storage deviceStorageCopy(const c10::StorageImpl* cpu_storage, c10::DeviceIndex device) {
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(),
      cpu_storage->nbytes(), copyHostBuffer(cpu_storage, device), deviceAllocator(), /*resizable=*/true));
}

at::Tensor deviceTensorOver(c10::Storage storage, const at::Tensor& like) {
  return tensorOver(std::move(storage), c10::DispatchKey::PrivateUse1, like);
}

c10::Storage deviceStorage(c10::StorageImpl* cpu_storage, c10::DeviceIndex device) {
  const size_t nbytes = cpu_storage->nbytes();
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), nbytes, takeHostBuffer(cpu_storage, device),
      deviceAllocator(), /*resizable=*/true));
}

at::Tensor deviceResult(at::Tensor cpu, c10::DeviceIndex device) {
  if (!cpu.defined()) return cpu;
  TORCH_CHECK_NOT_IMPLEMENTED(cpu.layout() == c10::kStrided && !cpu.is_nested(),
      "tensors of layout ", cpu.layout(), " are not supported on neuron; only dense (torch.strided) "
      "tensors are. Convert with .to_dense() first.");
  auto* storage = cpu.storage().unsafeGetStorageImpl();
  if (cpu.use_count() == 1 && cpu.storage().use_count() == 1 && !c10::isQIntType(cpu.scalar_type())) {
    c10::Storage device_storage = deviceStorage(storage, device);
    return deviceTensorReusing(std::move(cpu), std::move(device_storage));
  }
  return deviceTensorOver(deviceStorage(storage, device), cpu);
}

at::Tensor deviceTensorReusing(at::Tensor cpu, c10::Storage storage) {
  auto* impl = cpu.unsafeGetTensorImpl();
  const auto device = storage.device();
  impl->set_storage_keep_dtype(std::move(storage));
  impl->_change_backend_component_keys(device);
  return cpu;
}

void updateFromHostView(const at::Tensor& neuron, const at::Tensor& alias) {
  auto* nstorage = neuron.storage().unsafeGetStorageImpl();
  auto* astorage = alias.storage().unsafeGetStorageImpl();
  if (astorage->data() != nstorage->data() || astorage->nbytes() != nstorage->nbytes()) {
    // The kernel resized the buffer (an out= argument, resize_ and the like).
    const size_t nbytes = astorage->nbytes();
    nstorage->set_data_ptr_noswap(takeHostBuffer(astorage, neuron.device().index()));
    nstorage->set_nbytes(nbytes);
    // Other aliases may share this CPU storage: keep it pointing at the device buffer.
    astorage->set_data_ptr_noswap(c10::DataPtr(nstorage->mutable_data(), c10::Device(c10::kCPU)));
  }
  auto* n = neuron.unsafeGetTensorImpl();
  auto* a = alias.unsafeGetTensorImpl();
  if (n->sizes() != a->sizes() || n->strides() != a->strides() ||
      n->storage_offset() != a->storage_offset()) {
    n->set_sizes_and_strides(a->sizes(), a->strides(), a->storage_offset());
  }
  // Kernels may mark an out= tensor as a conjugate or negative view.
  if (n->is_conj() != a->is_conj()) n->_set_conj(a->is_conj());
  if (n->is_neg() != a->is_neg()) n->_set_neg(a->is_neg());
}

}  // namespace torchneuron
