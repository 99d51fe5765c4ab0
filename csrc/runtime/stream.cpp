// Emulated NeuronCore: streams, events and kernel launch.
//
// Synchronous mode: kernels run to completion on the launching thread, so
// every stream is idle whenever the host looks at it; ordering between streams
// therefore always holds. Events record the time at which all earlier work on
// their stream was done, which is what elapsed_time() reports.
//
// Asynchronous mode (TORCHNEURON_ASYNC=1, or strict mode unless TORCHNEURON_ASYNC=0): each stream that
// receives work gets a queue and a worker thread that runs it in order. A
// stream counts the work submitted to it and the work completed; an event
// recorded on a stream is a marker in that queue, done when the stream's
// completed count reaches it. Streams live as long as the process.
#include "runtime.h"
#include "checks.h"

#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace torchneuron::emu {

namespace {

bool validDevice(int device) { return device >= 0 && device < deviceCount(); }

using Clock = std::chrono::steady_clock;

// What an event's record became: done when its stream has completed `ticket` pieces of work.
struct Mark {
  std::mutex mutex;
  bool timed = false;
  Clock::time_point time;
};

struct Work {
  KernelFn fn = nullptr;
  void* arg = nullptr;
  void* context = nullptr;
  KernelDrop drop = nullptr;
  std::string name;
  std::vector<MemoryRange> ranges;  // the device memory it reaches (strict mode opens only these)
  bool recorded = false;
  ActivityRecord record{};
};

struct StreamState {
  int device = 0;
  Stream id = 0;
  std::mutex mutex;
  std::condition_variable has_work;
  std::condition_variable progressed;
  std::deque<Work> queue;
  uint64_t submitted = 0;  // guarded by mutex
  uint64_t completed = 0;  // guarded by mutex
  bool worker = false;     // a worker thread serves the queue

  // Waits until the stream has completed `ticket` pieces of work.
  void waitFor(uint64_t ticket) {
    std::unique_lock<std::mutex> lock(mutex);
    progressed.wait(lock, [&] { return completed >= ticket; });
  }
};

struct Registry {
  std::mutex mutex;
  std::map<std::pair<int, Stream>, StreamState*> streams;  // never freed
  std::vector<std::string> errors;                          // per device: the first async failure
};

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry();
    reg->errors.resize(deviceCount());
    return reg;
  }();
  return *r;
}

void noteError(int device, const std::string& message) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.errors[device].empty()) r.errors[device] = message;
}

// What an exception that work let out says (it should have returned a message instead).
std::string unexpectedException() {
  try {
    throw;
  } catch (const std::exception& e) {
    return std::string("an exception left the work: ") + e.what();
  } catch (...) {
    return "an exception left the work";
  }
}

bool hasError(int device) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return !r.errors[device].empty();
}

void runWork(Work& w, int device) {
  if (w.recorded) w.record.start_ns = activityClockNs();
  ActivityRecord* outer = activitySwapRunning(w.recorded ? &w.record : nullptr);
  try {
    if (const char* error = w.fn(w.arg, w.context)) noteError(device, std::string(w.name) + ": " + error);
  } catch (...) {  // work must not raise (neuron_runtime.h); the stream goes on all the same
    noteError(device, std::string(w.name) + ": " + unexpectedException());
  }
  activitySwapRunning(outer);
  if (w.recorded) activityEnd(std::move(w.record));
  if (w.drop != nullptr) w.drop(w.arg);
}

// A piece of work's window (strict mode: the memory it reaches) is open from before it runs until
// before its completion is told; when more work is queued, the next one's window opens before this
// one's closes, so memory both reach (an op's result that the next op reads) stays open between them.
// (Outside strict mode there is no window, and nothing to allocate for one.)
std::unique_ptr<DeviceAccess> windowOf(const Work& w) {
  if (!strictMode()) return nullptr;
  return std::make_unique<DeviceAccess>(w.ranges.data(), w.ranges.size());
}

