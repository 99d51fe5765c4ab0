// The caching allocator of device memory, with PyTorch's memory statistics.
//
// Freed blocks are kept per device and size for reuse; they go back to the
// runtime on empty_cache() or when an allocation would otherwise not fit.
// CPU kernels run for the device (the zero-copy path) allocate from it too,
// through a wrapper of the CPU allocator (DeviceOutputScope, host_addressable.cpp);
// buffers they produce some other way are adopted: charged to the device and
// counted like any other allocation.
//
// Asynchronous mode (rt::asyncMode()): as in CUDA's caching allocator, a block belongs to the
// stream it was allocated on, and a freed block is reused only by allocations on that stream,
// whose later work runs after the work that used it. A block recorded on other streams
// (record_stream) waits, after it is freed, until those streams have passed an event recorded
// at the free. Memory goes back to the runtime (empty_cache, or a retry before an out-of-memory
// error) only after the device's streams are idle.
//
// Memory history (recordMemoryHistory): while it is on, blocks keep the traceback that allocated
// them and each device keeps a bounded ring of what the allocator did, in the structure of
// PyTorch's CUDA snapshots (memorySnapshot). While it is off, the allocation and free paths pay
// a relaxed atomic load or two.
//
// PyTorch's GPU trace (c10::impl::GPUTrace, turned on by torch._C._activate_gpu_trace()) hears of
// every allocation and free while torch.ops.torchneuron._trace_allocations(True) asks for it:
// torch.neuron._gpu_trace's callbacks, which the stream sanitizer uses. PyTorch's trace cannot be
// turned off again, so the allocator's own switch keeps it out of the way (a relaxed load) after.
#include "allocator.h"
#include "device.h"
#include "device_init.h"
#include "held_work.h"

#include <torch/csrc/profiler/combined_traceback.h>

#include <c10/core/Allocator.h>
#include <c10/core/impl/GPUTrace.h>
#include <torch/library.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace torchneuron {
namespace {

std::atomic<bool> g_trace_blocks{false};

// Tells PyTorch's GPU trace (when asked to, and on) that a device block was allocated or freed.
void traceBlock(const void* ptr, bool allocated) {
  if (!g_trace_blocks.load(std::memory_order_relaxed)) return;
  if (const c10::impl::PyInterpreter* trace = c10::impl::GPUTrace::get_trace()) {
    const auto addr = reinterpret_cast<uintptr_t>(ptr);
    if (allocated) {
      (*trace)->trace_gpu_memory_allocation(c10::DeviceType::PrivateUse1, addr);
    } else {
      (*trace)->trace_gpu_memory_deallocation(c10::DeviceType::PrivateUse1, addr);
    }
  }
}

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

// Every block is a segment of its own (the runtime's allocation), allocated or cached.
struct Block {
  void* ptr = nullptr;
  size_t size = 0;        // bytes charged to the device (rounded)
  size_t requested = 0;   // bytes asked for
  c10::DeviceIndex device = 0;
  bool allocated = false;  // false while cached
  rt::Stream stream = 0;   // asynchronous mode: the stream it was allocated on
  std::vector<c10::Stream> uses;   // ... other streams that used it (record_stream)
  std::vector<rt::Event> pending;  // ... freed: events on those streams it waits for
  c10::DataPtr host;      // set for adopted host buffers
  std::shared_ptr<c10::GatheredContext> context;  // where it was allocated (memory history)
  Block* prev = nullptr;  // the device's list of segments
  Block* next = nullptr;
};

// ---- memory history --------------------------------------------------------
enum class Context { Never = 0, State = 1, Alloc = 2, All = 3 };

std::atomic<bool> g_recording{false};      // blocks keep their allocation context
std::atomic<bool> g_trace{false};          // the per-device rings record actions
std::atomic<int> g_context{0};             // a Context
std::atomic<bool> g_cpp_frames{false};
std::atomic<size_t> g_max_entries{SIZE_MAX};
std::atomic<OomSnapshotHook> g_oom_hook{nullptr};

inline bool recording() { return g_recording.load(std::memory_order_relaxed); }

std::shared_ptr<c10::GatheredContext> gatherContext(Context needed) {
  if (g_context.load(std::memory_order_relaxed) < static_cast<int>(needed)) return nullptr;
  return torch::CapturedTraceback::gather(/*python=*/true, /*script=*/false,
                                          g_cpp_frames.load(std::memory_order_relaxed));
}

int64_t nowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch()).count();
}

