// Ops that PyTorch routes differently for an accelerator than for the CPU, so
// that no CPU kernel exists to fall back to: convolution's "overrideable"
// entry points and the fused RNN cells. Each runs PyTorch's CPU math on
// aliases of device memory.
#include "dispatch_stub.h"  // first: it declares DispatchStub as PyTorch's build does
#include "launch.h"
#include "host_addressable.h"

#include <ATen/native/ConvUtils.h>

#include <ATen/ATen.h>
#include <ATen/native/transformers/attention.h>
#include <torch/library.h>

namespace torchneuron {
namespace {

c10::DeviceIndex deviceOf(const at::Tensor& t) { return t.device().index(); }


// A convolution result (or gradient) computed on the CPU, as a neuron tensor in the memory format
// PyTorch expects of it on this device: the one it derives for the Overrideable backend, which is
// also what fake tensors (torch.compile) assume. When the CPU kernel picked another format, the
// result is converted straight into device memory from the caching allocator.
// A copy of `values` (a CPU tensor) in device memory of `device` from the caching allocator, laid out in `format`.
at::Tensor copyInFormat(const at::Tensor& values, c10::Device device, at::MemoryFormat format) {
  auto out = at::empty(values.sizes(), values.options().device(device).memory_format(format));
  hostView(out).copy_(values);
  return out;
}

// `t` if it is channels-last already, else a channels-last copy in device memory from the caching
// allocator. Callers keep the result alive while they use a CPU alias of it (an alias does not
// hold its device tensor).
at::Tensor channelsLastOnDevice(const at::Tensor& t) {
  const auto kChannelsLast = at::MemoryFormat::ChannelsLast;
  return t.is_contiguous(kChannelsLast) ? t : copyInFormat(hostView(t), t.device(), kChannelsLast);
}

at::Tensor deviceResultInConvFormat(const at::Tensor& t, const at::Tensor& input, const at::Tensor& weight) {
  if (!t.defined() || t.dim() != 4 && t.dim() != 5) return deviceResult(t, deviceOf(input));
  const auto format =
      at::native::_determine_backend_memory_format(input, weight, at::native::ConvBackend::Overrideable);
  return t.is_contiguous(format) ? deviceResult(t, deviceOf(input)) : copyInFormat(t, input.device(), format);
}

at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                       c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                       c10::IntArrayRef output_padding, int64_t groups) {
  DeviceOutputScope scope(deviceOf(input));
  std::optional<at::Tensor> cpu_bias;
  if (bias && bias->defined()) cpu_bias = hostArgument(*bias);
  auto out = at::convolution(hostArgument(input), hostArgument(weight), cpu_bias, stride, padding, dilation,
                             transposed, output_padding, groups);
  return deviceResultInConvFormat(out, input, weight);
}

// torchneuron::convolution_channels_last: aten::convolution computed and returned in the
// channels-last layout, the one the CPU's oneDNN kernels run fastest in. Compiled neuron graphs
// call it in place of aten::convolution (see torchneuron/compile/passes.py):
// aten::convolution on this device has to answer in the layout PyTorch derives for an
// out-of-tree backend (contiguous), which would cost a conversion of every output.
at::Tensor convolutionChannelsLast(const at::Tensor& input, const at::Tensor& weight,
                                   const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                                   c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                                   c10::IntArrayRef output_padding, int64_t groups) {
  TORCH_CHECK_VALUE(input.dim() == 4 && weight.dim() == 4,
                    "convolution_channels_last: expected 4-d input and weight, got ", input.dim(), "-d and ",
                    weight.dim(), "-d");
  const at::Tensor x = channelsLastOnDevice(input), w = channelsLastOnDevice(weight);
  const auto d = deviceOf(input);
  DeviceOutputScope scope(d);
  std::optional<at::Tensor> cpu_bias;
  if (bias && bias->defined()) cpu_bias = hostArgument(*bias);
  auto out = at::convolution(hostArgument(x), hostArgument(w), cpu_bias, stride, padding, dilation, transposed,
                             output_padding, groups);
  return deviceResult(out.contiguous(at::MemoryFormat::ChannelsLast), d);
}

// torchneuron::convolution_backward_channels_last: the gradients of convolution_channels_last,
// computed from channels-last arguments, grad_input and grad_weight returned channels-last (the
// layout oneDNN's backward kernels write). A gradient output_mask leaves out is an empty tensor.
std::tuple<at::Tensor, at::Tensor, at::Tensor> convolutionBackwardChannelsLast(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    at::OptionalIntArrayRef bias_sizes, c10::IntArrayRef stride, c10::IntArrayRef padding,
    c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding, int64_t groups,
    std::array<bool, 3> output_mask) {
  TORCH_CHECK_VALUE(input.dim() == 4 && weight.dim() == 4 && grad_output.dim() == 4,
                    "convolution_backward_channels_last: expected 4-d grad_output, input and weight, got ",
                    grad_output.dim(), "-d, ", input.dim(), "-d and ", weight.dim(), "-d");
  const at::Tensor go = channelsLastOnDevice(grad_output), x = channelsLastOnDevice(input),
                   w = channelsLastOnDevice(weight);
  const auto d = deviceOf(input);
  DeviceOutputScope scope(d);
  auto [gi, gw, gb] = at::convolution_backward(hostArgument(go), hostArgument(x), hostArgument(w), bias_sizes, stride, padding,
                                               dilation, transposed, output_padding, groups, output_mask);
  auto result = [&](const at::Tensor& g, bool channels_last) {
    if (!g.defined()) return at::empty({0}, grad_output.options());
    return deviceResult(channels_last ? g.contiguous(at::MemoryFormat::ChannelsLast) : g, d);
  };
  return {result(gi, true), result(gw, true), result(gb, false)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolutionBackward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
    c10::IntArrayRef output_padding, int64_t groups, std::array<bool, 3> output_mask) {
  const int64_t out_channels = transposed ? weight.size(1) * groups : weight.size(0);
  const auto d = deviceOf(input);
  DeviceOutputScope scope(d);
  auto [gi, gw, gb] = at::convolution_backward(
      hostArgument(grad_output), hostArgument(input), hostArgument(weight), c10::IntArrayRef{out_channels}, stride,
      padding, dilation, transposed, output_padding, groups, output_mask);
  return {deviceResultInConvFormat(gi, input, weight), deviceResultInConvFormat(gw, input, weight), deviceResult(gb, d)};
}

// LSTM cell: gates = input_gates + hidden_gates (+ biases), in the order i, f, g, o.
std::tuple<at::Tensor, at::Tensor, at::Tensor> fusedLstmCell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& cx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  at::Tensor gates = hostArgument(input_gates) + hostArgument(hidden_gates);
  if (input_bias && input_bias->defined()) gates = gates + hostArgument(*input_bias);
  if (hidden_bias && hidden_bias->defined()) gates = gates + hostArgument(*hidden_bias);
  auto chunks = gates.chunk(4, 1);
  auto i = chunks[0].sigmoid(), f = chunks[1].sigmoid(), g = chunks[2].tanh(), o = chunks[3].sigmoid();
  auto cy = f * hostArgument(cx) + i * g;
  auto hy = o * cy.tanh();
  auto workspace = at::cat({i, f, g, o}, 1);
  const auto d = deviceOf(cx);
  return {deviceResult(hy, d), deviceResult(cy, d), deviceResult(workspace, d)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fusedLstmCellBackward(
    const std::optional<at::Tensor>& grad_hy_opt, const std::optional<at::Tensor>& grad_cy_opt,
    const at::Tensor& cx, const at::Tensor& cy, const at::Tensor& workspace, bool has_bias) {
  auto ws = hostArgument(workspace).chunk(4, 1);
  auto i = ws[0], f = ws[1], g = ws[2], o = ws[3];
  auto c_cx = hostArgument(cx), c_cy = hostArgument(cy);
  auto tanh_cy = c_cy.tanh();
  at::Tensor grad_hy = grad_hy_opt && grad_hy_opt->defined() ? hostArgument(*grad_hy_opt) : at::zeros_like(c_cy);
  at::Tensor gcy = grad_hy * o * (1 - tanh_cy * tanh_cy);
  if (grad_cy_opt && grad_cy_opt->defined()) gcy = gcy + hostArgument(*grad_cy_opt);
  auto gi = gcy * g * i * (1 - i);
  auto gf = gcy * c_cx * f * (1 - f);
  auto gg = gcy * i * (1 - g * g);
  auto go = grad_hy * tanh_cy * o * (1 - o);
  auto grad_gates = at::cat({gi, gf, gg, go}, 1);
  auto grad_cx = gcy * f;
  at::Tensor grad_bias = has_bias ? grad_gates.sum(0) : at::Tensor();
  const auto d = deviceOf(cx);
  return {deviceResult(grad_gates, d), deviceResult(grad_cx, d), deviceResult(grad_bias, d)};
}

// GRU cell, gates in the order r, z, n; the workspace keeps r, z, n, hidden n, hx.
std::tuple<at::Tensor, at::Tensor> fusedGruCell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& hx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  at::Tensor ig = hostArgument(input_gates), hg = hostArgument(hidden_gates);
  if (input_bias && input_bias->defined()) ig = ig + hostArgument(*input_bias);
  if (hidden_bias && hidden_bias->defined()) hg = hg + hostArgument(*hidden_bias);
  auto ic = ig.chunk(3, 1), hc = hg.chunk(3, 1);
  auto r = (ic[0] + hc[0]).sigmoid();
  auto z = (ic[1] + hc[1]).sigmoid();
  auto n = (ic[2] + r * hc[2]).tanh();
  auto c_hx = hostArgument(hx);
  auto hy = n + z * (c_hx - n);
  auto workspace = at::cat({r, z, n, hc[2], c_hx}, 1);
  const auto d = deviceOf(hx);
  return {deviceResult(hy, d), deviceResult(workspace, d)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fusedGruCellBackward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  auto ws = hostArgument(workspace).chunk(5, 1);
  auto r = ws[0], z = ws[1], n = ws[2], hn = ws[3], hx = ws[4];
  auto gh = hostArgument(grad_hy);
  auto grad_hx = gh * z;
  auto gn = gh * (1 - z) * (1 - n * n);
  auto gz = gh * (hx - n) * z * (1 - z);
  auto gr = gn * hn * r * (1 - r);
  auto grad_input_gates = at::cat({gr, gz, gn}, 1);
  auto grad_hidden_gates = at::cat({gr, gz, gn * r}, 1);
  at::Tensor gib = has_bias ? grad_input_gates.sum(0) : at::Tensor();
  at::Tensor ghb = has_bias ? grad_hidden_gates.sum(0) : at::Tensor();
  const auto d = deviceOf(workspace);
  return {deviceResult(grad_input_gates, d), deviceResult(grad_hidden_gates, d), deviceResult(grad_hx, d),
          deviceResult(gib, d), deviceResult(ghb, d)};
}

// scaled_dot_product_attention asks each device which fused kernel to use;
// without an answer an accelerator gets the slow math path. Neuron answers as
// the CPU would for the same tensors (the choice reads only their metadata, so
// it works on the fake tensors of torch.compile too), and runs the CPU's
// fused kernels.
int64_t fusedSdpChoice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                       const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                       std::optional<double> scale, bool enable_gqa) {
  return at::_ops::_fused_sdp_choice::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), query, key, value,
                                                attn_mask, dropout_p, is_causal, scale, enable_gqa);
}

}  // namespace

}  // namespace torchneuron

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torchneuron::fusedSdpChoice)
}  // namespace at::native

