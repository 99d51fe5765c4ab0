// The emulator's one assumption above the runtime, that device memory is host-addressable, made in
// its three places (host_addressable.h): host views, the CPU allocator's redirection, device results.
#include "host_addressable.h"

#include "allocator.h"
#include "held_work.h"
#include "launch.h"
#include "quantized.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/impl/COW.h>
#include <ATen/core/TensorBase.h>
#include <ATen/Utils.h>
#include <ATen/quantized/QTensorImpl.h>
#include <ATen/quantized/Quantizer.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace torchneuron {
namespace {

// ---- the CPU allocator's redirection -------------------------------------------------------------
//
// The process's CPU allocator, wrapped: while a thread runs a CPU kernel for the device, the
// kernel's buffers (its results, its temporaries, oneDNN's scratchpads) are device blocks from
// the caching allocator, seen as host memory; everything else goes to the allocator it wraps.
// A result is then device memory already when the kernel returns, with no malloc, page faults
// or copy: the storage only changes hands (takeHostBuffer). Blocks are handed out like the wrapped
// allocator's memory (context = address), so raw_allocate/raw_deallocate work on both.

// The device a CPU kernel on this thread computes results for (DeviceOutputScope), or -1.
thread_local c10::DeviceIndex t_output_device = -1;

// Device blocks handed to CPU kernels, by address. Never destroyed: a storage freed during the
// process's exit still finds its block, and no block is given back to the allocator then.
//
// A kernel has few such blocks at a time (its result, some temporaries), each taken back soon after
// by takeDeviceBlock or deleteHostBuffer, so they go in a small table that needs no lock: an entry's
// address is claimed and released with compare-and-swap (kClaimed in between). A block finds a free
// entry among the kProbes after its home, else it goes to the map under g_blocks_mutex.
struct HandedBlock {
  std::atomic<void*> ptr{nullptr};  // nullptr: free
  void* context = nullptr;          // the block's DataPtr, taken apart
  c10::DeleterFnPtr deleter = nullptr;
  c10::DeviceIndex device = -1;
};
constexpr size_t kHandedSize = 64;
constexpr size_t kProbes = 8;
void* const kClaimed = reinterpret_cast<void*>(uintptr_t{1});
HandedBlock g_handed[kHandedSize];
std::mutex& g_blocks_mutex = *new std::mutex();
std::unordered_map<void*, c10::DataPtr>& g_blocks = *new std::unordered_map<void*, c10::DataPtr>();
c10::DeleterFnPtr g_base_raw_deleter = nullptr;

size_t homeOf(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) >> 9) % kHandedSize; }

void handOut(void* ptr, c10::DataPtr block) {
  for (size_t n = 0, i = homeOf(ptr); n < kProbes; ++n, i = (i + 1) % kHandedSize) {
    HandedBlock& e = g_handed[i];
    void* expected = nullptr;
    if (e.ptr.load(std::memory_order_relaxed) != nullptr ||
        !e.ptr.compare_exchange_strong(expected, kClaimed, std::memory_order_acquire)) continue;
    e.deleter = block.get_deleter();
    e.device = block.device().index();
    e.context = block.release_context();
    e.ptr.store(ptr, std::memory_order_release);
    return;
  }
  std::lock_guard<std::mutex> lock(g_blocks_mutex);
  g_blocks.emplace(ptr, std::move(block));
}

// Takes the block handed out at `ptr` back, if there is one (of `device`, unless it is -1).
std::optional<c10::DataPtr> takeHandedBack(void* ptr, c10::DeviceIndex device) {
  if (ptr == nullptr || ptr == kClaimed) return std::nullopt;  // never a block (a free entry's address)
  for (size_t n = 0, i = homeOf(ptr); n < kProbes; ++n, i = (i + 1) % kHandedSize) {
    HandedBlock& e = g_handed[i];
    void* expected = ptr;
    if (e.ptr.load(std::memory_order_relaxed) != ptr ||
        !e.ptr.compare_exchange_strong(expected, kClaimed, std::memory_order_acquire)) continue;
    if (device >= 0 && e.device != device) {
      e.ptr.store(ptr, std::memory_order_release);
      return std::nullopt;
    }
    c10::DataPtr block(ptr, e.context, e.deleter, c10::Device(kNeuron, e.device));
    e.ptr.store(nullptr, std::memory_order_release);
    return block;
  }
  std::lock_guard<std::mutex> lock(g_blocks_mutex);
  auto it = g_blocks.find(ptr);
  if (it == g_blocks.end() || (device >= 0 && it->second.device().index() != device)) return std::nullopt;
  c10::DataPtr block = std::move(it->second);
  g_blocks.erase(it);
  return block;
}