// ---- a device's state, its segments and statistics, and its history of actions -----------------

// Free blocks by size, each size's in the order they were freed. A size's list keeps its capacity,
// so freeing and reusing a block allocates nothing. Sizes up to kSmallLimit (multiples of kRound)
// have a list each at their index; larger ones are looked up.
class BlockCache {
 public:
  void push(Block* b) {
    listOf(b->size).push_back(b);
    ++count_;
  }
  // The block of `size` freed last (asynchronous mode: the last of `stream`'s), taken out; or none.
  Block* pop(size_t size, bool async, rt::Stream stream) {
    auto& blocks = listOf(size);
    for (size_t i = blocks.size(); i-- > 0;) {
      if (async && blocks[i]->stream != stream) continue;
      Block* b = blocks[i];
      blocks.erase(blocks.begin() + static_cast<std::ptrdiff_t>(i));
      --count_;
      return b;
    }
    return nullptr;
  }
  bool empty() const { return count_ == 0; }
  template <class Fn>
  void forEach(Fn fn) const {
    for (const auto& blocks : small_)
      for (Block* b : blocks) fn(b);
    for (const auto& [size, blocks] : large_)
      for (Block* b : blocks) fn(b);
  }
  void clear() {
    for (auto& blocks : small_) blocks.clear();
    large_.clear();
    count_ = 0;
  }

 private:
  std::vector<Block*>& listOf(size_t size) {
    return size <= kSmallLimit ? small_[size / kRound - 1] : large_[size];
  }

  std::array<std::vector<Block*>, kSmallLimit / kRound> small_;
  std::unordered_map<size_t, std::vector<Block*>> large_;
  size_t count_ = 0;
};

struct DeviceState {
  std::mutex mutex;
  BlockCache cache;  // free blocks
  size_t cached_bytes = 0;
  DeviceStats stats;
  Block* segments = nullptr;        // every segment, allocated or cached
  std::vector<SnapshotTrace> trace;  // ring of at most g_max_entries, next write at trace_next
  size_t trace_next = 0;
  std::vector<Block*> pending;       // asynchronous mode: freed, waiting for other streams
};

template <class Fn>
void forEachStat(DeviceStats& stats, Fn fn) {
  for (auto* array : {&stats.allocation, &stats.segment, &stats.active, &stats.allocated_bytes,
                      &stats.reserved_bytes, &stats.active_bytes, &stats.requested_bytes,
                      &stats.inactive_split, &stats.inactive_split_bytes})
    for (auto& s : *array) fn(s);
}

// Adds `amount` (sign > 0) to, or takes it from, the aggregate statistic and that of the block's pool.
inline void update(c10::CachingAllocator::StatArray& a, size_t size, size_t amount, int sign) {
  auto& all = a[static_cast<size_t>(StatType::AGGREGATE)];
  auto& pool = a[static_cast<size_t>(size <= kSmallLimit ? StatType::SMALL_POOL : StatType::LARGE_POOL)];
  if (sign > 0) {
    all.increase(amount);
    pool.increase(amount);
  } else {
    all.decrease(amount);
    pool.decrease(amount);
  }
}

// Every allocated block is active, and nothing else is (no block is split, and one freed while other
// streams use it is counted free at once): the active statistics are the allocation ones, copied
// when read (statsOf).
void countAllocation(DeviceState& d, const Block& b, int sign) {
  update(d.stats.allocation, b.size, 1, sign);
  update(d.stats.allocated_bytes, b.size, b.size, sign);
  update(d.stats.requested_bytes, b.size, b.requested, sign);
  // torch.profiler(profile_memory=True): the block as a memory event of the device.
  if (c10::memoryProfilingEnabled()) {
    constexpr auto kAll = static_cast<size_t>(StatType::AGGREGATE);
    c10::reportMemoryUsageToProfiler(b.ptr, sign * static_cast<int64_t>(b.size),
                                     d.stats.allocated_bytes[kAll].current, d.stats.reserved_bytes[kAll].current,
                                     c10::Device(kNeuron, b.device));
  }
}

DeviceStats statsOf(const DeviceState& d) {
  DeviceStats stats = d.stats;
  stats.active = stats.allocation;
  stats.active_bytes = stats.allocated_bytes;
  return stats;
}

