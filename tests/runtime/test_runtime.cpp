// The runtime's contract (csrc/runtime/neuron_runtime.h), tested on the runtime library alone: built
// without PyTorch, as a driver for silicon would be, and called through the C++ conveniences of
// neuron_runtime.inl, as _C calls it. tests/test_runtime_library.py builds and runs it in each mode
// (default, TORCHNEURON_ASYNC=1, TORCHNEURON_STRICT=1, both); each check prints what failed and the
// process exits non-zero.
#include "neuron_runtime.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace rt = torchneuron::rt;

namespace {

int failures = 0;

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                                \
    }                                                                            \
  } while (0)
#define CHECK_OK(status) CHECK((status) == rt::Status::Success)

constexpr size_t kMiB = size_t(1) << 20;

void sleepMs(void* arg) { std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(arg))); }

void testDevices() {
  CHECK(rt::deviceCount() == 2);  // TORCHNEURON_NUM_DEVICES=2, set by the test's runner
  rt::DeviceProperties props{};
  CHECK_OK(rt::getDeviceProperties(0, &props));
  CHECK(props.total_memory == 64 * kMiB);  // TORCHNEURON_DEVICE_MEMORY=64MiB
  CHECK(std::strlen(props.name) > 0);
  CHECK(rt::getDeviceProperties(2, &props) == rt::Status::InvalidDevice);
  CHECK(rt::getDeviceProperties(-1, &props) == rt::Status::InvalidDevice);
  CHECK(rt::getDeviceProperties(0, nullptr) == rt::Status::InvalidValue);
  CHECK(rt::deviceSynchronize(5) == rt::Status::InvalidDevice);
}

void testCapacity() {
  size_t free0 = 0, total = 0;
  CHECK_OK(rt::memGetInfo(1, &free0, &total));
  CHECK(total == 64 * kMiB && free0 == total);
  void* a = nullptr;
  void* b = nullptr;
  CHECK_OK(rt::malloc(1, &a, 48 * kMiB));
  CHECK(a != nullptr);
  size_t free1 = 0;
  CHECK_OK(rt::memGetInfo(1, &free1, &total));
  CHECK(free1 == free0 - 48 * kMiB);
  CHECK(rt::malloc(1, &b, 32 * kMiB) == rt::Status::OutOfMemory);  // above what is left
  CHECK(b == nullptr);
  CHECK(rt::malloc(9, &b, 16) == rt::Status::InvalidDevice);
  int device = -1;
  CHECK_OK(rt::pointerGetDevice(a, &device));
  CHECK(device == 1);
  int local = 0;
  CHECK(rt::pointerGetDevice(&local, &device) == rt::Status::InvalidValue);
  CHECK_OK(rt::free(a));
  CHECK_OK(rt::memGetInfo(1, &free1, &total));
  CHECK(free1 == free0);
  CHECK(rt::free(&local) == rt::Status::InvalidValue);  // not the runtime's
  CHECK_OK(rt::free(nullptr));
  // reserve/release: bytes a kernel produced in place, charged against the same capacity.
  CHECK_OK(rt::reserve(1, 60 * kMiB));
  CHECK(rt::malloc(1, &b, 8 * kMiB) == rt::Status::OutOfMemory);
  rt::release(1, 60 * kMiB);
  CHECK_OK(rt::malloc(1, &b, 8 * kMiB));
  CHECK_OK(rt::free(b));
}

void testCopies() {
  void* d0 = nullptr;
  void* d1 = nullptr;
  CHECK_OK(rt::malloc(0, &d0, 4096));
  CHECK_OK(rt::malloc(1, &d1, 4096));
  std::vector<unsigned char> host(4096), back(4096, 0);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<unsigned char>(i * 7);
  CHECK_OK(rt::memcpy(d0, host.data(), host.size(), rt::CopyKind::HostToDevice));
  CHECK_OK(rt::memcpy(d1, d0, host.size(), rt::CopyKind::DeviceToDevice));
  CHECK_OK(rt::memcpy(back.data(), d1, back.size(), rt::CopyKind::DeviceToHost));
  CHECK(back == host);
  CHECK(rt::memcpy(nullptr, d0, 16, rt::CopyKind::DeviceToHost) == rt::Status::InvalidValue);
  CHECK_OK(rt::memcpy(nullptr, nullptr, 0, rt::CopyKind::DeviceToHost));  // nothing to copy
  void* pinned = nullptr;
  CHECK_OK(rt::hostMalloc(&pinned, 256));
  CHECK(rt::isHostPinned(pinned) && rt::isHostPinned(static_cast<char*>(pinned) + 100));
  CHECK(!rt::isHostPinned(host.data()));
  CHECK_OK(rt::hostFree(pinned));
  CHECK(rt::hostFree(host.data()) == rt::Status::InvalidValue);
  CHECK_OK(rt::free(d0));
  CHECK_OK(rt::free(d1));
}