// The deleter of CPU allocations: a device block goes back to the caching allocator, anything
// else (a raw_deallocate of the wrapped allocator's memory) to the wrapped allocator.
void deleteHostBuffer(void* ptr) {
  if (takeHandedBack(ptr, -1)) return;  // released by the block going out of scope, outside any lock
  TORCH_INTERNAL_ASSERT(g_base_raw_deleter != nullptr, "neuron: a CPU allocation of unknown origin was freed");
  g_base_raw_deleter(ptr);
}

class CpuAllocator final : public c10::Allocator {
 public:
  explicit CpuAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex device = t_output_device;
    if (device < 0) return base_->allocate(nbytes);
    c10::DataPtr block = allocateOn(device, nbytes);
    void* ptr = block.get();
    handOut(ptr, std::move(block));
    return {ptr, ptr, &deleteHostBuffer, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return g_base_raw_deleter != nullptr ? &deleteHostBuffer : nullptr;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    base_->copy_data(dest, src, count);
  }

 private:
  c10::Allocator* base_;
};

struct Registration {
  Registration() {
    c10::Allocator* base = c10::GetCPUAllocator();
    g_base_raw_deleter = base->raw_deleter();
    static CpuAllocator cpu(base);
    c10::SetCPUAllocator(&cpu, /*priority=*/1);
  }
} registration;

// When a CPU storage holds a block of `device`'s caching allocator (allocated in a DeviceOutputScope),
// takes it out of the storage as the device memory it is; otherwise nothing.
std::optional<c10::DataPtr> takeDeviceBlock(c10::StorageImpl* storage, c10::DeviceIndex device) {
  const c10::DataPtr& view = storage->data_ptr();
  if (view.get_deleter() != &deleteHostBuffer || view.get_context() != view.get()) return std::nullopt;
  auto block = takeHandedBack(view.get(), device);
  if (!block) return std::nullopt;
  // The storage lets go of the block without running its deleter: it belongs to the result now.
  storage->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::kCPU))).release_context();
  return std::move(*block);
}

// ---- device results ------------------------------------------------------------------------------

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

DeviceOutputScope::DeviceOutputScope(c10::DeviceIndex device) : previous_(t_output_device) {
  t_output_device = device;
}

DeviceOutputScope::~DeviceOutputScope() { t_output_device = previous_; }

// ---- host views: the device memory a kernel reaches ---------------------------------------------- ----------------------------------------------------------

namespace {

// A host view of `neuron`'s memory is being made: strict mode opens that memory for the launch it
// is made in, else for the launch it is gathered for.
void reached(const at::Tensor& neuron) {
  static const bool strict = rt::strictMode();  // fixed at start-up
  if (!strict) return;
  const auto& storage = neuron.storage();
  rt::deviceAccessAdd(storage.data(), storage.nbytes());
  if (KernelArguments* arguments = KernelArguments::current()) arguments->add(storage);
}
}  // namespace

at::Tensor tensorOver(c10::Storage storage, c10::DispatchKey key, const at::Tensor& like) {
  auto out = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(key), like.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  if (like.is_conj()) out._set_conj(true);
  if (like.is_neg()) out._set_neg(true);
  return out;
}

at::Tensor quantizedTensorOver(c10::Storage storage, c10::DispatchKey key, const at::Tensor& like,
                               at::QuantizerPtr quantizer) {
  auto out = at::detail::make_tensor<at::QTensorImpl>(std::move(storage), c10::DispatchKeySet(key), like.dtype(),
                                                      std::move(quantizer));
  out.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  return out;
}

at::Tensor quantizedHostView(const at::Tensor& neuron, c10::Storage host_storage) {
  return quantizedTensorOver(std::move(host_storage), c10::DispatchKey::QuantizedCPU, neuron,
                             quantizerOn(at::get_qtensorimpl(neuron)->quantizer(), c10::Device(c10::kCPU)));
}

at::Tensor quantizedDeviceTensorOver(c10::Storage storage, const at::Tensor& like, c10::DeviceIndex device) {
  return quantizedTensorOver(std::move(storage), c10::DispatchKey::QuantizedPrivateUse1, like,
                             quantizerOn(at::get_qtensorimpl(like)->quantizer(), c10::Device(kNeuron, device)));
}