void countSegment(DeviceState& d, size_t size, int sign) {
  update(d.stats.segment, size, 1, sign);
  update(d.stats.reserved_bytes, size, size, sign);
  (sign > 0 ? d.stats.num_device_alloc : d.stats.num_device_free)++;
}

// Moves the freed blocks whose other streams have passed their events into the cache.
void processPendingLocked(DeviceState& d) {
  auto done = [](Block* b) {
    for (rt::Event e : b->pending)
      if (rt::eventQuery(e) != rt::Status::Success) return false;
    return true;
  };
  for (size_t i = 0; i < d.pending.size();) {
    Block* b = d.pending[i];
    if (!done(b)) {
      ++i;
      continue;
    }
    for (rt::Event e : b->pending) rt::eventDestroy(e);
    b->pending.clear();
    d.cache.push(b);
    d.cached_bytes += b->size;
    d.pending[i] = d.pending.back();
    d.pending.pop_back();
  }
}

// (A forked child that frees its parent's tensors may not use the device: its frees name stream 0.)
int64_t streamId(c10::DeviceIndex device) { return devicesInBadFork() ? 0 : currentStream(device).id(); }

// Appends an action to the device's ring (when the history records actions).
void noteLocked(DeviceState& d, const char* action, const void* addr, size_t size, int64_t stream,
                       std::shared_ptr<c10::GatheredContext> context, size_t device_free = 0) {
  if (!g_trace.load(std::memory_order_relaxed)) return;
  SnapshotTrace e{action, reinterpret_cast<uint64_t>(addr), size, stream, nowUs(), device_free, std::move(context)};
  const size_t bound = g_max_entries.load(std::memory_order_relaxed);
  if (d.trace.size() < bound) {
    d.trace.push_back(std::move(e));
  } else {
    if (d.trace_next >= d.trace.size()) d.trace_next = 0;
    d.trace[d.trace_next++] = std::move(e);
  }
}

std::vector<SnapshotTrace> orderedTraceLocked(const DeviceState& d) {
  std::vector<SnapshotTrace> out;
  out.reserve(d.trace.size());
  const size_t start = d.trace_next < d.trace.size() ? d.trace_next : 0;
  for (size_t k = 0; k < d.trace.size(); ++k) out.push_back(d.trace[(start + k) % d.trace.size()]);
  return out;
}

void noteAllocLocked(DeviceState& d, Block* block, std::shared_ptr<c10::GatheredContext> context) {
  block->context = context;
  noteLocked(d, "alloc", block->ptr, block->size, streamId(block->device),
             g_context.load(std::memory_order_relaxed) >= static_cast<int>(Context::Alloc) ? std::move(context)
                                                                                         : nullptr);
}

void addSegmentLocked(DeviceState& d, Block* block, const std::shared_ptr<c10::GatheredContext>& context) {
  countSegment(d, block->size, +1);
  block->allocated = true;
  block->next = d.segments;
  if (d.segments != nullptr) d.segments->prev = block;
  d.segments = block;
  if (recording()) {
    const bool alloc_ctx = g_context.load(std::memory_order_relaxed) >= static_cast<int>(Context::Alloc);
    noteLocked(d, "segment_alloc", block->ptr, block->size, streamId(block->device), alloc_ctx ? context : nullptr);
  }
}

void removeSegmentLocked(DeviceState& d, Block* block, const std::shared_ptr<c10::GatheredContext>& context) {
  countSegment(d, block->size, -1);
  if (block->prev != nullptr) block->prev->next = block->next;
  else d.segments = block->next;
  if (block->next != nullptr) block->next->prev = block->prev;
  block->prev = block->next = nullptr;
  if (recording()) noteLocked(d, "segment_free", block->ptr, block->size, streamId(block->device), context);
}

// Rethrows an out-of-memory error; while the history is on, with a snapshot written first
// (by the hook the Python binding installs) and named in the message.
[[noreturn]] void failWithSnapshot(const c10::OutOfMemoryError& e, c10::DeviceIndex device) {
  OomSnapshotHook hook = g_oom_hook.load();
  if (!recording() || hook == nullptr) throw;
  std::string path;
  try {
    path = hook(device);
  } catch (const std::exception& err) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, e.msg(), " (Writing a memory snapshot failed: ", err.what(), ")");
  }
  if (path.empty()) throw;
  TORCH_CHECK_WITH(OutOfMemoryError, false, e.msg(), " A memory snapshot was written to ", path,
                   " (open it with `torchneuron memviz` or PyTorch's memory visualizer).");
}