// memset: the bytes asked for, and only those, also when whole pages inside go back to the host.
void testMemset() {
  for (size_t size : {size_t(4096), 4 * kMiB + 123}) {  // a heap block, and a mapping of its own
    void* d = nullptr;
    CHECK_OK(rt::malloc(0, &d, size));
    std::vector<unsigned char> expected(size, 0xAB), back(size, 0);
    CHECK_OK(rt::memcpy(d, expected.data(), size, rt::CopyKind::HostToDevice));
    auto* p = static_cast<unsigned char*>(d);
    const size_t start = 5, zeros = size - 17, tail = size / 2;
    CHECK_OK(rt::memset(p + start, 0, zeros));  // ragged ends, whole pages between
    std::fill(expected.begin() + start, expected.begin() + start + zeros, 0);
    CHECK_OK(rt::memset(p + tail, 7, 100));
    std::fill(expected.begin() + tail, expected.begin() + tail + 100, 7);
    CHECK_OK(rt::memcpy(back.data(), d, size, rt::CopyKind::DeviceToHost));
    CHECK(back == expected);
    // Zeroed pages read zeros and take writes again.
    CHECK_OK(rt::memcpy(p + size / 3, expected.data(), 64, rt::CopyKind::HostToDevice));
    std::copy(expected.begin(), expected.begin() + 64, back.begin());
    CHECK_OK(rt::memcpy(back.data() + 64, p + size / 3, 64, rt::CopyKind::DeviceToHost));
    CHECK(std::equal(back.begin(), back.begin() + 64, back.begin() + 64));
    CHECK_OK(rt::free(d));
  }
  CHECK(rt::memset(nullptr, 0, 16) == rt::Status::InvalidValue);
  CHECK_OK(rt::memset(nullptr, 0, 0));  // nothing to set
}

struct Appender {
  std::vector<int>* order;
  int value;
};

void testLaunchAndStreamOrder() {
  // A blocking launch runs fn on the calling thread, inside a kernel, and its exception reaches the caller.
  bool ran = false, inside = false;
  auto body = [](void* p) {
    auto* flags = static_cast<std::pair<bool*, bool*>*>(p);
    *flags->first = true;
    *flags->second = rt::insideKernel();
  };
  std::pair<bool*, bool*> flags{&ran, &inside};
  CHECK_OK(rt::launchKernel(0, 0, body, &flags));
  CHECK(ran && inside && !rt::insideKernel());
  bool raised = false;
  try {
    rt::launchKernel(0, 0, [](void*) { throw std::runtime_error("boom"); }, nullptr);
  } catch (const std::runtime_error& e) {
    raised = std::string(e.what()) == "boom";
  }
  CHECK(raised);
  // The work's exception is caught on the caller's side of the C boundary and raised again as it was.
  struct Custom {
    int code;
  };
  int code = 0;
  try {
    rt::launchKernel(0, 0, [](void*) { throw Custom{7}; }, nullptr);
  } catch (const Custom& e) {
    code = e.code;
  }
  CHECK(code == 7);
  CHECK(!rt::insideKernel());
  CHECK(rt::launchKernel(0, 0, nullptr, nullptr) == rt::Status::InvalidValue);
  CHECK(rt::launchKernel(3, 0, body, &flags) == rt::Status::InvalidDevice);

  // Work on one stream runs in submission order; drop runs after each fn.
  std::vector<int> order;
  std::atomic<int> drops{0};
  static std::atomic<int>* drop_count = nullptr;
  drop_count = &drops;
  int ms = 20;
  CHECK_OK(rt::enqueueKernel(0, 1, sleepMs, &ms, nullptr));  // the later ones queue behind it
  for (int i = 0; i < 50; ++i) {
    CHECK_OK(rt::enqueueKernel(
        0, 1, [](void* p) { auto* a = static_cast<Appender*>(p); a->order->push_back(a->value); },
        new Appender{&order, i}, [](void* p) { delete static_cast<Appender*>(p); drop_count->fetch_add(1); }));
  }
  if (rt::asyncMode()) CHECK(rt::streamQuery(0, 1) == rt::Status::NotReady);
  CHECK_OK(rt::streamSynchronize(0, 1));
  CHECK_OK(rt::streamQuery(0, 1));
  CHECK(order.size() == 50);
  bool in_order = true;
  for (int i = 0; i < static_cast<int>(order.size()); ++i) in_order = in_order && order[i] == i;
  CHECK(in_order);
  CHECK(drops.load() == 50);
  // An invalid launch still drops its argument.
  CHECK(rt::enqueueKernel(0, 1, nullptr, new Appender{&order, 0},
                          [](void* p) { delete static_cast<Appender*>(p); drop_count->fetch_add(1); }) ==
        rt::Status::InvalidValue);
  CHECK(drops.load() == 51);
}

