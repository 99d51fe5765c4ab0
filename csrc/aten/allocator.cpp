// The caching allocator of device memory, with PyTorch's memory statistics.
//
// Freed blocks are kept per device and size for reuse; they go back to the
// runtime on empty_cache() or when an allocation would otherwise not fit.
// CPU kernels run for the device (the zero-copy path) allocate from it too,
// through a wrapper of the CPU allocator (DeviceOutputScope); buffers they
// produce some other way are adopted: charged to the device and counted like
// any other allocation.
#include "neuron.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace torchneuron {
namespace {

using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingAllocator::StatType;

constexpr size_t kRound = 512;
constexpr size_t kSmallLimit = size_t(1) << 20;

size_t roundSize(size_t n) { return n == 0 ? kRound : (n + kRound - 1) / kRound * kRound; }

std::string formatBytes(size_t n) {
  char buf[64];
  const double v = static_cast<double>(n);
  if (n >= (size_t(1) << 30)) std::snprintf(buf, sizeof(buf), "%.2f GiB", v / (1 << 30));
  else if (n >= (size_t(1) << 20)) std::snprintf(buf, sizeof(buf), "%.2f MiB", v / (1 << 20));
  else if (n >= 1024) std::snprintf(buf, sizeof(buf), "%.2f KiB", v / 1024);
  else std::snprintf(buf, sizeof(buf), "%zu bytes", n);
  return buf;
}

struct Block {
  void* ptr = nullptr;
  size_t size = 0;        // bytes charged to the device (rounded)
  size_t requested = 0;   // bytes asked for
  c10::DeviceIndex device = 0;
  c10::DataPtr host;      // set for adopted host buffers
};

void deleteBlock(void* ctx);

class NeuronAllocator final : public c10::DeviceAllocator {
 public:
  NeuronAllocator() : devices_(rt::deviceCount()) {
    for (auto& d : devices_) d = std::make_unique<DeviceState>();
  }

  c10::DataPtr allocate(size_t nbytes) override { return allocateOn(currentDevice(), nbytes); }

  c10::DataPtr allocateOn(c10::DeviceIndex device, size_t nbytes) {
    checkDevice(device);
    auto& d = *devices_[device];
    const size_t size = roundSize(nbytes);
    Block* block = nullptr;
    {
      std::lock_guard<std::mutex> lock(d.mutex);
      // The block freed last (its memory is likeliest still in the host's caches): equal keys of
      // a multimap keep their insertion order.
      auto [first, last] = d.cache.equal_range(size);
      if (first != last) {
        auto it = std::prev(last);
        block = it->second;
        d.cache.erase(it);
        d.cached_bytes -= size;
      } else {
        void* ptr = nullptr;
        reserveLocked(d, device, size, nbytes, [&] { return rt::malloc(device, &ptr, size); });
        block = new Block();
        block->ptr = ptr;
        block->size = size;
        block->device = device;
        countSegment(d, size, +1);
      }
      block->requested = nbytes;
      countAllocation(d, *block, +1);
    }
    return {block->ptr, block, &deleteBlock, c10::Device(kNeuron, device)};
  }

  c10::DataPtr adopt(c10::DataPtr host, size_t nbytes, c10::DeviceIndex device) {
    checkDevice(device);
    auto& d = *devices_[device];
    const size_t size = roundSize(nbytes);
    auto* block = new Block();
    {
      std::lock_guard<std::mutex> lock(d.mutex);
      try {
        reserveLocked(d, device, size, nbytes, [&] { return rt::reserve(device, size); });
      } catch (...) {
        delete block;
        throw;
      }
      block->ptr = host.get();
      block->size = size;
      block->requested = nbytes;
      block->device = device;
      block->host = std::move(host);
      countSegment(d, size, +1);
      countAllocation(d, *block, +1);
    }
    return {block->ptr, block, &deleteBlock, c10::Device(kNeuron, device)};
  }

  void release(Block* block) {
    auto& d = *devices_[block->device];
    std::lock_guard<std::mutex> lock(d.mutex);
    countAllocation(d, *block, -1);
    if (block->host) {
      rt::release(block->device, block->size);
      countSegment(d, block->size, -1);
      delete block;  // frees the host buffer
      return;
    }
    d.cache.emplace(block->size, block);
    d.cached_bytes += block->size;
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    rt::memcpy(dest, src, count, rt::CopyKind::DeviceToDevice);
  }

  bool initialized() override { return true; }

  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {
    for (auto& d : devices_) {
      std::lock_guard<std::mutex> lock(d->mutex);
      freeCachedLocked(*d);
    }
  }