// Returns the cached blocks to the runtime. Asynchronous mode: the caller has waited for the
// device's streams first, without the lock (their work may free device memory, which takes it), so
// that no queued work refers to a cached block; the freed blocks waiting for streams join them.
void freeCachedLocked(DeviceState& d, const std::shared_ptr<c10::GatheredContext>& context = nullptr) {
  if (rt::asyncMode()) processPendingLocked(d);
  d.cache.forEach([&](Block* block) {
    rt::free(block->ptr);
    removeSegmentLocked(d, block, context);
    delete block;
  });
  d.cache.clear();
  d.cached_bytes = 0;
}

// Runs `get` (a runtime allocation); on a full device, frees the cache and
// tries once more, then raises OutOfMemoryError. Called with d.mutex held.
template <typename Fn>
void reserveLocked(DeviceState& d, std::unique_lock<std::mutex>& lock, c10::DeviceIndex device, size_t size,
                   size_t requested,
                   const std::shared_ptr<c10::GatheredContext>& context, Fn get) {
  rt::Status s = get();
  // Fused eager: a recorded group may refer to cached blocks (its intermediates'), so it runs before
  // they go; while an op is being recorded it cannot, and the op then runs on its own (held_work.h).
  const bool held = holdingWork();
  if (s == rt::Status::OutOfMemory && held && !recordingOpHere()) {
    lock.unlock();
    flushHeldWork("out of memory");
    lock.lock();
  }
  if (s == rt::Status::OutOfMemory && (!d.cache.empty() || !d.pending.empty()) && !(held && recordingOpHere())) {
    d.stats.num_alloc_retries++;
    if (rt::asyncMode()) {
      lock.unlock();
      runtime::synchronizeDevice(device);
      lock.lock();
    }
    freeCachedLocked(d, context);
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
  if (recording()) noteLocked(d, "oom", nullptr, requested, streamId(device), context, free_bytes);
  TORCH_CHECK_WITH(OutOfMemoryError, false,
      "neuron out of memory. Tried to allocate ", formatBytes(requested),
      ". neuron:", int(device), " has a total capacity of ", formatBytes(total),
      " of which ", formatBytes(free_bytes), " is free. ",
      formatBytes(allocated), " is allocated by PyTorch, and ",
      formatBytes(reserved - allocated), " is reserved by PyTorch but unallocated. "
      "Free tensors you no longer need, call torch.neuron.empty_cache(), or raise the "
      "capacity with TORCHNEURON_DEVICE_MEMORY.");
}


void deleteBlock(void* ctx);

// Starts, changes or stops the memory history of every device.
void recordHistoryOf(std::vector<std::unique_ptr<DeviceState>>& devices, const MemoryHistoryOptions& o) {
  g_recording.store(false);
  g_trace.store(false);
  g_context.store(static_cast<int>(o.context));
  g_cpp_frames.store(o.cpp_frames);
  g_max_entries.store(o.max_entries == 0 ? 1 : o.max_entries);
  for (auto& d : devices) {
    std::lock_guard<std::mutex> lock(d->mutex);
    if (o.clear_history || !o.enabled) {
      d->trace.clear();
      d->trace_next = 0;
    }
    if (!o.enabled) {
      for (Block* b = d->segments; b != nullptr; b = b->next) b->context.reset();
    }
    // A smaller bound keeps the newest entries.
    auto ordered = orderedTraceLocked(*d);
    const size_t bound = g_max_entries.load();
    if (ordered.size() > bound) ordered.erase(ordered.begin(), ordered.end() - bound);
    d->trace = std::move(ordered);
    d->trace_next = 0;
  }
  g_trace.store(o.enabled && o.trace);
  g_recording.store(o.enabled);
}

// Every device's segments and history, in the structure of PyTorch's CUDA snapshots.
MemorySnapshot snapshotOf(std::vector<std::unique_ptr<DeviceState>>& devices) {
  MemorySnapshot s;
  s.traces.resize(devices.size());
  for (size_t i = 0; i < devices.size(); ++i) {
    auto& d = *devices[i];
    std::lock_guard<std::mutex> lock(d.mutex);
    for (Block* b = d.segments; b != nullptr; b = b->next) {
      SnapshotSegment seg;
      seg.device = static_cast<c10::DeviceIndex>(i);
      seg.address = reinterpret_cast<uint64_t>(b->ptr);
      seg.total_size = b->size;
      seg.large = b->size > kSmallLimit;
      seg.adopted = static_cast<bool>(b->host);
      SnapshotBlock blk;
      blk.address = seg.address;
      blk.size = b->size;
      blk.requested_size = b->allocated ? b->requested : 0;
      blk.allocated = b->allocated;
      blk.context = b->context;
      seg.blocks.push_back(std::move(blk));
      s.segments.push_back(std::move(seg));
    }
    s.traces[i] = orderedTraceLocked(d);
  }
  std::sort(s.segments.begin(), s.segments.end(), [](const SnapshotSegment& a, const SnapshotSegment& b) {
    return std::tie(a.device, a.address) < std::tie(b.device, b.address);
  });
  return s;
}

class NeuronAllocator final : public c10::DeviceAllocator {
 public:
  NeuronAllocator() : devices_(rt::deviceCount()) {
    for (auto& d : devices_) d = std::make_unique<DeviceState>();
  }

  c10::DataPtr allocate(size_t nbytes) override { return allocateOn(currentDevice(), nbytes); }

  c10::DataPtr allocateOn(c10::DeviceIndex device, size_t nbytes) {
    useDevice(device);  // the first allocation is the device's first use; raises in a bad fork
    auto& d = *devices_[device];
    const size_t size = roundSize(nbytes);
    std::shared_ptr<c10::GatheredContext> context;
    if (recording()) context = gatherContext(Context::State);
    Block* block = nullptr;
    try {
      std::unique_lock<std::mutex> lock(d.mutex);
      const bool async = rt::asyncMode();
      const rt::Stream stream = async ? streamId(device) : 0;
      if (async) processPendingLocked(d);
      // The block freed last (its memory is likeliest still in the host's caches). Asynchronous
      // mode: a block of this stream.
      block = d.cache.pop(size, async, stream);
      if (block != nullptr) {
        d.cached_bytes -= size;
      } else {
        void* ptr = nullptr;
        reserveLocked(d, lock, device, size, nbytes, context, [&] { return rt::malloc(device, &ptr, size); });
        block = new Block();
        block->ptr = ptr;
        block->size = size;
        block->device = device;
        block->stream = stream;
        addSegmentLocked(d, block, context);
      }
      block->requested = nbytes;
      block->allocated = true;
      countAllocation(d, *block, +1);
      if (recording()) noteAllocLocked(d, block, std::move(context));
    } catch (const c10::OutOfMemoryError& e) {
      failWithSnapshot(e, device);
    }
    traceBlock(block->ptr, true);
    if (rt::strictMode()) rt::deviceAccessAdd(block->ptr, nbytes);  // strict mode: a block handed out inside a launch is its
    return {block->ptr, block, &deleteBlock, c10::Device(kNeuron, device)};
  }

  c10::DataPtr adopt(c10::DataPtr host, size_t nbytes, c10::DeviceIndex device) {
    checkDevice(device);
    auto& d = *devices_[device];
    const size_t size = roundSize(nbytes);
    std::shared_ptr<c10::GatheredContext> context;
    if (recording()) context = gatherContext(Context::State);
    auto* block = new Block();
    try {
      std::unique_lock<std::mutex> lock(d.mutex);
      reserveLocked(d, lock, device, size, nbytes, context, [&] { return rt::reserve(device, size); });
      block->ptr = host.get();
      block->size = size;
      block->requested = nbytes;
      block->device = device;
      block->host = std::move(host);
      addSegmentLocked(d, block, context);
      countAllocation(d, *block, +1);
      if (recording()) noteAllocLocked(d, block, std::move(context));
    } catch (const c10::OutOfMemoryError& e) {
      delete block;
      failWithSnapshot(e, device);
    } catch (...) {
      delete block;
      throw;
    }
    traceBlock(block->ptr, true);
    return {block->ptr, block, &deleteBlock, c10::Device(kNeuron, device)};
  }

  void release(Block* block) {
    traceBlock(block->ptr, false);  // before the lock: the trace runs Python
    auto& d = *devices_[block->device];
    std::shared_ptr<c10::GatheredContext> context;
    const bool record = recording();
    if (record) context = gatherContext(Context::All);
    std::lock_guard<std::mutex> lock(d.mutex);
    countAllocation(d, *block, -1);
    block->allocated = false;
    if (record) {
      const int64_t stream = streamId(block->device);
      noteLocked(d, "free_requested", block->ptr, block->size, stream, context);
      noteLocked(d, "free_completed", block->ptr, block->size, stream, context);
    }
    block->context.reset();
    if (block->host) {
      rt::release(block->device, block->size);
      removeSegmentLocked(d, block, context);
      delete block;  // frees the host buffer
      return;
    }
    if (!block->uses.empty()) {  // asynchronous mode: other streams may still use it
      for (const auto& use : block->uses) {
        rt::Event event = nullptr;
        rt::eventCreate(&event, /*enable_timing=*/false);
        rt::eventRecord(event, block->device, use.id());
        block->pending.push_back(event);
      }
      block->uses.clear();
      d.pending.push_back(block);
      return;
    }
    d.cache.push(block);
    d.cached_bytes += block->size;
  }

  // record_stream: the block is in use by `stream` too (asynchronous mode; nothing otherwise).
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    if (!rt::asyncMode() || ptr.get_deleter() != &deleteBlock || stream.device_type() != kNeuron) return;
    auto* block = static_cast<Block*>(ptr.get_context());
    auto& d = *devices_[block->device];
    std::lock_guard<std::mutex> lock(d.mutex);
    if (stream.id() == block->stream) return;
    for (const auto& use : block->uses)
      if (use == stream) return;
    block->uses.push_back(stream);
  }

  void recordHistory(const MemoryHistoryOptions& o) { recordHistoryOf(devices_, o); }
  MemorySnapshot snapshot() { return snapshotOf(devices_); }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    runtime::copyMemory(dest, src, count, rt::CopyKind::DeviceToDevice);
  }

  bool initialized() override { return devicesInitialized(); }  // as CUDA's: once the devices are

  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {
    flushHeldWork("empty_cache");  // fused eager: a recorded group may still refer to cached blocks
    std::shared_ptr<c10::GatheredContext> context;
    if (recording()) context = gatherContext(Context::All);
    for (size_t i = 0; i < devices_.size(); ++i) {
      if (rt::asyncMode()) runtime::synchronizeDevice(static_cast<int>(i));  // before the lock: see freeCachedLocked
      std::lock_guard<std::mutex> lock(devices_[i]->mutex);
      freeCachedLocked(*devices_[i], context);
    }
  }

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    flushHeldWork("memory stats");  // fused eager: the frees a recorded group holds back happen first
    checkDevice(device);
    auto& d = *devices_[device];
    std::lock_guard<std::mutex> lock(d.mutex);
    return statsOf(d);
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
    runtime::copyMemory(dest, src, count, rt::CopyKind::DeviceToDevice);
  }

 private:
  c10::DeviceIndex device_;
};