void testAsyncErrors() {
  auto breaks = [] {
    return rt::enqueueKernel(0, 2, [](void*) { throw std::runtime_error("kernel broke"); }, nullptr, nullptr,
                             {rt::ActivityKind::Kernel, "breaks"});
  };
  if (!rt::asyncMode()) {  // synchronous: the exception reaches the caller
    bool raised = false;
    try {
      breaks();
    } catch (const std::runtime_error& e) {
      raised = std::string(e.what()) == "kernel broke";
    }
    CHECK(raised);
  } else {
    CHECK_OK(breaks());
    // Kept for the next call that waits on the device, once.
    CHECK(rt::streamSynchronize(0, 2) == rt::Status::KernelFailed);
    const std::string error = rt::asyncError(0);
    CHECK(error.find("breaks") != std::string::npos && error.find("kernel broke") != std::string::npos);
    CHECK_OK(rt::streamSynchronize(0, 2));
    CHECK(rt::asyncError(0).empty());
  }
}

void testEvents() {
  rt::Event start = nullptr, end = nullptr, plain = nullptr;
  CHECK_OK(rt::eventCreate(&start, true));
  CHECK_OK(rt::eventCreate(&end, true));
  CHECK_OK(rt::eventCreate(&plain, false));
  CHECK(rt::eventDevice(start) == -1);
  CHECK_OK(rt::eventQuery(start));  // never recorded: done
  int ms = 60;
  CHECK_OK(rt::eventRecord(start, 1, 3));
  CHECK_OK(rt::enqueueKernel(1, 3, sleepMs, &ms, nullptr));
  CHECK_OK(rt::eventRecord(end, 1, 3));
  CHECK(rt::eventDevice(end) == 1);
  if (rt::asyncMode()) {
    CHECK(rt::eventQuery(end) == rt::Status::NotReady);
    float early = 0;
    CHECK(rt::eventElapsedTime(&early, start, end) == rt::Status::NotReady);
  }
  // Stream 4 waits for stream 3's event: its work sees stream 3's work done.
  static std::atomic<bool>* seen = nullptr;
  std::atomic<bool> flag{false}, after{false};
  seen = &flag;
  CHECK_OK(rt::enqueueKernel(1, 3, [](void*) { seen->store(true); }, nullptr, nullptr));
  CHECK_OK(rt::eventRecord(plain, 1, 3));
  CHECK_OK(rt::streamWaitEvent(1, 4, plain));
  static std::atomic<bool>* observed = nullptr;
  observed = &after;
  CHECK_OK(rt::enqueueKernel(1, 4, [](void*) { observed->store(seen->load()); }, nullptr, nullptr));
  CHECK_OK(rt::streamSynchronize(1, 4));
  CHECK(after.load());
  CHECK_OK(rt::eventSynchronize(end));
  CHECK_OK(rt::eventQuery(end));
  float elapsed = 0;
  CHECK_OK(rt::eventElapsedTime(&elapsed, start, end));
  if (rt::asyncMode()) CHECK(elapsed >= 50.0f);  // the sleep ran between the two records
  CHECK(rt::eventElapsedTime(&elapsed, start, plain) == rt::Status::InvalidValue);  // not timed
  CHECK(rt::eventRecord(nullptr, 0, 0) == rt::Status::InvalidValue);
  CHECK_OK(rt::eventDestroy(start));
  CHECK_OK(rt::eventDestroy(end));
  CHECK_OK(rt::eventDestroy(plain));
  CHECK_OK(rt::deviceSynchronize(1));
}