namespace torchneuron {

TORCH_LIBRARY(torchneuron, m) {
  // needs_exact_strides: a compiled graph hands it input and weight in the layout its pass asks
  // for (channels-last), written so by the kernels that produce them.
  m.def("convolution_channels_last(Tensor input, Tensor weight, Tensor? bias, int[] stride, int[] padding, "
        "int[] dilation, bool transposed, int[] output_padding, int groups) -> Tensor",
        {at::Tag::needs_exact_strides});
  m.def("convolution_backward_channels_last(Tensor grad_output, Tensor input, Tensor weight, int[]? bias_sizes, "
        "int[] stride, int[] padding, int[] dilation, bool transposed, int[] output_padding, int groups, "
        "bool[3] output_mask) -> (Tensor, Tensor, Tensor)",
        {at::Tag::needs_exact_strides});
}

// The kernels' names in activity records.
constexpr char kConvolutionChannelsLastName[] = "convolution_channels_last";
constexpr char kConvolutionBackwardChannelsLastName[] = "convolution_backward_channels_last";
constexpr char kConvolutionName[] = "convolution_overrideable";
constexpr char kConvolutionBackwardName[] = "convolution_backward_overrideable";
constexpr char kFusedLstmCellName[] = "_thnn_fused_lstm_cell";
constexpr char kFusedLstmCellBackwardName[] = "_thnn_fused_lstm_cell_backward_impl";
constexpr char kFusedGruCellName[] = "_thnn_fused_gru_cell";
constexpr char kFusedGruCellBackwardName[] = "_thnn_fused_gru_cell_backward";

TORCH_LIBRARY_IMPL(torchneuron, PrivateUse1, m) {
  m.impl("convolution_channels_last", TORCH_FN((Launched<kConvolutionChannelsLastName, &convolutionChannelsLast>::call)));
  m.impl("convolution_backward_channels_last", TORCH_FN((Launched<kConvolutionBackwardChannelsLastName, &convolutionBackwardChannelsLast>::call)));
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", TORCH_FN((Launched<kConvolutionName, &convolution>::call)));
  m.impl("convolution_backward_overrideable", TORCH_FN((Launched<kConvolutionBackwardName, &convolutionBackward>::call)));
  m.impl("_thnn_fused_lstm_cell", TORCH_FN((Launched<kFusedLstmCellName, &fusedLstmCell>::call)));
  m.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN((Launched<kFusedLstmCellBackwardName, &fusedLstmCellBackward>::call)));
  m.impl("_thnn_fused_gru_cell", TORCH_FN((Launched<kFusedGruCellName, &fusedGruCell>::call)));
  m.impl("_thnn_fused_gru_cell_backward", TORCH_FN((Launched<kFusedGruCellBackwardName, &fusedGruCellBackward>::call)));
}

}  // namespace torchneuron