void deleteBlock(void* ctx) { allocator().release(static_cast<Block*>(ctx)); }

struct Registration {
  Registration() { c10::SetAllocator(kNeuron, &allocator()); }
} registration;

}  // namespace

c10::DeviceAllocator* deviceAllocator() { return &allocator(); }

void recordMemoryHistory(const MemoryHistoryOptions& options) { allocator().recordHistory(options); }

bool memoryHistoryEnabled() { return recording(); }

MemorySnapshot memorySnapshot() { return allocator().snapshot(); }

void setOomSnapshotHook(OomSnapshotHook hook) { g_oom_hook.store(hook); }

c10::DataPtr deviceBlockFromHostBuffer(c10::DataPtr host, size_t nbytes, c10::DeviceIndex device) {
  return allocator().adopt(std::move(host), nbytes, device);
}

c10::DataPtr allocateOn(c10::DeviceIndex device, size_t nbytes) {
  return allocator().allocateOn(device, nbytes);
}

c10::Allocator* allocatorFor(c10::DeviceIndex device) {
  // One per device, made at the first call and never destroyed (storages keep pointers to them).
  static BoundAllocator* const* const bound = [] {
    auto** v = new BoundAllocator*[deviceCount()];
    for (c10::DeviceIndex i = 0; i < deviceCount(); ++i) v[i] = new BoundAllocator(i);
    return v;
  }();
  if (device < 0 || device >= deviceCount()) checkDevice(device);  // raises
  return bound[device];
}

}  // namespace torchneuron

TORCH_LIBRARY_FRAGMENT(torchneuron, m) {
  m.def("_trace_allocations(bool on) -> ()",
        [](bool on) { torchneuron::g_trace_blocks.store(on, std::memory_order_relaxed); });
}
