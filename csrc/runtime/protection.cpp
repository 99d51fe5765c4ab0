// Emulated NeuronCore, strict mode (TORCHNEURON_STRICT=1): device memory out of the host's reach
// except the memory of the work that runs now.
//
// Each device's memory is a range of one reserved mapping (its capacity, no pages committed up
// front), carved first fit, and PROT_NONE. A window opens the pages of its ranges (read and write)
// and closes them when it ends; each page counts the windows that open it, so windows of work that
// runs at the same time (streams' workers, a collective gloo holds, a blocking launch) open their
// union. A fault inside the mapping outside every window is reported and ends the process.
#include "runtime.h"
#include "protection.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace torchneuron::emu {

namespace {

constexpr size_t kArenaAlignment = 512;

struct Arena {
  char* base = nullptr;                 // of device 0; device d starts at base + d * span
  size_t span = 0;                      // bytes per device, whole pages
  size_t page = 4096;                   // the granularity of protection and of returning memory
  std::vector<std::map<size_t, size_t>> free_ranges;  // per device: offset -> size
  std::vector<std::vector<uint32_t>> opens;           // per device, per page: the windows opening it
  std::vector<int> whole;                             // per device: the windows opening all of it
  std::vector<size_t> extent;                         // per device: pages below the highest allocation's end
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
  if (arena != nullptr && addr >= arena->base && addr < arena->base + arena->span * arena->opens.size()) {
    const auto device = static_cast<size_t>(addr - arena->base) / arena->span;
    char message[700];
    const int n = std::snprintf(
        message, sizeof(message),
        "\ntorchneuron strict mode (TORCHNEURON_STRICT=1): the host accessed neuron:%zu device memory "
        "(address %p) that no running kernel, copy or collective was given.\nOn a NeuronCore the host "
        "cannot read or write device memory directly: reach it through the runtime (an op on the "
        "tensor, .cpu(), .item(), copy_()), not through data_ptr() arithmetic or a C++ extension that "
        "dereferences device pointers. The Python stack of the access follows when faulthandler is on "
        "(it is, in strict mode).\n",
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
    made->page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    made->span = (deviceCapacity() + made->page - 1) / made->page * made->page;
    const size_t n = static_cast<size_t>(std::max(deviceCount(), 1));
    void* mapped = ::mmap(nullptr, made->span * n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mapped == MAP_FAILED) {
      std::fprintf(stderr, "torchneuron: TORCHNEURON_STRICT=1 could not reserve %zu bytes of address space "
                           "for device memory; strict mode is off\n", made->span * n);
      delete made;
      return nullptr;
    }
    made->base = static_cast<char*>(mapped);
    made->free_ranges.resize(n);
    for (auto& ranges : made->free_ranges) ranges.emplace(0, made->span);
    made->opens.resize(n);
    made->whole.assign(n, 0);
    made->extent.assign(n, 0);
    arena = made;
    return made;
  }();
  return a;
}

// ---- windows ------------------------------------------------------------------------------------

struct Pages {  // pages [first, last) of a device
  size_t device, first, last;
};

void protectPages(Arena& a, size_t device, size_t first, size_t last, int prot) {
  if (last > first) ::mprotect(a.base + device * a.span + first * a.page, (last - first) * a.page, prot);
}

// The pages of [ptr, ptr + nbytes) when it is device memory (false: it is not, or is empty).
bool pagesOf(const Arena& a, const void* ptr, size_t nbytes, Pages* pages) {
  const auto* p = static_cast<const char*>(ptr);
  if (nbytes == 0 || p < a.base || p >= a.base + a.span * a.opens.size()) return false;
  const size_t offset = static_cast<size_t>(p - a.base);
  pages->device = offset / a.span;
  const size_t start = offset - pages->device * a.span;
  pages->first = start / a.page;
  pages->last = (std::min(start + nbytes, a.span) + a.page - 1) / a.page;
  return true;
}

// Counts a window in pages [first, last) of a device (delta +1) or out of them (-1), changing the
// protection of each run of pages whose count leaves or reaches zero. Under the arena's lock.
void countPagesLocked(Arena& a, const Pages& p, int delta) {
  auto& count = a.opens[p.device];
  if (count.size() < p.last) count.resize(p.last, 0);
  const bool whole = a.whole[p.device] > 0;  // all of it is open anyway
  const int prot = delta > 0 ? PROT_READ | PROT_WRITE : PROT_NONE;
  size_t run = p.first;  // start of the current run of pages changing protection
  bool in_run = false;
  for (size_t i = p.first; i < p.last; ++i) {
    const bool changes = delta > 0 ? count[i]++ == 0 : --count[i] == 0;
    if (changes && !whole) {
      if (!in_run) run = i, in_run = true;
    } else if (in_run) {
      protectPages(a, p.device, run, i, prot);
      in_run = false;
    }
  }
  if (in_run) protectPages(a, p.device, run, p.last, prot);
}

// Counts a window in all of a device's memory, or out of it (then every page no other window
// opens is closed again).
void countWholeLocked(Arena& a, size_t device, int delta) {
  if (delta > 0) {
    if (a.whole[device]++ == 0) protectPages(a, device, 0, a.extent[device], PROT_READ | PROT_WRITE);
    return;
  }
  if (--a.whole[device] > 0) return;
  const auto& count = a.opens[device];
  size_t run = 0;
  for (size_t i = 0; i <= a.extent[device]; ++i) {
    const bool open = i < a.extent[device] && i < count.size() && count[i] > 0;
    if (open || i == a.extent[device]) {
      protectPages(a, device, run, i, PROT_NONE);
      run = i + 1;
    }
  }
}

struct Window {
  std::vector<Pages> pages;            // counted in
  std::vector<MemoryRange> ranges;     // as given
  std::vector<size_t> whole_devices;   // counted in whole

