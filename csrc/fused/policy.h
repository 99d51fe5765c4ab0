// Fused eager's policy, every figure of it in one place: when a group runs op by op, when it is
// compiled, when recording stops for a while. torch.neuron's eager-mode settings, the neuron process
// group and the tests change it through torchneuron._C._fused_config; torchneuron/compile/fused.py
// reads the pay-off rule's figures from here and keeps what earlier processes measured.
#pragma once

#include <cstdint>

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

  // The pay-off rule's figures before anything is measured on this machine: a compile with an empty
  // cache costs cold_seconds plus cold_seconds_per_op an op (the demo's 659-op training step took
  // about a minute on 2 cores), and warm_seconds_per_op an op with its graph in the cache (3.5 s for
  // the demo's step, 2 s of it importing Inductor); a compiled run saves `gain` of the op-by-op run
  // (0.07-0.13 on benchmarks/bench_fused.py's models). What a process measures replaces them in the
  // next (torchneuron/compile/fused.py keeps it beside Inductor's caches): a group's own compile time
  // and gain, and the machine's cold compile time per op, from groups of at least rate_ops ops (a
  // small group's time is mostly the fixed part).
  double cold_seconds = 1.0;
  double cold_seconds_per_op = 0.05;
  int64_t rate_ops = 64;
  double warm_seconds_per_op = 0.006;
  double gain = 0.1;
  int64_t timed_runs = 4;  // compiled runs timed (after the first, left out) before what they measured is kept
};
FusedConfig& fusedConfig();

}  // namespace torchneuron