// Takes the stream's next piece of work into `w`: waiting for one, or (`wait` false) only if one is queued.
bool takeWork(StreamState* s, Work* w, bool wait) {
  std::unique_lock<std::mutex> lock(s->mutex);
  if (wait) s->has_work.wait(lock, [&] { return !s->queue.empty(); });
  if (s->queue.empty()) return false;
  *w = std::move(s->queue.front());
  s->queue.pop_front();
  return true;
}

void serve(StreamState* s) {
  Work w;
  takeWork(s, &w, true);
  auto window = windowOf(w);
  for (;;) {
    runWork(w, s->device);
    Work next;
    const bool more = takeWork(s, &next, false);
    std::unique_ptr<DeviceAccess> next_window = more ? windowOf(next) : nullptr;
    window.reset();
    {
      std::lock_guard<std::mutex> lock(s->mutex);
      ++s->completed;
    }
    s->progressed.notify_all();
    if (!more) {
      takeWork(s, &next, true);
      next_window = windowOf(next);
    }
    w = std::move(next);
    window = std::move(next_window);
  }
}

// fork(): the child has no workers. Each stream is quiesced across the fork (its lock held), and
// the child's streams start idle, their queues forgotten, as CUDA's state is unusable after fork.
void beforeFork();
void afterForkParent();
void afterForkChild();

StreamState* streamState(int device, Stream id) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto& s = r.streams[{device, id}];
  if (s == nullptr) {
    static std::once_flag fork_handlers;
    std::call_once(fork_handlers, [] { pthread_atfork(&beforeFork, &afterForkParent, &afterForkChild); });
    s = new StreamState();
    s->device = device;
    s->id = id;
  }
  return s;
}

void beforeFork() {
  auto& r = registry();
  r.mutex.lock();
  for (auto& [key, s] : r.streams) s->mutex.lock();
}

void afterForkParent() {
  auto& r = registry();
  for (auto& [key, s] : r.streams) s->mutex.unlock();
  r.mutex.unlock();
}

void afterForkChild() {
  auto& r = registry();
  for (auto& [key, s] : r.streams) {
    s->queue.clear();
    s->completed = s->submitted;
    s->worker = false;
    s->mutex.unlock();
  }
  r.mutex.unlock();
}

// Queues work on a stream (starting its worker the first time) and returns its ticket.
uint64_t submit(StreamState* s, Work w) {
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(s->mutex);
    if (!s->worker) {
      std::thread(serve, s).detach();
      s->worker = true;
    }
    s->queue.push_back(std::move(w));
    ticket = ++s->submitted;
  }
  s->has_work.notify_one();
  return ticket;
}

uint64_t submittedSoFar(StreamState* s) {
  std::lock_guard<std::mutex> lock(s->mutex);
  return s->submitted;
}

// The device's asynchronous error, as a status (and kept for asyncError()).
Status deviceStatus(int device) { return hasError(device) ? Status::KernelFailed : Status::Success; }

}  // namespace
}  // namespace torchneuron::emu

// An event (tnrtEvent).
struct tnrtEventImpl {
  using StreamState = torchneuron::emu::StreamState;
  using Mark = torchneuron::emu::Mark;
  using Clock = torchneuron::emu::Clock;

  bool enable_timing = false;
  bool recorded = false;
  int device = -1;
  StreamState* stream = nullptr;  // asynchronous mode: the stream of the last record
  uint64_t ticket = 0;            // ... and its marker's place in that stream's work
  std::shared_ptr<Mark> mark;     // ... and when the marker ran
  Clock::time_point time;         // synchronous mode: when it was recorded

  bool done() const {
    if (stream == nullptr) return true;
    std::lock_guard<std::mutex> lock(stream->mutex);
    return stream->completed >= ticket;
  }
  Clock::time_point when() const {
    if (!mark) return time;
    std::lock_guard<std::mutex> lock(mark->mutex);
    return mark->time;
  }
};

