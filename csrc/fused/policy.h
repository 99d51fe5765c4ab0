// Fused eager's policy, all of it in one place (policy.cpp): its figures (when a group runs op by op,
// when it is compiled, when recording stops for a while), its learning rule (what compiling a group is
// expected to cost and save, and how what a process measured changes that), and its cut rules (which
// ops end a group, and which of them run by themselves). fused.cpp runs it; torchneuron._C._fused_policy()
// is the same object for Python: torch.neuron's eager-mode settings, the neuron process group and the
// tests change its figures, torchneuron/compile/fused.py applies its learning rule to what earlier
// processes measured, and the projection (torchneuron/projection/) reads its figures and cut rules.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace torchneuron {

struct FusedConfig {
  // A group is compiled the time it is seen this often at the earliest, and then (the pay-off rule,
  // `payoff`) once its op-by-op runs have cost enough that what compiling saves pays for the compile:
  // (time run op by op) x (expected gain) >= (expected compile time). With `payoff` off
  // (TORCHNEURON_FUSED_COMPILE=early), or in a process group of several processes, where time must not
  // decide what ranks run (`timing_free`), it is compiled the time it is seen compile_after times.
  int64_t compile_after = 2;
  bool payoff = true;
  bool timing_free = false;
  int64_t skip_ahead = 32;  // while a group waits to pay, up to this many of its occurrences in a row run
                            // unrecorded (op mode's path), each credited with its mean op-by-op time
  int64_t min_ops = 32;        // smaller groups always run op by op (a compiled graph's call costs more)
  int64_t max_ops = 4096;      // a group is cut when it has this many ops
  int64_t patience = 4;        // this many unprofitable groups in a row ...
  int64_t bypass_ops = 1024;   // ... and this many ops run without recording (doubling, up to 1024 times
                               // as many, while trying again does not pay)

  // The learning rule's figures before anything is measured on this machine: a compile with an empty
  // cache costs cold_seconds plus cold_seconds_per_op an op (the demo's 659-op training step took
  // about a minute on 2 cores), and warm_seconds_per_op an op with its graph in the cache (3.5 s for
  // the demo's step, 2 s of it importing Inductor); a compiled run saves `gain` of the op-by-op run
  // (0.07-0.13 on benchmarks/bench_fused.py's models). What a process measures replaces them in the
  // next (fusedLearn): a group's own compile time and gain, and the machine's cold compile time per op,
  // from groups of at least rate_ops ops (a small group's time is mostly the fixed part).
  double cold_seconds = 1.0;
  double cold_seconds_per_op = 0.05;
  int64_t rate_ops = 64;
  double warm_seconds_per_op = 0.006;
  double gain = 0.1;
  int64_t timed_runs = 4;  // compiled runs timed (after the first, left out) before what they measured is kept
};
FusedConfig& fusedConfig();

// The learning rule. What earlier processes measured (torchneuron/compile/fused.py keeps it beside
// Inductor's caches): the machine's cold compile time per op, and per group compiled before (whose
// graph is then in the cache) its compile time and the fraction of its op-by-op time a compiled run saved.
struct FusedMachineHistory {
  std::optional<double> cold_seconds_per_op;
};
struct FusedGroupHistory {
  std::optional<double> warm_seconds;
  std::optional<double> gain;
};
struct FusedExpectation {
  double compile_seconds = -1;  // -1: nothing to go by
  double gain = 0;
};
// What compiling a group of `ops` ops should cost and save; `group` is null when it was never compiled
// here (a cold compile).
FusedExpectation fusedExpect(const FusedConfig& config, const FusedMachineHistory& machine,
                             const FusedGroupHistory* group, size_t ops);
// What a compiled group measured, kept: its compile took `compile_seconds` (cold when `group` had no
// history: the machine's rate per op moves towards it, for groups of rate_ops ops or more; else its
// warm time), and its runs took `op_seconds` op by op (0: not measured) and `fused_seconds` compiled.
void fusedLearn(const FusedConfig& config, FusedMachineHistory& machine, FusedGroupHistory& group, bool cold,
                size_t ops, double compile_seconds, double op_seconds, double fused_seconds);

// The cut rules: what ends a group besides the size bound (max_ops) and a change of device or stream.
// An op the deferral cannot record (aten/deferred.h) runs by itself, op by op, between two groups; a
// value read back to the host ends the group before the next op. Each rule names the torch.Tag or
// the ops (by their name without overload) that mark an op for it; a collective is marked by being one.
struct FusedCutRule {
  const char* key;   // for code: "collective", "random", "data_dependent", "host_read", "host_copy"
  const char* name;  // for people (the projection's records and reports)
  bool runs_alone;
  std::vector<const char*> tags;
  std::vector<const char*> ops;
  const char* why;
};
const std::vector<FusedCutRule>& fusedCutRules();  // in the order an op is tested against them

}  // namespace torchneuron