void testActivityRecords() {
  rt::activityStart();
  CHECK(rt::activityRecording());
  rt::activityPushExternalCorrelation(42);
  CHECK_OK(rt::launchKernel(0, 0, [](void*) {}, nullptr, {rt::ActivityKind::Kernel, "first"}));
  rt::activityPopExternalCorrelation();
  int ms = 5;
  CHECK_OK(rt::enqueueKernel(0, 5, sleepMs, &ms, nullptr, {rt::ActivityKind::Kernel, "second"}));
  std::vector<char> host(1024), dev_buf(1);
  void* d = nullptr;
  CHECK_OK(rt::malloc(0, &d, host.size()));
  CHECK_OK(rt::launchKernel(0, 0, [](void*) {}, nullptr, {rt::ActivityKind::Memcpy, "Memcpy HtoD", 1024}));
  CHECK_OK(rt::deviceSynchronize(0));
  rt::activityStop();
  CHECK(!rt::activityRecording());
  CHECK_OK(rt::launchKernel(0, 0, [](void*) {}, nullptr, {rt::ActivityKind::Kernel, "unrecorded"}));
  auto records = rt::activityDrain();
  CHECK(records.size() == 3);
  if (records.size() == 3) {
    const rt::ActivityRecord* first = nullptr;
    const rt::ActivityRecord* second = nullptr;
    const rt::ActivityRecord* copy = nullptr;
    for (const auto& r : records) {
      if (r.name == "first") first = &r;
      if (r.name == "second") second = &r;
      if (r.name == "Memcpy HtoD") copy = &r;
      CHECK(r.launch_ns <= r.start_ns && r.start_ns <= r.end_ns && r.device == 0);
    }
    CHECK(first && second && copy);
    if (first && second && copy) {
      CHECK(first->correlation == 42 && second->correlation == 0);
      CHECK(second->stream == 5 && first->stream == 0);
      CHECK(copy->kind == rt::ActivityKind::Memcpy && copy->bytes == 1024);
      CHECK(first->sequence < second->sequence && second->sequence < copy->sequence);
      CHECK(second->end_ns - second->start_ns >= 4'000'000);  // its 5 ms on the device
    }
  }
  CHECK(rt::activityDrain().empty());
  CHECK_OK(rt::free(d));

  // A launch from inside another's body is nested; annotations go to the innermost running work,
  // also on a stream's worker, and to nothing outside a launch.
  rt::activityStart();
  rt::activityAnnotate("outside", "any launch");
  auto inner = [](void*) { rt::activityAnnotate("engine", "VectorE"); };
  auto outer = [](void* inner_fn) {
    rt::activityAnnotate("kernel", "outer");
    CHECK_OK(rt::launchKernel(0, 0, reinterpret_cast<rt::KernelFn>(inner_fn), nullptr,
                              {rt::ActivityKind::Kernel, "inner"}));
  };
  CHECK_OK(rt::launchKernel(0, 0, outer, reinterpret_cast<void*>(+inner), {rt::ActivityKind::Kernel, "outer"}));
  CHECK_OK(rt::enqueueKernel(0, 5, [](void*) { rt::activityAnnotate("on", "worker"); }, nullptr, nullptr,
                             {rt::ActivityKind::Kernel, "queued"}));
  CHECK_OK(rt::deviceSynchronize(0));
  rt::activityStop();
  records = rt::activityDrain();
  CHECK(records.size() == 3);
  using Args = std::vector<std::pair<std::string, std::string>>;
  const Args outer_args{{"kernel", "outer"}}, inner_args{{"engine", "VectorE"}}, queued_args{{"on", "worker"}};
  for (const auto& r : records) {
    if (r.name == "outer") CHECK(!r.nested && r.args == outer_args);
    else if (r.name == "inner") CHECK(r.nested && r.args == inner_args);
    else CHECK(r.name == "queued" && !r.nested && r.args == queued_args);
  }
}