namespace torchneuron::emu {

bool asyncMode() {
  static const bool on = [] {
    const char* env = std::getenv("TORCHNEURON_ASYNC");
    if (env != nullptr && *env != '\0') return std::strcmp(env, "0") != 0;
    return strictMode();
  }();
  return on;
}

size_t asyncErrorInto(int device, char* buffer, size_t capacity) {
  if (!validDevice(device)) return 0;
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::string& error = r.errors[device];
  const size_t length = error.size();
  if (length == 0 || buffer == nullptr || capacity <= length) return length;
  std::memcpy(buffer, error.data(), length);
  buffer[length] = '\0';
  error.clear();
  return length;
}


Status streamSynchronize(int device, Stream stream) {
  if (!validDevice(device)) return Status::InvalidDevice;
  if (asyncMode()) {
    StreamState* s = streamState(device, stream);
    s->waitFor(submittedSoFar(s));
  }
  return deviceStatus(device);
}

Status deviceSynchronize(int device) {
  if (!validDevice(device)) return Status::InvalidDevice;
  if (asyncMode()) {
    std::vector<StreamState*> streams;
    {
      auto& r = registry();
      std::lock_guard<std::mutex> lock(r.mutex);
      for (auto& [key, s] : r.streams)
        if (key.first == device) streams.push_back(s);
    }
    for (StreamState* s : streams) s->waitFor(submittedSoFar(s));
  }
  return deviceStatus(device);
}

Status streamQuery(int device, Stream stream) {
  if (!validDevice(device)) return Status::InvalidDevice;
  if (!asyncMode()) return Status::Success;
  StreamState* s = streamState(device, stream);
  std::lock_guard<std::mutex> lock(s->mutex);
  return s->completed >= s->submitted ? Status::Success : Status::NotReady;
}

Status streamWaitEvent(int device, Stream stream, Event event) {
  if (!validDevice(device)) return Status::InvalidDevice;
  if (event == nullptr) return Status::InvalidValue;
  if (!asyncMode() || !event->recorded || event->done()) return Status::Success;
  // A piece of work on `stream` that waits for the event's marker.
  struct Wait {
    StreamState* on;
    uint64_t ticket;
  };
  Work w;
  w.fn = [](void* p, void*) -> const char* {
    auto* wait = static_cast<Wait*>(p);
    wait->on->waitFor(wait->ticket);
    return nullptr;
  };
  w.arg = new Wait{event->stream, event->ticket};
  w.drop = [](void* p) { delete static_cast<Wait*>(p); };
  w.name = "wait_event";
  submit(streamState(device, stream), std::move(w));
  return Status::Success;
}

Status eventCreate(Event* event, bool enable_timing) {
  if (event == nullptr) return Status::InvalidValue;
  *event = new tnrtEventImpl();
  (*event)->enable_timing = enable_timing;
  return Status::Success;
}

Status eventDestroy(Event event) {
  delete event;
  return Status::Success;
}

Status eventRecord(Event event, int device, Stream stream) {
  if (event == nullptr) return Status::InvalidValue;
  if (!validDevice(device)) return Status::InvalidDevice;
  event->device = device;
  event->recorded = true;
  if (!asyncMode()) {
    event->time = Clock::now();
    return Status::Success;
  }
  auto mark = std::make_shared<Mark>();
  Work w;
  w.fn = [](void* p, void*) -> const char* {
    auto* m = static_cast<std::shared_ptr<Mark>*>(p);
    std::lock_guard<std::mutex> lock((*m)->mutex);
    (*m)->time = Clock::now();
    (*m)->timed = true;
    return nullptr;
  };
  w.arg = new std::shared_ptr<Mark>(mark);
  w.drop = [](void* p) { delete static_cast<std::shared_ptr<Mark>*>(p); };
  w.name = "event_record";
  StreamState* s = streamState(device, stream);
  event->ticket = submit(s, std::move(w));
  event->stream = s;
  event->mark = std::move(mark);
  return Status::Success;
}

Status eventQuery(Event event) {
  if (event == nullptr) return Status::InvalidValue;
  return event->done() ? Status::Success : Status::NotReady;
}

Status eventSynchronize(Event event) {
  if (event == nullptr) return Status::InvalidValue;
  if (event->stream == nullptr) return event->device >= 0 ? deviceStatus(event->device) : Status::Success;
  event->stream->waitFor(event->ticket);
  return deviceStatus(event->device);
}

int eventDevice(Event event) { return event == nullptr ? -1 : event->device; }

Status eventElapsedTime(float* ms, Event start, Event end) {
  if (ms == nullptr || start == nullptr || end == nullptr) return Status::InvalidValue;
  if (!start->enable_timing || !end->enable_timing || !start->recorded || !end->recorded)
    return Status::InvalidValue;
  if (!start->done() || !end->done()) return Status::NotReady;
  *ms = std::chrono::duration<float, std::milli>(end->when() - start->when()).count();
  return Status::Success;
}

namespace {
thread_local int t_kernel_depth = 0;  // launchKernel bodies running on this thread
struct KernelDepth {
  KernelDepth() { ++t_kernel_depth; }
  ~KernelDepth() {
    TORCHNEURON_RT_ASSERT(t_kernel_depth > 0, "a kernel body ended that never began");
    --t_kernel_depth;
  }
};
}  // namespace

bool insideKernel() { return t_kernel_depth > 0; }

Status launchKernel(int device, Stream stream, KernelFn fn, void* arg, void* context, const LaunchInfo& info) {
  if (!validDevice(device)) return Status::InvalidDevice;
  if (fn == nullptr) return Status::InvalidValue;
  if (asyncMode()) {
    const Status waited = streamSynchronize(device, stream);
    if (waited != Status::Success) return waited;
  }
  DeviceAccess access(info.ranges, info.range_count);  // strict mode: its memory, while it runs
  KernelDepth depth;
  const char* error = nullptr;
  if (!activityRecording()) {
    try {
      error = fn(arg, context);
    } catch (...) {  // work must not raise (neuron_runtime.h)
      setLastError(unexpectedException().c_str());
      return Status::LaunchFailed;
    }
  } else {
    // The stream is idle, so the work starts at once and ends when fn returns.
    ActivityRecord record = activityBegin(device, stream, info);
    record.nested = t_kernel_depth > 1;
    record.start_ns = activityClockNs();
    ActivityRecord* outer = activitySwapRunning(&record);
    try {
      error = fn(arg, context);
    } catch (...) {
      static thread_local std::string what;
      what = unexpectedException();
      error = what.c_str();
    }
    activitySwapRunning(outer);
    activityEnd(std::move(record));
  }
  if (error == nullptr) return Status::Success;
  setLastError(error);
  return Status::LaunchFailed;
}

Status enqueueKernel(int device, Stream stream, KernelFn fn, void* arg, void* context, KernelDrop drop,
                     const LaunchInfo& info) {
  if (!validDevice(device) || fn == nullptr) {
    if (drop != nullptr) drop(arg);
    return validDevice(device) ? Status::InvalidValue : Status::InvalidDevice;
  }
  if (!asyncMode() || insideKernel()) {  // see tnrtInsideKernel
    struct Dropping {
      KernelDrop drop;
      void* arg;
      ~Dropping() {
        if (drop != nullptr) drop(arg);
      }
    } dropping{drop, arg};
    return launchKernel(device, stream, fn, arg, context, info);
  }
  Work w;
  w.fn = fn;
  w.arg = arg;
  w.context = context;
  w.drop = drop;
  w.name = info.name != nullptr ? info.name : "kernel";
  if (strictMode()) w.ranges.assign(info.ranges, info.ranges + info.range_count);
  if (activityRecording()) {
    w.recorded = true;
    w.record = activityBegin(device, stream, info);
  }
  submit(streamState(device, stream), std::move(w));
  return Status::Success;
}

}  // namespace torchneuron::emu
