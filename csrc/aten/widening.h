// CUDA's dtype coverage for ops whose CPU kernel lacks a dtype that CUDA's has (histc on integers,
// complex32 arithmetic, bfloat16 avg_pool3d, ...): the op runs on the device through a wider dtype
// the CPU supports, and its results are cast back to the dtypes CUDA returns. (widening.cpp)
#pragma once

#include <ATen/core/stack.h>
#include <c10/core/DispatchKeySet.h>

namespace c10 {
class OperatorHandle;
}  // namespace c10

namespace torchneuron {

// Whether the op (its schema name, "aten::histc") is in the widening table.
bool widens(const char* schema_name);
// The widening itself, as a boxed kernel: with an argument of a dtype the op widens, the op runs on
// widened copies through the fallback and its results are cast back (out= and in-place arguments
// written back); otherwise it is the fallback itself.
void widenedFallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);
// Registers widenedFallback for the table's ops that have no neuron kernel yet (the fast ops among
// them call it when their CPU kernel raises NotImplementedError). Called once, after registerFastOps
// and before preferCpuKernels.
void registerWidenedOps();

}  // namespace torchneuron
