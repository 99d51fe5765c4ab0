// Emulated NeuronCore: device memory with a capacity, copies, pinned host memory.
//
// Device memory costs the host nothing until it is written, as a real device's memory does not come
// out of host RAM: a block of kLazyBytes or more is a private anonymous mapping of its own
// (MAP_NORESERVE), whose pages are zero and take no host memory until first touched; free() unmaps
// it, so the host gets its pages back. memset() to zero gives the whole pages inside such a block
// (or inside strict mode's arena, protection.cpp) back to the host, which then reads zeros again,
// and writes only the ragged ends. Smaller blocks come from the host's heap.
#include "runtime.h"
#include "protection.h"
#include "checks.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <map>
#include <vector>

namespace torchneuron::emu {

size_t deviceCapacity();  // below

namespace {

constexpr size_t kAlignment = 64;
// Blocks of this size or more are mappings of their own (a page or less of waste, under 0.4%).
constexpr size_t kLazyBytes = size_t(1) << 20;
constexpr size_t kDefaultCapacity = size_t(16) << 30;

// Parses "17179869184", "16GiB", "16G", "512MiB", "512M", "64KiB".
size_t parseBytes(const char* text, size_t fallback) {
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  double value = std::strtod(text, &end);
  if (end == text || value < 0) return fallback;
  std::string unit(end);
  for (auto& c : unit) c = static_cast<char>(std::tolower(c));
  double scale = 1;
  if (unit.empty() || unit == "b") scale = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib") scale = 1024.0;
  else if (unit == "m" || unit == "mb" || unit == "mib") scale = 1024.0 * 1024;
  else if (unit == "g" || unit == "gb" || unit == "gib") scale = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tb" || unit == "tib") scale = 1024.0 * 1024 * 1024 * 1024;
  else {
    std::fprintf(stderr, "torchneuron: cannot read the size '%s'; using the default\n", text);
    return fallback;
  }
  return static_cast<size_t>(value * scale);
}

struct DeviceMemory {
  std::atomic<size_t> used{0};
};

std::vector<DeviceMemory>& devices() {
  static std::vector<DeviceMemory> devs(deviceCount());
  return devs;
}

struct Registry {
  std::mutex mutex;
  std::unordered_map<const void*, std::pair<int, size_t>> device_blocks;
  // Blocks in private anonymous mappings, start -> bytes: those of kLazyBytes or more, and in strict
  // mode every block (all in the arena's mapping).
  std::map<uintptr_t, size_t> mapped_blocks;
  std::map<uintptr_t, size_t> host_blocks;  // start -> size
};

Registry& registry() {
  static Registry* r = new Registry();  // outlives static destructors
  return *r;
}

bool validDevice(int device) { return device >= 0 && device < deviceCount(); }

size_t pageSize() {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

size_t mappedSize(size_t nbytes) { return (nbytes + pageSize() - 1) / pageSize() * pageSize(); }

// Whether [p, p + nbytes) lies in memory whose whole pages may be handed back to the host
// (madvise(MADV_DONTNEED) on a private anonymous mapping: they read zeros after).
bool givesPagesBack(const char* p, size_t nbytes) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto addr = reinterpret_cast<uintptr_t>(p);
  auto it = r.mapped_blocks.upper_bound(addr);
  if (it == r.mapped_blocks.begin()) return false;
  --it;
  return addr + nbytes <= it->first + it->second;
}

}  // namespace

size_t deviceCapacity() {
  static const size_t capacity =
      parseBytes(std::getenv("TORCHNEURON_DEVICE_MEMORY"), kDefaultCapacity);
  return capacity;
}

Status reserve(int device, size_t nbytes) {
  if (!validDevice(device)) return Status::InvalidDevice;
  auto& used = devices()[device].used;
  size_t current = used.load(std::memory_order_relaxed);
  const size_t capacity = deviceCapacity();
  do {
    if (nbytes > capacity - std::min(current, capacity)) return Status::OutOfMemory;
  } while (!used.compare_exchange_weak(current, current + nbytes, std::memory_order_relaxed));
  return Status::Success;
}

void release(int device, size_t nbytes) {
  if (!validDevice(device)) return;
  const size_t before = devices()[device].used.fetch_sub(nbytes, std::memory_order_relaxed);
  TORCHNEURON_RT_ASSERT(before >= nbytes, "a device released more bytes than it had reserved");
  (void)before;
}

Status malloc(int device, void** ptr, size_t nbytes) {
  if (ptr == nullptr) return Status::InvalidValue;
  *ptr = nullptr;
  Status s = reserve(device, nbytes);
  if (s != Status::Success) return s;
  void* p = nullptr;
  if (strictMode()) {
    p = protectedAllocate(device, nbytes);
    if (p == nullptr) {  // the arena is fragmented beyond its capacity
      release(device, nbytes);
      return Status::OutOfMemory;
    }
  } else if (nbytes >= kLazyBytes) {
    // Address space only: pages are committed when first written (no swap reserved for them).
    p = ::mmap(nullptr, mappedSize(nbytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
               -1, 0);
    if (p == MAP_FAILED) {
      release(device, nbytes);
      return Status::OutOfMemory;
    }
  } else if (posix_memalign(&p, kAlignment, nbytes == 0 ? kAlignment : nbytes) != 0) {
    release(device, nbytes);
    return Status::OutOfMemory;
  }
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    r.device_blocks.emplace(p, std::make_pair(device, nbytes));
    if (strictMode()) r.mapped_blocks.emplace(reinterpret_cast<uintptr_t>(p), nbytes);
    else if (nbytes >= kLazyBytes) r.mapped_blocks.emplace(reinterpret_cast<uintptr_t>(p), mappedSize(nbytes));
  }
  *ptr = p;
  return Status::Success;
}

Status free(void* ptr) {
  if (ptr == nullptr) return Status::Success;
  std::pair<int, size_t> block;
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.device_blocks.find(ptr);
    if (it == r.device_blocks.end()) return Status::InvalidValue;
    block = it->second;
    r.device_blocks.erase(it);
    r.mapped_blocks.erase(reinterpret_cast<uintptr_t>(ptr));
  }
  if (strictMode()) protectedFree(block.first, ptr, block.second);
  else if (block.second >= kLazyBytes) ::munmap(ptr, mappedSize(block.second));  // its pages go back to the host
  else std::free(ptr);
  release(block.first, block.second);
  return Status::Success;
}

