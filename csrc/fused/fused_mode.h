// Fused eager as the rest of aten sees it (fused.cpp): whether ops are recorded, recording one, and
// running what is held. The graph compiler's side is compiler.h; the deferral both share, deferred.h.
#pragma once

#include <ATen/core/stack.h>

#include <atomic>

namespace c10 {
class OperatorHandle;
}  // namespace c10

namespace torchneuron {

// TORCHNEURON_EAGER=fused, torch.neuron.set_eager_mode("fused"): ops on neuron tensors are recorded
// into a group instead of run; the group runs when the host needs the device (a cut: anything that
// reaches the runtime, see handOverHeldWork), as one compiled graph once seen often enough.
extern std::atomic<bool> fused_mode;
inline bool fusedMode() { return fused_mode.load(std::memory_order_relaxed); }
// Fused mode, not inside a running group (whose own ops run at once), and not in a stretch of ops
// the adaptive bypass runs unrecorded (which counts this op): the op is to be recorded.
bool fusedRecordsNext();
inline bool fusedRecording() { return fusedMode() && fusedRecordsNext(); }
void setFusedMode(bool on);  // turning it off runs the pending group first
// Records a boxed op (its results allocated now, as in enqueueOp). False when it must run now.
bool recordOp(const c10::OperatorHandle& op, torch::jit::Stack* stack);
// Runs the pending group, if any; `reason` is what needs it (for the report).
void flushFused(const char* reason);
bool fusedHolding();        // a recorded group is pending
bool fusedRecordingHere();  // this thread is recording an op (a group cannot run now)

}  // namespace torchneuron