  void recordStream(const c10::DataPtr& /*ptr*/, c10::Stream /*stream*/) override {
    // Kernels finish when launched: a block is never in use by a stream once freed.
  }

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    checkDevice(device);
    auto& d = *devices_[device];
    std::lock_guard<std::mutex> lock(d.mutex);
    return d.stats;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    checkDevice(device);
    auto& d = *devices_[device];
    std::lock_guard<std::mutex> lock(d.mutex);
    forEachStat(d.stats, [](c10::CachingAllocator::Stat& s) { s.reset_accumulated(); });
    d.stats.num_alloc_retries = 0;
    d.stats.num_ooms = 0;
    d.stats.num_device_alloc = 0;
    d.stats.num_device_free = 0;
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    checkDevice(device);
    auto& d = *devices_[device];
    std::lock_guard<std::mutex> lock(d.mutex);
    forEachStat(d.stats, [](c10::CachingAllocator::Stat& s) { s.reset_peak(); });
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    checkDevice(device);
    size_t free_bytes = 0, total = 0;
    rt::memGetInfo(device, &free_bytes, &total);
    return {free_bytes, total};
  }

 private:
  struct DeviceState {
    std::mutex mutex;
    std::multimap<size_t, Block*> cache;  // free blocks by size, in the order they were freed
    size_t cached_bytes = 0;
    DeviceStats stats;
  };

  template <class Fn>
  static void forEachStat(DeviceStats& stats, Fn fn) {
    for (auto* array : {&stats.allocation, &stats.segment, &stats.active, &stats.allocated_bytes,
                        &stats.reserved_bytes, &stats.active_bytes, &stats.requested_bytes,
                        &stats.inactive_split, &stats.inactive_split_bytes})
      for (auto& s : *array) fn(s);
  }

  static void update(c10::CachingAllocator::StatArray& a, size_t size, size_t amount, int sign) {
    const auto pool = size <= kSmallLimit ? StatType::SMALL_POOL : StatType::LARGE_POOL;
    for (auto type : {StatType::AGGREGATE, pool}) {
      auto& s = a[static_cast<size_t>(type)];
      sign > 0 ? s.increase(amount) : s.decrease(amount);
    }
  }

  static void countAllocation(DeviceState& d, const Block& b, int sign) {
    update(d.stats.allocation, b.size, 1, sign);
    update(d.stats.active, b.size, 1, sign);
    update(d.stats.allocated_bytes, b.size, b.size, sign);
    update(d.stats.active_bytes, b.size, b.size, sign);
    update(d.stats.requested_bytes, b.size, b.requested, sign);
  }

  static void countSegment(DeviceState& d, size_t size, int sign) {
    update(d.stats.segment, size, 1, sign);
    update(d.stats.reserved_bytes, size, size, sign);
    (sign > 0 ? d.stats.num_device_alloc : d.stats.num_device_free)++;
  }

  static void freeCachedLocked(DeviceState& d) {
    for (auto& [size, block] : d.cache) {
      rt::free(block->ptr);
      countSegment(d, size, -1);
      delete block;
    }
    d.cache.clear();
    d.cached_bytes = 0;
  }

  // Runs `get` (a runtime allocation); on a full device, frees the cache and
  // tries once more, then raises OutOfMemoryError. Called with d.mutex held.
  template <typename Fn>
  void reserveLocked(DeviceState& d, c10::DeviceIndex device, size_t size, size_t requested, Fn get) {
    rt::Status s = get();
    if (s == rt::Status::OutOfMemory && !d.cache.empty()) {
      d.stats.num_alloc_retries++;
      freeCachedLocked(d);
      s = get();
    }
    if (s == rt::Status::Success) return;
    if (s != rt::Status::OutOfMemory) {
      TORCH_CHECK(false, "neuron runtime error on neuron:", int(device), ": ", rt::statusString(s));
    }
    d.stats.num_ooms++;
    size_t free_bytes = 0, total = 0;
    rt::memGetInfo(device, &free_bytes, &total);
    const auto allocated = d.stats.allocated_bytes[0].current;
    const auto reserved = d.stats.reserved_bytes[0].current;
    TORCH_CHECK_WITH(OutOfMemoryError, false,
        "neuron out of memory. Tried to allocate ", formatBytes(requested),
        ". neuron:", int(device), " has a total capacity of ", formatBytes(total),
        " of which ", formatBytes(free_bytes), " is free. ",
        formatBytes(allocated), " is allocated by PyTorch, and ",
        formatBytes(reserved - allocated), " is reserved by PyTorch but unallocated. "
        "Free tensors you no longer need, call torch.neuron.empty_cache(), or raise the "
        "capacity with TORCHNEURON_DEVICE_MEMORY.");
  }

  std::vector<std::unique_ptr<DeviceState>> devices_;
};

NeuronAllocator& allocator() {
  static NeuronAllocator* a = new NeuronAllocator();  // lives until exit
  return *a;
}

