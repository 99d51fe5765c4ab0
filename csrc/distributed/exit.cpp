// torchneuron._gloo_exit: gloo's worker threads at the process's exit.
//
// A ProcessGroupGloo runs each collective on one of its worker threads, which
// lets go of the collective's work (and the tensors it holds) after the
// collective ended. When one of those tensors was made in Python, its last C++
// reference going away takes the GIL to release the Python object. A worker
// that starts taking the GIL just before the interpreter finalises, while the
// main thread holds it, is ended by Python inside that call (pthread_exit), and
// the unwinding through PyTorch's noexcept release calls std::terminate: the
// process aborts at exit ("terminate called without an active exception")
// after the program itself finished. The process group outlives
// destroy_process_group() wherever something else holds it (DDP, FSDP, a
// DeviceMesh), and every group does when the program never calls it.
//
// settleGlooWorkAtExit(), called by an atexit hook before the interpreter
// finalises, waits until no worker is releasing a work and keeps every work a
// worker still holds (queued, running, or ended but not yet let go) alive to
// the end of the process, so that no worker releases a tensor after that.
//
// A module of its own (torchneuron._gloo_exit, not part of torchneuron._C):
// ProcessGroupGloo.hpp needs gloo's headers, which the torch wheel does not
// ship; gloo_declarations/ declares the names it uses (see the README there).
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupWrapper.hpp>

#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

namespace torchneuron::distributed {
namespace {

using c10d::ProcessGroupGloo;
using GlooWork = ProcessGroupGloo::AsyncWork;

// ProcessGroupGloo's work queue, the work each worker thread runs, and the
// mutex that guards both (protected members), reached through member pointers
// of this derived class; it is never instantiated.
//
// A worker (ProcessGroupGloo::runLoop) takes a work from the queue under the
// mutex, runs it without, then takes the mutex again, clears its slot and lets
// go of its own reference while still holding the mutex. So whoever holds the
// mutex sees every work a worker may still release, and no worker in the
// middle of releasing one.
class GlooWorkers : public ProcessGroupGloo {
 public:
  GlooWorkers() = delete;

  static std::mutex& mutex(ProcessGroupGloo& gloo) {
    return gloo.*&GlooWorkers::workMutex_;
  }
  static std::deque<c10::intrusive_ptr<GlooWork>>& queued(ProcessGroupGloo& gloo) {
    return gloo.*&GlooWorkers::workQueue_;
  }
  static std::vector<c10::intrusive_ptr<GlooWork>>& running(ProcessGroupGloo& gloo) {
    return gloo.*&GlooWorkers::workInProgress_;
  }
};

// The gloo backend inside `backend` (itself, or the one the checking wrapper
// wraps), or null.
c10::intrusive_ptr<c10d::Backend> glooOf(const c10::intrusive_ptr<c10d::Backend>& backend) {
  if (!backend) return {};
  if (dynamic_cast<ProcessGroupGloo*>(backend.get()) != nullptr) return backend;
  if (auto* wrapper = dynamic_cast<c10d::ProcessGroupWrapper*>(backend.get())) {
    auto wrapped = wrapper->getWrappedPg();
    if (dynamic_cast<ProcessGroupGloo*>(wrapped.get()) != nullptr) return wrapped;
  }
  return {};
}

struct Tracked {
  const c10d::Backend* address;
  c10::weak_intrusive_ptr<c10d::Backend> backend;
};

std::mutex& trackedMutex() {
  static auto* mutex = new std::mutex;  // never destroyed: used until the process ends
  return *mutex;
}

std::vector<Tracked>& tracked() {
  static auto* backends = new std::vector<Tracked>;
  return *backends;
}

// The gloo backends remembered and still alive.
std::vector<c10::intrusive_ptr<c10d::Backend>> aliveBackends() {
  std::vector<c10::intrusive_ptr<c10d::Backend>> alive;
  std::lock_guard<std::mutex> lock(trackedMutex());
  for (const auto& entry : tracked()) {
    if (auto backend = entry.backend.lock()) alive.push_back(std::move(backend));
  }
  return alive;
}

}  // namespace

// Remembers `backend` (weakly) when it is a ProcessGroupGloo or gloo wrapped by
// TORCH_DISTRIBUTED_DEBUG=DETAIL's checking wrapper; anything else is ignored.
void trackGlooBackend(const c10::intrusive_ptr<c10d::Backend>& backend) {
  auto gloo = glooOf(backend);
  if (!gloo) return;
  std::lock_guard<std::mutex> lock(trackedMutex());
  auto& entries = tracked();
  for (const auto& entry : entries) {
    if (entry.address == gloo.get() && !entry.backend.expired()) return;
  }
  std::erase_if(entries, [](const Tracked& entry) { return entry.backend.expired(); });
  entries.push_back({gloo.get(), c10::weak_intrusive_ptr<c10d::Backend>(gloo)});
}

// For every remembered gloo backend still alive: waits for its workers to
// finish releasing what they are releasing, then keeps the works they hold
// alive until the process ends. Returns how many works were kept, or -1 when
// a backend's worker state does not look as ProcessGroupGloo.hpp describes it
// (then that backend is left alone). Call it without the GIL: a worker may
// need it to finish.
int64_t settleGlooWorkAtExit() {
  int64_t kept = 0;
  bool unexpected = false;
  for (const auto& backend : aliveBackends()) {
    auto& gloo = static_cast<ProcessGroupGloo&>(*backend);
    std::lock_guard<std::mutex> lock(GlooWorkers::mutex(gloo));
    // One slot per worker thread, as the constructor makes them.
    if (GlooWorkers::running(gloo).size() != static_cast<size_t>(gloo.getNumThreads())) {
      unexpected = true;
      continue;
    }
    auto keep = [&kept](const c10::intrusive_ptr<GlooWork>& work) {
      if (!work) return;
      // One reference more that is never given back: the work, and the
      // tensors it holds, stay until the process ends.
      c10::intrusive_ptr<GlooWork>(work).release();
      ++kept;
    };
    for (const auto& work : GlooWorkers::queued(gloo)) keep(work);
    for (const auto& work : GlooWorkers::running(gloo)) keep(work);
  }
  return unexpected ? -1 : kept;
}

// Number of gloo backends remembered and still alive.
int64_t trackedGlooBackends() {
  return static_cast<int64_t>(aliveBackends().size());
}

}  // namespace torchneuron::distributed

PYBIND11_MODULE(_gloo_exit, m) {
  namespace d = torchneuron::distributed;
  // Without the GIL: dropping the last reference to a backend joins its workers, which may need it.
  m.def("track_gloo_backend", &d::trackGlooBackend, py::arg("backend"),
        "Remember a gloo backend, whose workers are settled at exit.", py::call_guard<py::gil_scoped_release>());
  m.def("settle_gloo_work_at_exit", &d::settleGlooWorkAtExit,
        "Keep the works gloo's worker threads still hold alive to the process's end; how many.",
        py::call_guard<py::gil_scoped_release>());
  m.def("tracked_gloo_backends", &d::trackedGlooBackends, "Number of remembered gloo backends still alive.",
        py::call_guard<py::gil_scoped_release>());
}
