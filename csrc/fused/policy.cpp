// Fused eager's policy (policy.h): its figures, its learning rule and its cut rules.
#include "policy.h"

#include <algorithm>

namespace torchneuron {

FusedConfig& fusedConfig() {
  static FusedConfig config;
  return config;
}

FusedExpectation fusedExpect(const FusedConfig& config, const FusedMachineHistory& machine,
                             const FusedGroupHistory* group, size_t ops) {
  const double n = static_cast<double>(ops);
  if (group == nullptr)  // never compiled here: a cold compile, at the machine's rate once it is known
    return {config.cold_seconds + machine.cold_seconds_per_op.value_or(config.cold_seconds_per_op) * n, config.gain};
  return {group->warm_seconds.value_or(config.warm_seconds_per_op * n), group->gain.value_or(config.gain)};
}

void fusedLearn(const FusedConfig& config, FusedMachineHistory& machine, FusedGroupHistory& group, bool cold,
                size_t ops, double compile_seconds, double op_seconds, double fused_seconds) {
  if (cold) {  // the machine's rate moves towards it (the fixed part left out)
    if (static_cast<int64_t>(ops) >= config.rate_ops && ops > 0) {
      const double rate = std::max(compile_seconds - config.cold_seconds, 0.0) / static_cast<double>(ops);
      machine.cold_seconds_per_op =
          machine.cold_seconds_per_op ? 0.5 * (*machine.cold_seconds_per_op + rate) : rate;
    }
  } else {  // its graph came from the cache
    group.warm_seconds = compile_seconds;
  }
  if (op_seconds > 0) group.gain = 1.0 - fused_seconds / op_seconds;
}

const std::vector<FusedCutRule>& fusedCutRules() {
  static const std::vector<FusedCutRule> rules = {
      {"collective", "collective", true, {}, {}, "a collective runs through the process group, by itself"},
      {"random", "random op", true, {"nondeterministic_seeded"}, {},
       "a random op draws on the generator at the op (a seeded program draws what op mode draws)"},
      {"data_dependent", "data-dependent shape", true, {"dynamic_output_shape"}, {},
       "its results' sizes depend on the data: no meta kernel can say them ahead"},
      {"host_read", "host read", false, {"data_dependent_output"}, {},
       "a value read back to the host (item, equal, allclose): the group ends before the next op"},
      {"host_copy", "host copy", true, {}, {"_to_copy", "copy_", "_copy_from", "_copy_from_and_resize"},
       "a copy between the host and the device (when its tensors are on both)"},
  };
  return rules;
}

}  // namespace torchneuron