  // The ranges a piece of work was launched with: their pages in order, overlapping and adjacent
  // ones joined (an op's tensors often lie side by side in one segment), under one lock.
  void addAll(Arena& a, const MemoryRange* given, size_t count) {
    if (count == 0) return;
    const size_t start = pages.size();
    for (size_t i = 0; i < count; ++i) {
      Pages p;
      if (pagesOf(a, given[i].ptr, given[i].nbytes, &p)) pages.push_back(p);
      ranges.push_back(given[i]);
    }
    std::sort(pages.begin() + start, pages.end(), [](const Pages& x, const Pages& y) {
      return x.device != y.device ? x.device < y.device : x.first < y.first;
    });
    size_t kept = start;
    for (size_t i = start; i < pages.size(); ++i) {
      if (kept > start && pages[kept - 1].device == pages[i].device && pages[i].first <= pages[kept - 1].last)
        pages[kept - 1].last = std::max(pages[kept - 1].last, pages[i].last);
      else
        pages[kept++] = pages[i];
    }
    pages.resize(kept);
    std::lock_guard<std::mutex> lock(a.mutex);
    for (size_t i = start; i < pages.size(); ++i) countPagesLocked(a, pages[i], +1);
  }

  void addDevice(Arena& a, size_t device) {
    if (device >= a.opens.size()) return;
    std::lock_guard<std::mutex> lock(a.mutex);
    countWholeLocked(a, device, +1);
    whole_devices.push_back(device);
    ranges.push_back({a.base + device * a.span, a.extent[device] * a.page});
  }

  void close(Arena& a) {
    std::lock_guard<std::mutex> lock(a.mutex);
    for (const auto& p : pages) countPagesLocked(a, p, -1);
    for (auto d : whole_devices) countWholeLocked(a, d, -1);
  }
};

thread_local std::vector<Window*> t_windows;  // this thread's open windows, innermost last

}  // namespace

// ---- memory ---------------------------------------------------------------------------------------

void* protectedAllocate(int device, size_t nbytes) {
  Arena& a = *strictArena();
  const size_t size = arenaSize(nbytes);
  std::lock_guard<std::mutex> lock(a.mutex);
  auto& ranges = a.free_ranges[device];
  for (auto it = ranges.begin(); it != ranges.end(); ++it) {
    if (it->second < size) continue;
    const size_t offset = it->first, left = it->second - size;
    ranges.erase(it);
    if (left > 0) ranges.emplace(offset + size, left);
    const size_t end = (offset + size + a.page - 1) / a.page;
    if (end > a.extent[device]) {
      // New pages are closed unless a window opens all of the device.
      if (a.whole[device] > 0)
        protectPages(a, static_cast<size_t>(device), a.extent[device], end, PROT_READ | PROT_WRITE);
      a.extent[device] = end;
    }
    return a.base + device * a.span + offset;
  }
  return nullptr;
}

void protectedFree(int device, void* ptr, size_t nbytes) {
  Arena& a = *strictArena();
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

// ---- the interface ------------------------------------------------------------------------------

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

DeviceAccess::DeviceAccess(const MemoryRange* ranges, size_t count, Owner owner) : window_(nullptr), owner_(owner) {
  Arena* a = strictArena();
  if (a == nullptr) return;
  auto* w = new Window();
  w->addAll(*a, ranges, count);
  if (owner_ == ThisThread) t_windows.push_back(w);
  window_ = w;
}

DeviceAccess::~DeviceAccess() {
  if (window_ == nullptr) return;
  auto* w = static_cast<Window*>(window_);
  w->close(*arena);
  // Usually the innermost; a stream's worker opens its next work's window before it closes the last.
  if (owner_ == ThisThread) t_windows.erase(std::find(t_windows.begin(), t_windows.end(), w));
  delete w;
}

void deviceAccessAdd(const void* ptr, size_t nbytes) {
  if (arena == nullptr || t_windows.empty()) return;
  const MemoryRange range{ptr, nbytes};
  t_windows.back()->addAll(*arena, &range, 1);
}

void deviceAccessAddDevice(int device) {
  if (arena == nullptr || t_windows.empty() || device < 0) return;
  t_windows.back()->addDevice(*arena, static_cast<size_t>(device));
}

std::vector<MemoryRange> deviceAccessRanges() {
  if (arena == nullptr || t_windows.empty()) return {};
  return t_windows.back()->ranges;
}

}  // namespace torchneuron::emu
