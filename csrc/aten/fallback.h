// The fallbacks that run PyTorch's CPU kernels on device memory (fallback.cpp, sparse.cpp) and the
// unboxed kernels of the most frequent ops (fast_ops.cpp), registered once by module.cpp.
#pragma once

#include <ATen/core/stack.h>
#include <c10/core/DispatchKeySet.h>

namespace c10 {
class OperatorHandle;
}  // namespace c10

namespace torchneuron {

// Registers the fallback for ops that have a CPU kernel besides a generic
// one, so they run the CPU's kernel. Called once, after all registrations. (fallback.cpp)
void preferCpuKernels();
// Registers the unboxed kernels of the most frequent functional ops (fast_ops.cpp); called before
// preferCpuKernels. Nothing in asynchronous mode, where every op goes through the boxed fallback.
void registerFastOps();
// The boxed fallback itself (fallback.cpp).
void neuronFallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);
// The same for sparse tensors (sparse.cpp): ops with a CPU sparse kernel run it on the device's
// sparse tensors, also where PyTorch has a generic kernel that expects a dense tensor.
void preferSparseCpuKernels();

}  // namespace torchneuron
