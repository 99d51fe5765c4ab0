// Automatic mixed precision for neuron: PyTorch's own op lists and policies,
// registered under the AutocastPrivateUse1 key.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace at::autocast {
namespace {

// As on CUDA: binary_cross_entropy is unsafe in float16, so autocast refuses it.
Tensor binaryCrossEntropyBanned(const Tensor&, const Tensor&, const std::optional<Tensor>&, int64_t) {
  TORCH_CHECK(false,
      "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
      "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
      "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
      "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
      "safe to autocast.");
}

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

#define NEURON_LOWER_PRECISION(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define NEURON_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define NEURON_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define NEURON_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(NEURON_LOWER_PRECISION)
  AT_FORALL_FP32(NEURON_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(NEURON_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(NEURON_PROMOTE)
  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"),
         TORCH_FN(binaryCrossEntropyBanned));
}

}  // namespace
}  // namespace at::autocast