// The allocator of one device, for storages that must grow on their own device.
class BoundAllocator final : public c10::Allocator {
 public:
  explicit BoundAllocator(c10::DeviceIndex device) : device_(device) {}
  c10::DataPtr allocate(size_t nbytes) override { return allocator().allocateOn(device_, nbytes); }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    rt::memcpy(dest, src, count, rt::CopyKind::DeviceToDevice);
  }

 private:
  c10::DeviceIndex device_;
};

void deleteBlock(void* ctx) { allocator().release(static_cast<Block*>(ctx)); }

// The device a CPU kernel on this thread computes results for (DeviceOutputScope), or -1.
thread_local c10::DeviceIndex t_output_device = -1;

// Device blocks handed to CPU kernels, by address (see CpuAllocator).
std::mutex g_views_mutex;
std::unordered_map<void*, Block*> g_views;
c10::DeleterFnPtr g_base_raw_deleter = nullptr;

Block* takeView(void* ptr) {
  std::lock_guard<std::mutex> lock(g_views_mutex);
  auto it = g_views.find(ptr);
  if (it == g_views.end()) return nullptr;
  Block* block = it->second;
  g_views.erase(it);
  return block;
}

// The deleter of CPU allocations: a device block goes back to the caching allocator, anything
// else (a raw_deallocate of the wrapped allocator's memory) to the wrapped allocator.
void deleteHostView(void* ptr) {
  if (Block* block = takeView(ptr)) {
    allocator().release(block);
    return;
  }
  TORCH_INTERNAL_ASSERT(g_base_raw_deleter != nullptr, "neuron: a CPU allocation of unknown origin was freed");
  g_base_raw_deleter(ptr);
}

// The process's CPU allocator, wrapped: while a thread runs a CPU kernel for the device, the
// kernel's buffers (its results, its temporaries, oneDNN's scratchpads) are device blocks from
// the caching allocator, seen as host memory; everything else goes to the allocator it wraps.
// A result is then device memory already when the kernel returns, with no malloc, page faults
// or copy: the storage only changes hands (takeBuffer). Blocks are handed out like the wrapped
// allocator's memory (context = address), so raw_allocate/raw_deallocate work on both.
class CpuAllocator final : public c10::Allocator {
 public:
  explicit CpuAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex device = t_output_device;
    if (device < 0) return base_->allocate(nbytes);
    c10::DataPtr block = allocator().allocateOn(device, nbytes);
    void* ptr = block.get();
    {
      std::lock_guard<std::mutex> lock(g_views_mutex);
      g_views.emplace(ptr, static_cast<Block*>(block.release_context()));
    }
    return {ptr, ptr, &deleteHostView, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return g_base_raw_deleter != nullptr ? &deleteHostView : nullptr;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    base_->copy_data(dest, src, count);
  }

 private:
  c10::Allocator* base_;
};

struct Registration {
  Registration() {
    c10::SetAllocator(kNeuron, &allocator());
    c10::Allocator* base = c10::GetCPUAllocator();
    g_base_raw_deleter = base->raw_deleter();
    static CpuAllocator cpu(base);
    c10::SetCPUAllocator(&cpu, /*priority=*/1);
  }
} registration;

}  // namespace

DeviceOutputScope::DeviceOutputScope(c10::DeviceIndex device) : previous_(t_output_device) {
  t_output_device = device;
}

DeviceOutputScope::~DeviceOutputScope() { t_output_device = previous_; }

std::optional<c10::DataPtr> takeDeviceBlock(c10::StorageImpl* storage, c10::DeviceIndex device) {
  const c10::DataPtr& view = storage->data_ptr();
  if (view.get_deleter() != &deleteHostView || view.get_context() != view.get()) return std::nullopt;
  void* ptr = view.get();
  Block* block = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_views_mutex);
    auto it = g_views.find(ptr);
    if (it == g_views.end() || it->second->device != device) return std::nullopt;
    block = it->second;
    g_views.erase(it);
  }
  // The storage lets go of the block without running its deleter: it belongs to the result now.
  storage->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::kCPU))).release_context();
  return c10::DataPtr(ptr, block, &deleteBlock, c10::Device(kNeuron, device));
}

c10::DeviceAllocator* deviceAllocator() { return &allocator(); }

c10::DataPtr adoptHostBuffer(c10::DataPtr host, size_t nbytes, c10::DeviceIndex device) {
  return allocator().adopt(std::move(host), nbytes, device);
}

c10::DataPtr allocateOn(c10::DeviceIndex device, size_t nbytes) {
  return allocator().allocateOn(device, nbytes);
}

c10::Allocator* allocatorFor(c10::DeviceIndex device) {
  static std::vector<std::unique_ptr<BoundAllocator>> bound = [] {
    std::vector<std::unique_ptr<BoundAllocator>> v;
    for (c10::DeviceIndex i = 0; i < deviceCount(); ++i) v.push_back(std::make_unique<BoundAllocator>(i));
    return v;
  }();
  checkDevice(device);
  return bound[device].get();
}

}  // namespace torchneuron
