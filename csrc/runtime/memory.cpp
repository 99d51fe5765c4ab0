// Emulated NeuronCore: device memory with a capacity, copies, pinned host memory.
#include "neuron_runtime.h"

#include <signal.h>
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

namespace torchneuron::rt {

size_t deviceCapacity();  // below

namespace {

constexpr size_t kAlignment = 64;
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
  std::map<uintptr_t, size_t> host_blocks;  // start -> size
};

Registry& registry() {
  static Registry* r = new Registry();  // outlives static destructors
  return *r;
}

bool validDevice(int device) { return device >= 0 && device < deviceCount(); }

// ---- strict mode: device memory in protected arenas -------------------------
//
// Each device's memory is a range of one reserved mapping (its capacity, no
// pages committed up front), carved first fit. Outside access windows the used
// part of every arena is PROT_NONE; a window makes it readable and writable.
// A fault inside the mapping outside a window is reported and ends the process.

constexpr size_t kArenaAlignment = 512;
constexpr size_t kHugePage = size_t(2) << 20;

struct Arena {
  char* base = nullptr;                 // of device 0; device d starts at base + d * span
  size_t span = 0;                      // bytes per device, whole pages
  size_t page = 4096;                   // the granularity of protection and of returning memory
  std::vector<size_t> extent;           // per device: end of the highest allocation, whole pages
  std::vector<std::map<size_t, size_t>> free_ranges;  // per device: offset -> size
  int open = 0;                         // access windows open now
  std::mutex mutex;
};

Arena* arena = nullptr;  // set once when strict mode starts
struct sigaction previous_segv {};
volatile sig_atomic_t reported = 0;  // a fault in device memory was reported

// The bytes an allocation of `nbytes` takes in an arena.
size_t arenaSize(size_t nbytes) {
  return std::max<size_t>((nbytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment, kArenaAlignment);
}

void onFault(int sig, siginfo_t* info, void* context);

// Hands a fault to the SIGSEGV handler installed before ours; false when there was none to call.
bool callPreviousHandler(int sig, siginfo_t* info, void* context) {
  if (previous_segv.sa_flags & SA_SIGINFO) {
    if (previous_segv.sa_sigaction == nullptr || previous_segv.sa_sigaction == &onFault) return false;
    previous_segv.sa_sigaction(sig, info, context);
    return true;
  }
  if (previous_segv.sa_handler == SIG_DFL || previous_segv.sa_handler == SIG_IGN ||
      previous_segv.sa_handler == nullptr)
    return false;
  previous_segv.sa_handler(sig);
  return true;
}

void protect(Arena& a, int prot) {
  for (size_t d = 0; d < a.extent.size(); ++d)
    if (a.extent[d] > 0) ::mprotect(a.base + d * a.span, a.extent[d], prot);
}

void writeAll(const char* text, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, text, n);
    if (w <= 0) return;
    text += w;
    n -= static_cast<size_t>(w);
  }
}

void onFault(int sig, siginfo_t* info, void* context) {
  const auto* addr = static_cast<const char*>(info->si_addr);
  if (arena != nullptr && addr >= arena->base && addr < arena->base + arena->span * arena->extent.size()) {
    const auto device = static_cast<size_t>(addr - arena->base) / arena->span;
    char message[640];
    const int n = std::snprintf(
        message, sizeof(message),
        "\ntorchneuron strict mode (TORCHNEURON_STRICT=1): the host accessed neuron:%zu device memory "
        "(address %p) outside a kernel or a runtime copy.\nOn a NeuronCore the host cannot read or write "
        "device memory directly: reach it through the runtime (an op on the tensor, .cpu(), .item(), "
        "copy_()), not through data_ptr() arithmetic or a C++ extension that dereferences device "
        "pointers. The Python stack of the access follows when faulthandler is on (it is, in strict "
        "mode).\n",
        device, static_cast<const void*>(addr));
    if (reported == 0) {
      reported = 1;
      if (n > 0) writeAll(message, std::min(static_cast<size_t>(n), sizeof(message) - 1));
      callPreviousHandler(sig, info, context);  // Python's faulthandler prints the Python stack
    }
    ::signal(SIGSEGV, SIG_DFL);  // the access faults again and ends the process
    return;
  }
  // Not device memory: whoever handled SIGSEGV before.
  if (!callPreviousHandler(sig, info, context)) ::signal(SIGSEGV, SIG_DFL);
}