namespace {

// CPU aliases are made for every argument of every op, so each thread keeps a few and reuses one
// as soon as nothing but the pool holds it and no lease has it lent (bit i of t_lent: slot i).
constexpr size_t kPoolSize = 8;
thread_local std::array<at::Tensor, kPoolSize> alias_pool;
thread_local uint32_t t_lent = 0;

// Points a pooled alias at `neuron`, writing only what differs from what it showed last: an op's
// arguments tend to come back with the same dtype, sizes and strides, and setting sizes and strides
// recomputes the alias's contiguity flags.
void pointAt(const at::Tensor& alias, const at::Tensor& neuron) {
  const auto& storage = neuron.storage();
  auto* s = alias.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(c10::DataPtr(const_cast<void*>(storage.data()), c10::Device(c10::kCPU)));
  s->set_nbytes(storage.nbytes());
  auto* impl = alias.unsafeGetTensorImpl();
  const auto* from = neuron.unsafeGetTensorImpl();
  if (impl->dtype() != from->dtype()) impl->set_storage_and_dtype(alias.storage(), from->dtype());
  if (impl->sizes() != from->sizes() || impl->strides() != from->strides()) {
    impl->set_sizes_and_strides(from->sizes(), from->strides(), from->storage_offset());
  } else if (impl->storage_offset() != from->storage_offset()) {
    impl->set_storage_offset(from->storage_offset());
  }
  if (impl->is_conj() != from->is_conj()) impl->_set_conj(from->is_conj());
  if (impl->is_neg() != from->is_neg()) impl->_set_neg(from->is_neg());
}

at::Tensor newAlias(const at::Tensor& neuron) {
  const auto& storage = neuron.storage();
  auto impl = c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), storage.nbytes(),
      c10::DataPtr(const_cast<void*>(storage.data()), c10::Device(c10::kCPU)),
      c10::GetCPUAllocator(), /*resizable=*/true);
  return tensorOver(c10::Storage(std::move(impl)), c10::DispatchKey::CPU, neuron);
}

// The pooled alias pointed at `neuron`: a free one reused, else a new one in an empty slot; or none
// (every slot lent or held). Sets `slot` to the one used.
at::Tensor* pooledAlias(const at::Tensor& neuron, size_t* slot) {
  auto& pool = alias_pool;
  const uint32_t lent = t_lent;
  size_t empty = kPoolSize;
  for (size_t i = 0; i < kPoolSize; ++i) {
    at::Tensor& alias = pool[i];
    if ((lent >> i) & 1u) continue;
    if (!alias.defined()) {
      if (empty == kPoolSize) empty = i;
    } else if (alias.use_count() == 1 && alias.storage().use_count() == 1) {
      pointAt(alias, neuron);
      *slot = i;
      return &alias;
    }
  }
  if (empty == kPoolSize) return nullptr;
  pool[empty] = newAlias(neuron);
  *slot = empty;
  return &pool[empty];
}

}  // namespace

at::Tensor hostViewSharing(const at::Tensor& neuron, const c10::Storage& cpu_storage) {
  reached(neuron);
  return tensorOver(cpu_storage, c10::DispatchKey::CPU, neuron);
}

at::Tensor hostView(const at::Tensor& neuron) {
  reached(neuron);
  size_t slot = 0;
  if (at::Tensor* alias = pooledAlias(neuron, &slot)) return *alias;
  return newAlias(neuron);
}

HostViewLease::HostViewLease() noexcept : previous_(t_lent) {}
HostViewLease::~HostViewLease() { t_lent = previous_; }

const at::Tensor& HostViewLease::lend(const at::Tensor& neuron) {
  reached(neuron);
  size_t slot = 0;
  if (at::Tensor* alias = pooledAlias(neuron, &slot)) {
    t_lent |= 1u << slot;
    return *alias;
  }
  own_.push_front(newAlias(neuron));
  return own_.front();
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
    // Nothing else refers to either: the storage and the TensorImpl become the device's in place.
    storage->set_data_ptr_noswap(takeHostBuffer(storage, device));
    storage->set_allocator(deviceAllocator());
    storage->set_resizable(true);
    auto* impl = cpu.unsafeGetTensorImpl();
    impl->set_storage_keep_dtype(cpu.storage());  // its device
    impl->_change_backend_component_keys(c10::Device(kNeuron, device));
    return cpu;
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
