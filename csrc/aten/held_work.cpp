// The held-work table (held_work.h): its defaults, which hold nothing, until a holder registers.
#include "held_work.h"

#include <c10/util/Exception.h>

namespace torchneuron {
namespace held_work {
namespace {
bool never() { return false; }
bool refuse(const c10::OperatorHandle&, torch::jit::Stack*) { return false; }
void nothingToHandOver(HostNeed, const char*) {}
void nothingToFlush(const char*) {}
}  // namespace

HeldWork holder{&never, &refuse, &nothingToHandOver, &nothingToFlush, &never, &never};
std::atomic<bool> recording{false};
std::atomic<bool> engaged{false};
}  // namespace held_work

void registerHeldWork(const HeldWork& holder) {
  TORCH_CHECK(!held_work::engaged.load(std::memory_order_acquire),
              "torchneuron: the held-work holder is registered once, before any op is recorded");
  held_work::holder = holder;
}

void setRecordingOps(bool on) {
  if (on) held_work::engaged.store(true, std::memory_order_release);  // before the first op is recorded
  held_work::recording.store(on, std::memory_order_relaxed);
}

}  // namespace torchneuron
