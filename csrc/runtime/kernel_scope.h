// Work issued from inside a running kernel's host code.
#pragma once

namespace torchneuron::rt {

// True while this thread runs the body of rt::launchKernel. Host code that calls device ops from
// inside a kernel (the C++ kernels and C shim calls of an AOTInductor model, which run the CPU's
// kernels over device memory and dispatch nested ops such as copy_) reads their results at once,
// so such work runs synchronously: enqueueKernel runs it before returning, and aten neither queues
// nor records (fused eager) the ops it is given there.
bool insideKernel();

struct ActivityRecord;
// Makes `record` the one activityAnnotate adds to on this thread while its work runs; returns the
// one before, to be put back after (activity.cpp).
ActivityRecord* activitySwapRunning(ActivityRecord* record);

}  // namespace torchneuron::rt