Status pointerGetDevice(const void* ptr, int* device) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.device_blocks.find(ptr);
  if (it == r.device_blocks.end()) return Status::InvalidValue;
  *device = it->second.first;
  return Status::Success;
}

Status memGetInfo(int device, size_t* free_bytes, size_t* total_bytes) {
  if (!validDevice(device)) return Status::InvalidDevice;
  const size_t capacity = deviceCapacity();
  const size_t used = devices()[device].used.load(std::memory_order_relaxed);
  *total_bytes = capacity;
  *free_bytes = used >= capacity ? 0 : capacity - used;
  return Status::Success;
}

Status memcpy(void* dst, const void* src, size_t nbytes, CopyKind kind) {
  if (nbytes == 0) return Status::Success;
  if (dst == nullptr || src == nullptr) return Status::InvalidValue;
  const MemoryRange ranges[] = {{dst, nbytes}, {src, nbytes}};
  DeviceAccess access(ranges, 2);  // strict mode: a copy reaches its own memory
  std::memmove(dst, src, nbytes);
  return Status::Success;
}

Status memset(void* dst, int value, size_t nbytes) {
  if (nbytes == 0) return Status::Success;
  if (dst == nullptr) return Status::InvalidValue;
  auto* p = static_cast<char*>(dst);
  const MemoryRange range{dst, nbytes};
  DeviceAccess access(&range, 1);  // strict mode: a fill reaches its own memory
  if (value != 0 || nbytes < pageSize() || !givesPagesBack(p, nbytes)) {
    std::memset(p, value, nbytes);
    return Status::Success;
  }
  // Zeros: the whole pages inside go back to the host (they read zeros, and cost nothing until
  // written again); the ragged ends, which may share a page with other memory, are written.
  const auto start = reinterpret_cast<uintptr_t>(p), end = start + nbytes;
  const uintptr_t first = (start + pageSize() - 1) / pageSize() * pageSize(), last = end / pageSize() * pageSize();
  if (last <= first || ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED) != 0) {
    std::memset(p, 0, nbytes);
    return Status::Success;
  }
  std::memset(p, 0, first - start);
  std::memset(reinterpret_cast<void*>(last), 0, end - last);
  return Status::Success;
}

Status hostMalloc(void** ptr, size_t nbytes) {
  if (ptr == nullptr) return Status::InvalidValue;
  void* p = nullptr;
  if (posix_memalign(&p, kAlignment, nbytes == 0 ? kAlignment : nbytes) != 0) {
    *ptr = nullptr;
    return Status::OutOfMemory;
  }
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.host_blocks.emplace(reinterpret_cast<uintptr_t>(p), nbytes);
  *ptr = p;
  return Status::Success;
}

Status hostFree(void* ptr) {
  if (ptr == nullptr) return Status::Success;
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    if (r.host_blocks.erase(reinterpret_cast<uintptr_t>(ptr)) == 0) return Status::InvalidValue;
  }
  std::free(ptr);
  return Status::Success;
}

bool isHostPinned(const void* ptr) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  // Any address inside a pinned block counts, as for views of pinned tensors.
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  auto it = r.host_blocks.upper_bound(addr);
  if (it == r.host_blocks.begin()) return false;
  --it;
  return addr < it->first + std::max<size_t>(it->second, 1);
}

}  // namespace torchneuron::emu