// Runs `access` in a child process: whether it was stopped by SIGSEGV (strict mode's fault).
template <class F>
bool faultsInChild(F access) {
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::signal(SIGSEGV, SIG_DFL);
    rt::installStrictFaultHandler();
    access();
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV;
}

void testStrictProtection() {
  if (!rt::strictMode()) return;
  char* a = nullptr;
  char* b = nullptr;
  CHECK_OK(rt::malloc(0, reinterpret_cast<void**>(&a), 1 * kMiB));
  CHECK_OK(rt::malloc(0, reinterpret_cast<void**>(&b), 1 * kMiB));
  const char ones[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  CHECK_OK(rt::memcpy(a, ones, sizeof(ones), rt::CopyKind::HostToDevice));  // a copy reaches its own memory
  // Outside any window: device memory faults, host memory does not.
  CHECK(faultsInChild([&] { volatile char c = a[0]; (void)c; }));
  CHECK(!faultsInChild([&] { volatile char c = ones[0]; (void)c; }));
  {
    // A window opens its ranges only.
    const rt::MemoryRange ranges[] = {{a, 1 * kMiB}};
    rt::DeviceAccess access(ranges, 1);
    CHECK(a[0] == 1);
    a[1] = 2;
    CHECK(faultsInChild([&] { volatile char c = b[0]; (void)c; }));
    rt::deviceAccessAdd(b, 16);  // joins the window
    b[0] = 3;
    CHECK(rt::deviceAccessRanges().size() == 2);
    {
      const rt::MemoryRange inner[] = {{a, 16}};
      rt::DeviceAccess nested(inner, 1);  // windows nest; the page stays open until both close
    }
    CHECK(a[1] == 2);
  }
  CHECK(faultsInChild([&] { volatile char c = a[0]; (void)c; }));
  CHECK(faultsInChild([&] { volatile char c = b[0]; (void)c; }));
  {
    const rt::MemoryRange range[] = {{b, 16}};
    rt::DeviceAccess held(range, 1, rt::DeviceAccess::NoThread);  // open to all threads while it lives
    volatile char c = 0;
    std::thread([&] { c = b[0]; }).join();
    CHECK(c == 3);
  }
  CHECK(faultsInChild([&] { volatile char c = b[0]; (void)c; }));
  // Work launched with a range reaches it on its stream's worker; once the host has synchronized,
  // nothing of it is open.
  const rt::MemoryRange ranges[] = {{b, 1 * kMiB}};
  rt::LaunchInfo info{rt::ActivityKind::Kernel, "writes b"};
  info.ranges = ranges;
  info.range_count = 1;
  CHECK_OK(rt::enqueueKernel(0, 6, [](void* p) { static_cast<char*>(p)[8] = 9; }, b, nullptr, info));
  CHECK_OK(rt::streamSynchronize(0, 6));
  CHECK(faultsInChild([&] { volatile char c = b[8]; (void)c; }));
  char back = 0;
  CHECK_OK(rt::memcpy(&back, b + 8, 1, rt::CopyKind::DeviceToHost));
  CHECK(back == 9);
  // While a side stream runs other work, this memory still faults.
  int ms = 300;
  CHECK_OK(rt::enqueueKernel(0, 7, sleepMs, &ms, nullptr));
  CHECK(faultsInChild([&] { volatile char c = a[0]; (void)c; }));
  CHECK_OK(rt::streamSynchronize(0, 7));
  CHECK_OK(rt::free(a));
  CHECK_OK(rt::free(b));
}

}  // namespace

int main() {
  testDevices();
  testCapacity();
  testCopies();
  testMemset();
  testLaunchAndStreamOrder();
  testAsyncErrors();
  testEvents();
  testActivityRecords();
  testStrictProtection();
  std::printf("runtime contract: %s (async %d, strict %d)\n", failures == 0 ? "ok" : "FAILED", rt::asyncMode(),
              rt::strictMode());
  return failures == 0 ? 0 : 1;
}
