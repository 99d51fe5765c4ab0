// Fused eager (fused.cpp): what the Python binding needs to compile and run a recorded group.
#pragma once

#include "../aten/deferred.h"
#include "policy.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace torchneuron {

// A recorded group, as the graph compiler sees it: its ops in order (arguments and results as meta
// stand-ins) and its storages (each a flat meta tensor over its stand-in storage, in the dtype its
// ops use). The compiled graph takes one flat neuron tensor for each `input` storage, in order:
// the storages from before the group, and those it made that are still alive when it runs (it
// writes them); storages it made that nothing refers to any more stay inside the graph.
struct FusedDescription {
  std::vector<const Deferred*> ops;
  std::vector<at::Tensor> storages;
  std::vector<bool> made;
  std::vector<bool> input;
  std::vector<bool> lifts;    // per op: its Scalar floats are the group's floats (else constants of the op)
  std::vector<double> floats;  // the group's floats, in order, and which of them are inputs (after the
  std::vector<bool> lifted;    // storages, as 0-dim float64 CPU tensors); the others are constants
  std::vector<at::Tensor> inputs;  // the inputs of this run (examples for the compiler)
};

// The hooks the binding installs: compile a description (nullptr and `error` set when it cannot),
// and run a compiled graph on its inputs.
using FusedCompile = std::shared_ptr<void> (*)(const FusedDescription& group, std::string* error);
using FusedRun = void (*)(void* graph, std::vector<at::Tensor>& inputs);
// Lets go of the interpreter's lock while alive, when this thread holds it. A thread that must wait
// for the group's lock waits without it: the group's holder may run Python (compiling or running a
// graph), which needs the interpreter's lock.
using FusedInterpreterLock = std::shared_ptr<void> (*)();
// The Python line this thread is at, outside PyTorch and torchneuron ("file:line in function"; empty
// when it does not hold the interpreter's lock): where a group began, for the errors found when it runs.
using FusedWhere = std::string (*)();
void setFusedHooks(FusedCompile compile, FusedRun run, FusedInterpreterLock interpreter, FusedWhere where);

// What compiling a group is expected to cost and to save, asked the second time a group is seen
// (torchneuron.compile.fused applies the policy's learning rule, policy.h, to what earlier processes
// measured, kept beside Inductor's caches): the seconds compiling it should take (less when its graph
// is in the cache) and the fraction of its op-by-op run time a compiled run saves. And what was
// measured, told once a compiled group has run a few times: the seconds its compile took and its mean
// op-by-op and compiled run times.
using FusedExpect = FusedExpectation (*)(uint64_t key, size_t ops);
using FusedLearned = void (*)(uint64_t key, size_t ops, double compile_seconds, double op_seconds,
                              double fused_seconds);
void setFusedPolicy(FusedExpect expect, FusedLearned learned);

// What happened so far (torchneuron.compile.fused_report()).
struct FusedGroupStats {
  size_t ops = 0;
  int64_t seen = 0;          // times the group was cut
  int64_t fused_runs = 0;    // ... and ran as its compiled graph
  int64_t compile_ns = 0;
  bool compiled = false;
  int64_t op_runs = 0;       // times it ran op by op, and how long that took in all
  int64_t op_ns = 0;
  int64_t fused_ns = 0;      // how long its compiled runs took (the first one left out)
  double expected_compile_seconds = -1;  // the pay-off rule's view (-1: not asked yet)
  double expected_gain = 0;
  int64_t skipped_runs = 0;  // occurrences run unrecorded while it waited for its compile to pay,
  int64_t credited_ns = 0;   // and the op-by-op time they were credited with
  std::string error;         // why it is not compiled, if it was tried
  std::string first_cut;     // what cut it the first time
  std::vector<std::string> op_names;  // the first ops (for the report)
};
struct FusedStats {
  std::vector<FusedGroupStats> groups;
  std::map<std::string, int64_t> cuts;  // what cut groups, how often
  int64_t recorded_ops = 0;
  int64_t bypassed_ops = 0;  // run op by op without recording: after groups fusing did not pay for, or
                             // while a group waits for its compile to pay
};
FusedStats fusedStats();
void resetFusedStats();  // also forgets the compiled groups


}  // namespace torchneuron
