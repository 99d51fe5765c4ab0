// Fused eager's mode and its pending group (fused.cpp), for its Python binding. The rest of the core
// sees fused eager only through aten's held-work table (aten/held_work.h), which installFusedEager()
// fills at start-up; the graph compiler's side is compiler.h; the deferral it shares with asynchronous
// mode is aten/deferred.h.
#pragma once

#include "../aten/held_work.h"

namespace torchneuron {

// TORCHNEURON_EAGER=fused, torch.neuron.set_eager_mode("fused"): ops on neuron tensors are recorded
// into a group instead of run; the group runs when the host needs the device (a cut: anything that
// reaches the runtime, see handOverHeldWork), as one compiled graph once seen often enough.
inline bool fusedMode() { return recordingOpsOn(); }
void setFusedMode(bool on);  // turning it off runs the pending group first
// Runs the pending group, if any; `reason` is what needs it (for the report).
void flushFused(const char* reason);
// Registers fused eager as aten's holder of work (registerHeldWork), once, at start-up (module.cpp).
void installFusedEager();

}  // namespace torchneuron