Arena* strictArena() {
  static Arena* a = [] () -> Arena* {
    const char* env = std::getenv("TORCHNEURON_STRICT");
    if (env == nullptr || std::string(env) != "1") return nullptr;
    auto* made = new Arena();  // lives as long as the process
    // Huge pages: changing the protection of the used range costs per page table entry, and a
    // 2 MiB page needs one where 512 small pages need 512 (a training step launches hundreds
    // of kernels, each opening and closing a window).
    made->page = kHugePage;
    made->span = (deviceCapacity() + made->page - 1) / made->page * made->page;
    const size_t n = static_cast<size_t>(std::max(deviceCount(), 1));
    const size_t bytes = made->span * n + kHugePage;  // room to align the base to a huge page
    void* mapped = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mapped == MAP_FAILED) {
      std::fprintf(stderr, "torchneuron: TORCHNEURON_STRICT=1 could not reserve %zu bytes of address space "
                           "for device memory; strict mode is off\n", bytes);
      delete made;
      return nullptr;
    }
    const auto aligned = (reinterpret_cast<uintptr_t>(mapped) + kHugePage - 1) / kHugePage * kHugePage;
    void* base = reinterpret_cast<void*>(aligned);
    ::madvise(base, made->span * n, MADV_HUGEPAGE);  // a hint: without it small pages work, slower
    made->base = static_cast<char*>(base);
    made->extent.assign(n, 0);
    made->free_ranges.resize(n);
    for (auto& ranges : made->free_ranges) ranges.emplace(0, made->span);
    arena = made;
    return made;
  }();
  return a;
}

void* arenaAllocate(Arena& a, int device, size_t nbytes) {
  const size_t size = arenaSize(nbytes);
  std::lock_guard<std::mutex> lock(a.mutex);
  auto& ranges = a.free_ranges[device];
  for (auto it = ranges.begin(); it != ranges.end(); ++it) {
    if (it->second < size) continue;
    const size_t offset = it->first, left = it->second - size;
    ranges.erase(it);
    if (left > 0) ranges.emplace(offset + size, left);
    const size_t end = (offset + size + a.page - 1) / a.page * a.page;
    if (end > a.extent[device]) {
      // New pages join the protected range, open if a window is.
      if (a.open > 0) ::mprotect(a.base + device * a.span + a.extent[device], end - a.extent[device],
                                 PROT_READ | PROT_WRITE);
      a.extent[device] = end;
    }
    return a.base + device * a.span + offset;
  }
  return nullptr;
}

void arenaFree(Arena& a, int device, void* ptr, size_t nbytes) {
  const size_t size = arenaSize(nbytes);
  const size_t offset = static_cast<size_t>(static_cast<char*>(ptr) - (a.base + device * a.span));
  std::lock_guard<std::mutex> lock(a.mutex);
  // Whole pages inside the range go back to the system.
  const size_t first = (offset + a.page - 1) / a.page * a.page, last = (offset + size) / a.page * a.page;
  if (last > first) ::madvise(a.base + device * a.span + first, last - first, MADV_DONTNEED);
  auto& ranges = a.free_ranges[device];
  auto [it, inserted] = ranges.emplace(offset, size);
  if (it != ranges.begin()) {  // merge with the range before
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      ranges.erase(it);
      it = prev;
    }
  }
  auto next = std::next(it);
  if (next != ranges.end() && it->first + it->second == next->first) {
    it->second += next->second;
    ranges.erase(next);
  }
}

}  // namespace

bool strictMode() { return strictArena() != nullptr; }

void installStrictFaultHandler() {
  if (arena == nullptr) return;
  struct sigaction current {};
  ::sigaction(SIGSEGV, nullptr, &current);
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == &onFault) return;  // first already
  struct sigaction action {};
  action.sa_sigaction = &onFault;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGSEGV, &action, &previous_segv);
}

void deviceAccessBegin() {
  Arena* a = strictArena();
  if (a == nullptr) return;
  std::lock_guard<std::mutex> lock(a->mutex);
  if (a->open++ == 0) protect(*a, PROT_READ | PROT_WRITE);
}

void deviceAccessEnd() {
  Arena* a = strictArena();
  if (a == nullptr) return;
  std::lock_guard<std::mutex> lock(a->mutex);
  if (--a->open == 0) protect(*a, PROT_NONE);
}

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
  if (validDevice(device)) devices()[device].used.fetch_sub(nbytes, std::memory_order_relaxed);
}

Status malloc(int device, void** ptr, size_t nbytes) {
  if (ptr == nullptr) return Status::InvalidValue;
  *ptr = nullptr;
  Status s = reserve(device, nbytes);
  if (s != Status::Success) return s;
  void* p = nullptr;
  if (Arena* a = strictArena()) {
    p = arenaAllocate(*a, device, nbytes);
    if (p == nullptr) {  // the arena is fragmented beyond its capacity
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
  }
  if (Arena* a = strictArena()) arenaFree(*a, block.first, ptr, block.second);
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
  if (kind != CopyKind::HostToHost) handOverHeldWork("copy");
  DeviceAccess access;  // strict mode: a copy may touch device memory
  std::memmove(dst, src, nbytes);
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

}  // namespace torchneuron::rt
