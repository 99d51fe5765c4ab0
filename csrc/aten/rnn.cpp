// Recurrent networks on neuron as the CPU runs them: aten::lstm, gru, rnn_tanh and rnn_relu (over a
// padded batch, ".input", and over a packed sequence, ".data") and their single cells.
//
// These ops are CompositeImplicitAutograd, and PyTorch's composite chooses its path by the device:
//   * on the CPU, an LSTM in float32 (bfloat16, or float16 without grad, where oneDNN supports them)
//     runs oneDNN's fused layer, aten::mkldnn_rnn_layer, once per layer and direction, with its own
//     backward (mkldnn_rnn_layer_backward);
//   * otherwise the CPU projects all of a layer's inputs in one aten::linear and runs each step's cell
//     op by op (linear of the hidden state, in-place gate activations);
//   * on any other device it runs cell by cell, projecting each step's input separately, through the
//     fused _thnn_fused_{lstm,gru}_cell kernels.
// The third path rounds differently from the other two, and the difference grows with the sequence
// (an epoch of word_language_model ended 3% off in valid loss). Neuron takes the CPU's path instead,
// by the cheapest of three routes that give the CPU's numbers bit for bit (runRnn):
//   * nothing for autograd to record (no_grad, inference mode, nothing requiring grad) and nothing
//     random to draw: the CPU's own op, run whole in one launch on host views of its arguments;
//   * a composite of small ops (GRU, RNN, packed or projected LSTM) with autograd: the CPU's own op
//     and its autograd graph, recorded over device memory in one launch, run backward in another
//     (HostGraph);
//   * otherwise (oneDNN's LSTM, whose few layer ops have their own backward; dropout, which must draw
//     from the device's generator; fake or functional tensors, Python modes and saved-tensor hooks,
//     which must see the ops or their device tensors): the CPU's ops dispatched one by one on the device in the CPU's order, mkldnn_rnn_layer and
//     its backward as zero-copy kernels.
//
// Registered for AutogradPrivateUse1, where a composite runs (autograd comes from the ops inside, or
// from HostGraph), and for PrivateUse1, which inference mode reaches.
#include "launch.h"
#include "host_addressable.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/SavedTensorHooks.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/RNN.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/library.h>

#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

namespace torchneuron {
namespace {

using at::Tensor;
using at::TensorList;

// ---- when the CPU runs an LSTM through oneDNN -------------------------------------------------

bool askMkldnn(const char* op) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(op, "").typed<bool()>().call();
}

// The CPU's own test (use_mkldnn in PyTorch's RNN.cpp), for neuron tensors in place of CPU ones.
bool cpuUsesOneDnn(const Tensor& input, TensorList params, TensorList hx) {
  if (!at::hasMKLDNN() || !at::globalContext().userEnabledMkldnn()) return false;
  auto onNeuron = [](TensorList ts) {
    return std::all_of(ts.begin(), ts.end(), [](const Tensor& t) { return t.device().type() == kNeuron; });
  };
  if (input.device().type() != kNeuron || !onNeuron(params) || !onNeuron(hx) || input.numel() == 0) return false;
  auto sameDevice = [&](TensorList ts) {
    return std::all_of(ts.begin(), ts.end(), [&](const Tensor& t) { return t.device() == input.device(); });
  };
  if (!sameDevice(params) || !sameDevice(hx)) return false;  // the composite raises the CPU's error
  switch (input.scalar_type()) {
    case at::kFloat:
      return true;
    case at::kBFloat16: {
      static const bool supported = askMkldnn("mkldnn::_is_mkldnn_bf16_supported");
      return supported;
    }
    case at::kHalf: {
      static const bool supported = askMkldnn("mkldnn::_is_mkldnn_fp16_supported");
      return supported && !c10::GradMode::is_enabled();
    }
    default:
      return false;
  }
}

// oneDNN's LSTM as the CPU runs it: one aten::mkldnn_rnn_layer per layer and direction, the
// directions' outputs concatenated, zero biases when the network has none.
std::tuple<Tensor, Tensor, Tensor> lstmOneDnn(const Tensor& input, TensorList hx, TensorList params, bool has_biases,
                                              int64_t num_layers, double dropout_p, bool train, bool bidirectional,
                                              bool batch_first) {
  constexpr int64_t kLstmMode = 2;  // ideep::rnn_kind::LSTM
  const int64_t directions = bidirectional ? 2 : 1;
  const size_t per = has_biases ? 4 : 2;
  TORCH_CHECK(params.size() == per * num_layers * directions, "got an incorrect number of RNN parameters");
  auto layer_input = (batch_first ? input.transpose(0, 1) : input).contiguous();
  auto h = hx[0].contiguous();
  auto c = hx[1].contiguous();
  const int64_t hidden_size = h.size(2);
  std::vector<Tensor> hy, cy;
  for (int64_t l = 0; l < num_layers; ++l) {
    std::vector<Tensor> outputs;
    for (int64_t d = 0; d < directions; ++d) {
      const int64_t index = l * directions + d;
      const Tensor* w = &params[index * per];
      auto h0 = h[index];
      auto c0 = c[index];
      auto b_hh = has_biases ? w[3] : at::zeros(w[1].sizes(), w[1].options());
      auto b_ih = has_biases ? w[2] : at::zeros(w[0].sizes(), w[0].options());
      auto [out, h1, c1, workspace] =
          at::mkldnn_rnn_layer(layer_input, w[0], w[1], b_ih, b_hh, h0, c0, /*reverse=*/d > 0, /*batch_sizes=*/{},
                               kLstmMode, hidden_size, num_layers, has_biases, bidirectional, batch_first, train);
      outputs.push_back(out);
      hy.push_back(h1);
      cy.push_back(c1);
    }
    layer_input = directions == 1 ? outputs[0] : at::cat(outputs, -1);
    if (dropout_p != 0 && train && l < num_layers - 1) layer_input = at::dropout(layer_input, dropout_p, true);
  }
  auto out_hy = at::stack(hy, 0);
  auto out_cy = at::stack(cy, 0);
  return {batch_first ? layer_input.transpose(0, 1) : layer_input, out_hy, out_cy};
}

// ---- without autograd: the CPU's own op on host views ------------------------------------------

// Whether the op can run as the CPU's own, whole, inside one launch on host views of its arguments:
// nothing to record for autograd, no dropout to draw (the CPU's would draw from the CPU generator),
// real tensors all on one neuron device (no fake or functional tensors, no Python mode to show the
// ops to), so that the CPU's checks have nothing to catch.
bool plainOnOneDevice(const Tensor& input, TensorList hx, TensorList params, double dropout_p, bool train) {
  if (dropout_p != 0 && train) return false;
  if (c10::impl::dispatch_mode_enabled() ||
      c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::FuncTorchDynamicLayerFrontMode))
    return false;
  constexpr auto kWrapped =
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::Functionalize,
                           c10::DispatchKey::PythonTLSSnapshot, c10::DispatchKey::FuncTorchBatched,
                           c10::DispatchKey::FuncTorchGradWrapper, c10::DispatchKey::BatchedNestedTensor});
  auto plain = [&](const Tensor& t) {
    return t.device() == input.device() && !t.key_set().has_any(kWrapped) && t.layout() == c10::kStrided &&
           t.has_storage() && !t.is_nested();
  };
  return input.device().type() == kNeuron && plain(input) && std::all_of(hx.begin(), hx.end(), plain) &&
         std::all_of(params.begin(), params.end(), plain);
}

bool anyRequiresGrad(const Tensor& input, TensorList hx, TensorList params);

// Whether the op can run as the CPU's own, whole, inside one launch on host views of its arguments:
// nothing to record for autograd, no dropout to draw (the CPU's would draw from the CPU generator),
// real tensors all on one neuron device (no fake or functional tensors, no Python mode to show the
// ops to), so that the CPU's checks have nothing to catch.
bool wholeOnHost(const Tensor& input, TensorList hx, TensorList params, double dropout_p, bool train) {
  const bool grad = c10::GradMode::is_enabled() && !c10::InferenceMode::is_enabled();
  return plainOnOneDevice(input, hx, params, dropout_p, train) && !(grad && anyRequiresGrad(input, hx, params));
}

std::vector<Tensor> hostArguments(TensorList ts) {
  std::vector<Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(hostArgument(t));
  return out;
}

// ---- the CPU's composite, op for op -----------------------------------------------------------

enum class Cell { Tanh, Relu, Lstm, Gru };

// One layer and direction's weights, in the order of PyTorch's flat weight list. The biases (and the
// LSTM projection w_hr) may be undefined.
struct Weights {
  Tensor w_ih, w_hh, b_ih, b_hh, w_hr;

  Tensor inputPart(const Tensor& x) const { return at::linear(x, w_ih, b_ih); }
  Tensor hiddenPart(const Tensor& h) const { return at::linear(h, w_hh, b_hh); }
  Tensor projected(const Tensor& h) const { return w_hr.defined() ? at::matmul(h, w_hr.t()) : h; }
};

std::vector<Weights> layerWeights(TensorList flat, bool has_biases, bool has_projections) {
  const size_t per = 2 + (has_biases ? 2 : 0) + (has_projections ? 1 : 0);
  TORCH_CHECK(flat.size() % per == 0, "got an incorrect number of RNN parameters");
  std::vector<Weights> out;
  for (size_t i = 0; i < flat.size(); i += per) {
    Weights w{flat[i], flat[i + 1]};
    if (has_biases) w.b_ih = flat[i + 2], w.b_hh = flat[i + 3];
    if (has_projections) w.w_hr = flat[i + per - 1];
    out.push_back(std::move(w));
  }
  return out;
}

// A hidden state: h, and the LSTM's cell state c (undefined for the other networks).
struct State {
  Tensor h, c;
};

// For an LSTM, c's op comes before h's, as in the CPU's build of PyTorch (the pair's two arguments
// evaluated last to first), so that autograd orders the nodes alike.
State rows(const State& s, int64_t begin, int64_t end) {
  State out;
  if (s.c.defined()) out.c = s.c.narrow(0, begin, end - begin);
  out.h = s.h.narrow(0, begin, end - begin);
  return out;
}

State joined(const std::vector<State>& states) {
  std::vector<Tensor> hs, cs;
  for (const auto& s : states) {
    hs.push_back(s.h);
    if (s.c.defined()) cs.push_back(s.c);
  }
  State out;
  if (!cs.empty()) out.c = at::cat(cs, 0);
  out.h = at::cat(hs, 0);
  return out;
}

// One step. `x` is the step's input, already multiplied by w_ih (plus b_ih) when `projected_input`.
State step(Cell cell, const Tensor& x, const State& s, const Weights& w, bool projected_input) {
  auto input_part = [&] { return projected_input ? x : w.inputPart(x); };
  switch (cell) {
    case Cell::Tanh:
    case Cell::Relu: {
      auto pre = w.hiddenPart(s.h).add_(input_part());
      return {cell == Cell::Tanh ? at::tanh(pre) : at::relu(pre)};
    }
    case Cell::Lstm: {
      auto gates = w.hiddenPart(s.h).add_(input_part()).unsafe_chunk(4, 1);
      auto i = gates[0].sigmoid_();
      auto f = gates[1].sigmoid_();
      auto g = gates[2].tanh_();
      auto o = gates[3].sigmoid_();
      auto c = (f * s.c).add_(i * g);
      auto h = o * c.tanh();
      return {w.projected(h), c};
    }
    case Cell::Gru: {
      auto in = input_part().unsafe_chunk(3, 1);
      auto hid = w.hiddenPart(s.h).unsafe_chunk(3, 1);
      auto r = hid[0].add_(in[0]).sigmoid_();
      auto z = hid[1].add_(in[1]).sigmoid_();
      auto n = in[2].add(hid[2].mul_(r)).tanh_();
      return {(s.h - n).mul_(z).add_(n)};
    }
  }
  TORCH_INTERNAL_ASSERT(false, "unknown RNN cell");
}

// A sequence [T, B, *] through one direction: every step's input projected at once, then the steps.
std::pair<Tensor, State> overSequence(Cell cell, const Tensor& input, State s, const Weights& w, bool reverse) {
  auto steps = w.inputPart(input).unbind(0);
  if (reverse) std::reverse(steps.begin(), steps.end());
  std::vector<Tensor> outputs;
  for (const auto& x : steps) {
    s = step(cell, x, s, w, true);
    outputs.push_back(s.h);
  }
  TORCH_CHECK(!outputs.empty(), "Expected sequence length to be larger than 0 in RNN");
  if (reverse) std::reverse(outputs.begin(), outputs.end());
  return {at::stack(outputs, 0), s};
}

// A packed sequence forward: the batch shrinks as sequences end, and each one's last state is kept.
std::pair<Tensor, State> overPacked(Cell cell, const Tensor& data, const int64_t* sizes, int64_t n, State s,
                                    const Weights& w) {
  auto xw = w.inputPart(data);
  std::vector<Tensor> outputs;
  std::vector<State> ended;
  int64_t offset = 0, last = sizes[0];
  for (int64_t i = 0; i < n; ++i) {
    const int64_t b = sizes[i];
    auto x = xw.narrow(0, offset, b);
    offset += b;
    if (last > b) {
      ended.push_back(rows(s, b, last));
      s = rows(s, 0, b);
    }
    last = b;
    s = step(cell, x, s, w, true);
    outputs.push_back(s.h);
  }
  ended.push_back(s);
  std::reverse(ended.begin(), ended.end());
  return {at::cat(outputs, 0), joined(ended)};
}

// A packed sequence backward: the batch grows, sequences joining at their last step.
std::pair<Tensor, State> overPackedReversed(Cell cell, const Tensor& data, const int64_t* sizes, int64_t n,
                                            const State& initial, const Weights& w) {
  auto xw = w.inputPart(data);
  int64_t offset = data.size(0), last = sizes[n - 1];
  auto s = rows(initial, 0, last);
  std::vector<Tensor> outputs;
  for (int64_t i = n - 1; i >= 0; --i) {
    const int64_t b = sizes[i];
    if (b > last) s = joined({s, rows(initial, last, b)});
    auto x = xw.narrow(0, offset - b, b);
    offset -= b;
    last = b;
    s = step(cell, x, s, w, true);
    outputs.push_back(s.h);
  }
  std::reverse(outputs.begin(), outputs.end());
  return {at::cat(outputs, 0), s};
}

// The layers one above the other. `input` is [T, B, *] (time first), or a packed sequence's data when
// `sizes` is given. Returns the last layer's output and each layer and direction's final state.
std::pair<Tensor, std::vector<State>> layers(Cell cell, Tensor input, const int64_t* sizes, int64_t n,
                                             const std::vector<State>& initial, const std::vector<Weights>& weights,
                                             int64_t num_layers, double dropout_p, bool train, bool bidirectional) {
  const int64_t directions = bidirectional ? 2 : 1;
  TORCH_CHECK(static_cast<int64_t>(initial.size()) == num_layers * directions,
              "Expected more hidden states in stacked_rnn");
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == num_layers * directions, "Expected more weights in stacked_rnn");
  auto direction = [&](int64_t index, bool reverse) {
    if (!sizes) return overSequence(cell, input, initial[index], weights[index], reverse);
    return reverse ? overPackedReversed(cell, input, sizes, n, initial[index], weights[index])
                   : overPacked(cell, input, sizes, n, initial[index], weights[index]);
  };
  std::vector<State> finals;
  for (int64_t l = 0; l < num_layers; ++l) {
    auto [out, last] = direction(l * directions, false);
    finals.push_back(last);
    if (bidirectional) {
      auto [rev_out, rev_last] = direction(l * directions + 1, true);
      finals.push_back(rev_last);
      out = at::cat({out, rev_out}, sizes ? -1 : out.dim() - 1);
    }
    input = out;
    if (dropout_p != 0 && train && l < num_layers - 1) input = at::dropout(input, dropout_p, /*train=*/true);
  }
  return {input, finals};
}

std::vector<State> oneHidden(const Tensor& hx) {
  std::vector<State> out;
  for (auto& h : hx.unbind(0)) out.push_back({h});
  return out;
}

std::vector<State> twoHidden(const Tensor& hx, const Tensor& cx) {
  auto hs = hx.unbind(0);
  auto cs = cx.unbind(0);
  std::vector<State> out;
  for (size_t i = 0; i < hs.size(); ++i) out.push_back({hs[i], cs[i]});
  return out;
}

Tensor stacked(const std::vector<State>& states, bool cell_state) {
  std::vector<Tensor> ts;
  for (const auto& s : states) ts.push_back(cell_state ? s.c : s.h);
  return at::stack(ts, 0);
}

// ---- the ops ----------------------------------------------------------------------------------

// ---- choosing the path ------------------------------------------------------------------------

// An RNN op as a function of its tensors (input, hidden states, parameters) to its outputs.
using RnnFn = std::function<std::vector<Tensor>(const Tensor&, TensorList, TensorList)>;

// The CPU's op recorded by the CPU's autograd, over device memory: run whole in one launch on host
// views of the arguments (the views requiring grad where the arguments do), so that the CPU's graph
// of the op, its saved tensors in device memory, is the op's backward. Backward runs that graph in a
// launch, with the gradients of the outputs seen as host views, and hands back the gradients of the
// arguments as neuron tensors: the CPU's numbers at the CPU's cost, one launch each way. A backward
// that is itself recorded (create_graph=True) differentiates the same ops op by op on the device.
struct HostGraphState : torch::CustomClassHolder {
  c10::DeviceIndex device = -1;
  const char* name = nullptr;
  size_t num_hidden = 0;
  RnnFn op_by_op;
  std::vector<Tensor> leaves, outputs;  // the CPU graph's
  std::vector<rt::MemoryRange> memory;  // strict mode: the device memory its forward launch reached
};

struct HostGraph : torch::autograd::Function<HostGraph> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                TensorList tensors, const char* name,
                                                int64_t num_hidden, const RnnFn& cpu, const RnnFn& op_by_op) {
    auto state = c10::make_intrusive<HostGraphState>();
    state->device = tensors[0].device().index();
    state->name = name;
    state->num_hidden = static_cast<size_t>(num_hidden);
    state->op_by_op = op_by_op;
    ctx->save_for_backward(tensors.vec());
    const auto d = state->device;
    auto outputs = launch(d, {rt::ActivityKind::Kernel, name}, [&] {
      DeviceOutputScope scope(d);
      at::AutoGradMode grad(true);
      for (const auto& t : tensors) {
        auto leaf = hostViewHolding(t, /*open=*/false).detach();
        if (t.requires_grad()) leaf.requires_grad_(true);
        state->leaves.push_back(std::move(leaf));
      }
      const auto& l = state->leaves;
      state->outputs = cpu(l[0], TensorList(l).slice(1, num_hidden), TensorList(l).slice(1 + num_hidden));
      std::vector<Tensor> out;
      for (const auto& o : state->outputs) {  // the graph keeps its own: the caller gets copies
        auto copy = at::empty_like(o, o.options().device(kNeuron, d));
        hostView(copy).copy_(o);
        out.push_back(std::move(copy));
      }
      state->memory = rt::deviceAccessRanges();  // strict mode: what the backward launch reaches again
      return out;
    });
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto inputs = ctx->get_saved_variables();  // raises if one was modified in place since
    auto holder = ctx->saved_data["state"].toCapsule();
    auto* state = static_cast<HostGraphState*>(holder.get());
    torch::autograd::variable_list result(inputs.size() + 4);
    std::vector<size_t> wanted;
    for (size_t j = 0; j < inputs.size(); ++j)
      if (ctx->needs_input_grad(j)) wanted.push_back(j);
    if (wanted.empty()) return result;

    if (c10::GradMode::is_enabled()) {  // create_graph: the same ops on the device, recorded
      const auto nh = state->num_hidden;
      auto outs = state->op_by_op(inputs[0], TensorList(inputs).slice(1, nh), TensorList(inputs).slice(1 + nh));
      std::vector<Tensor> os, gs, xs;
      for (size_t i = 0; i < grads.size(); ++i)
        if (grads[i].defined()) os.push_back(outs[i]), gs.push_back(grads[i]);
      for (auto j : wanted) xs.push_back(inputs[j]);
      auto g = torch::autograd::grad(os, xs, gs, /*retain_graph=*/true, /*create_graph=*/true, /*allow_unused=*/true);
      for (size_t k = 0; k < wanted.size(); ++k) result[wanted[k]] = g[k];
      return result;
    }

    TORCH_CHECK(!state->outputs.empty(), "Trying to backward through the graph of neuron's ", state->name,
                " a second time; specify retain_graph=True if you need to backward through it again");
    const bool keep = torch::autograd::get_current_graph_task_keep_graph();
    const auto d = state->device;
    launch(d, withRanges({rt::ActivityKind::Kernel, state->name}, state->memory), [&] {
      DeviceOutputScope scope(d);
      std::vector<Tensor> os, gs, xs;
      for (size_t i = 0; i < grads.size(); ++i)
        if (grads[i].defined()) os.push_back(state->outputs[i]), gs.push_back(hostView(grads[i]));
      for (auto j : wanted) xs.push_back(state->leaves[j]);
      if (os.empty()) return;
      auto g = torch::autograd::grad(os, xs, gs, keep, /*create_graph=*/false, /*allow_unused=*/true);
      for (size_t k = 0; k < wanted.size(); ++k) result[wanted[k]] = deviceResult(g[k], d);
    });
    if (!keep) {  // free the CPU graph now, as the CPU's backward frees its own
      state->outputs.clear();
      state->leaves.clear();
    }
    return result;
  }
};

bool anyRequiresGrad(const Tensor& input, TensorList hx, TensorList params) {
  auto req = [](const Tensor& t) { return t.requires_grad(); };
  return req(input) || std::any_of(hx.begin(), hx.end(), req) || std::any_of(params.begin(), params.end(), req);
}

// Runs an RNN op on neuron by the fastest path that gives the CPU's numbers:
//   * nothing for autograd to record: the CPU's op, whole, in one launch on host views;
//   * else, when `host_graph` (the CPU runs the op as a composite of many small ops): the CPU's op
//     and its autograd graph on device memory (HostGraph);
//   * else (oneDNN's LSTM, dropout, fake or functional tensors, a Python mode, tensors on several
//     devices): `op_by_op`, the CPU's ops dispatched one by one on the device.
std::vector<Tensor> runRnn(const char* name, const Tensor& input, TensorList hx, TensorList params, double dropout_p,
                           bool train, bool host_graph, const RnnFn& cpu, const RnnFn& op_by_op) {
  if (wholeOnHost(input, hx, params, dropout_p, train)) {
    const auto d = input.device().index();
    return launch(d, {rt::ActivityKind::Kernel, name}, [&] {
      DeviceOutputScope scope(d);
      auto outs = cpu(hostArgument(input), hostArguments(hx), hostArguments(params));
      for (auto& o : outs) o = deviceResult(o, d);
      return outs;
    });
  }
  // Saved-tensor hooks (save_on_cpu, non-reentrant checkpointing) act on the device tensors an op saves:
  // the CPU graph's would look to them like CPU tensors.
  if (host_graph && !at::SavedTensorDefaultHooks::get_hooks().has_value() &&
      plainOnOneDevice(input, hx, params, dropout_p, train)) {
    torch::autograd::variable_list tensors{input};
    tensors.insert(tensors.end(), hx.begin(), hx.end());
    tensors.insert(tensors.end(), params.begin(), params.end());
    return HostGraph::apply(TensorList(tensors), name, static_cast<int64_t>(hx.size()), cpu, op_by_op);
  }
  return op_by_op(input, hx, params);
}

template <Cell kCell>
constexpr const char* rnnName() {
  return kCell == Cell::Gru ? "gru" : kCell == Cell::Tanh ? "rnn_tanh" : kCell == Cell::Relu ? "rnn_relu" : "lstm";
}

template <Cell kCell>
std::tuple<Tensor, Tensor> oneHiddenInput(const Tensor& input, const Tensor& hx, TensorList params, bool has_biases,
                                          int64_t num_layers, double dropout_p, bool train, bool bidirectional,
                                          bool batch_first) {
  auto cpu = [=](const Tensor& x, TensorList h, TensorList p) {
    std::tuple<Tensor, Tensor> r;
    if constexpr (kCell == Cell::Gru)
      r = at::gru(x, h[0], p, has_biases, num_layers, dropout_p, train, bidirectional, batch_first);
    else if constexpr (kCell == Cell::Tanh)
      r = at::rnn_tanh(x, h[0], p, has_biases, num_layers, dropout_p, train, bidirectional, batch_first);
    else
      r = at::rnn_relu(x, h[0], p, has_biases, num_layers, dropout_p, train, bidirectional, batch_first);
    return std::vector<Tensor>{std::get<0>(r), std::get<1>(r)};
  };
  auto op_by_op = [=](const Tensor& input, TensorList h, TensorList params) {
    at::native::check_attributes(input, params, h);
    auto x = batch_first ? input.transpose(0, 1) : input;
    auto weights = layerWeights(params, has_biases, false);
    auto [out, finals] =
        layers(kCell, x, nullptr, 0, oneHidden(h[0]), weights, num_layers, dropout_p, train, bidirectional);
    auto hy = stacked(finals, false);
    if (batch_first) out.transpose_(0, 1);
    return std::vector<Tensor>{out, hy};
  };
  auto r = runRnn(rnnName<kCell>(), input, hx, params, dropout_p, train, true, cpu, op_by_op);
  return {r[0], r[1]};
}

template <Cell kCell>
std::tuple<Tensor, Tensor> oneHiddenPacked(const Tensor& data, const Tensor& batch_sizes, const Tensor& hx,
                                           TensorList params, bool has_biases, int64_t num_layers, double dropout_p,
                                           bool train, bool bidirectional) {
  auto cpu = [=](const Tensor& x, TensorList h, TensorList p) {
    std::tuple<Tensor, Tensor> r;
    if constexpr (kCell == Cell::Gru)
      r = at::gru(x, batch_sizes, h[0], p, has_biases, num_layers, dropout_p, train, bidirectional);
    else if constexpr (kCell == Cell::Tanh)
      r = at::rnn_tanh(x, batch_sizes, h[0], p, has_biases, num_layers, dropout_p, train, bidirectional);
    else
      r = at::rnn_relu(x, batch_sizes, h[0], p, has_biases, num_layers, dropout_p, train, bidirectional);
    return std::vector<Tensor>{std::get<0>(r), std::get<1>(r)};
  };
  auto op_by_op = [=](const Tensor& data, TensorList h, TensorList params) {
    auto sizes = batch_sizes.contiguous();
    auto weights = layerWeights(params, has_biases, false);
    auto [out, finals] = layers(kCell, data, sizes.data_ptr<int64_t>(), sizes.size(0), oneHidden(h[0]), weights,
                                num_layers, dropout_p, train, bidirectional);
    return std::vector<Tensor>{out, stacked(finals, false)};
  };
  auto r = runRnn(rnnName<kCell>(), data, hx, params, dropout_p, train, true, cpu, op_by_op);
  return {r[0], r[1]};
}

std::tuple<Tensor, Tensor, Tensor> lstmInput(const Tensor& input, TensorList hx, TensorList params, bool has_biases,
                                             int64_t num_layers, double dropout_p, bool train, bool bidirectional,
                                             bool batch_first) {
  TORCH_CHECK(hx.size() == 2, "lstm expects two hidden states");
  const bool has_projections = hx[0].sym_size(2) != hx[1].sym_size(2);
  const bool onednn = !has_projections && !hx[0].unsafeGetTensorImpl()->has_symbolic_sizes_strides() &&
                      cpuUsesOneDnn(input, params, hx);
  auto cpu = [=](const Tensor& x, TensorList h, TensorList p) {
    auto [out, hy, cy] = at::lstm(x, h, p, has_biases, num_layers, dropout_p, train, bidirectional, batch_first);
    return std::vector<Tensor>{out, hy, cy};
  };
  auto op_by_op = [=](const Tensor& input, TensorList hx, TensorList params) {
    if (onednn) {
      auto [out, hy, cy] =
          lstmOneDnn(input, hx, params, has_biases, num_layers, dropout_p, train, bidirectional, batch_first);
      return std::vector<Tensor>{out, hy, cy};
    }
    at::native::check_attributes(input, params, hx);
    auto x = batch_first ? input.transpose(0, 1) : input;
    auto weights = layerWeights(params, has_biases, has_projections);
    auto [out, finals] = layers(Cell::Lstm, x, nullptr, 0, twoHidden(hx[0], hx[1]), weights, num_layers, dropout_p,
                                train, bidirectional);
    auto hy = stacked(finals, false);
    auto cy = stacked(finals, true);
    if (batch_first) out = out.transpose(0, 1);
    return std::vector<Tensor>{out, hy, cy};
  };
  auto r = runRnn("lstm", input, hx, params, dropout_p, train, !onednn, cpu, op_by_op);
  return {r[0], r[1], r[2]};
}

std::tuple<Tensor, Tensor, Tensor> lstmPacked(const Tensor& data, const Tensor& batch_sizes, TensorList hx,
                                              TensorList params, bool has_biases, int64_t num_layers,
                                              double dropout_p, bool train, bool bidirectional) {
  TORCH_CHECK(hx.size() == 2, "lstm expects two hidden states");
  auto cpu = [=](const Tensor& x, TensorList h, TensorList p) {
    auto [out, hy, cy] = at::lstm(x, batch_sizes, h, p, has_biases, num_layers, dropout_p, train, bidirectional);
    return std::vector<Tensor>{out, hy, cy};
  };
  auto op_by_op = [=](const Tensor& data, TensorList hx, TensorList params) {
    const bool has_projections = hx[0].size(2) != hx[1].size(2);
    auto sizes = batch_sizes.contiguous();
    auto weights = layerWeights(params, has_biases, has_projections);
    auto [out, finals] = layers(Cell::Lstm, data, sizes.data_ptr<int64_t>(), sizes.size(0),
                                twoHidden(hx[0], hx[1]), weights, num_layers, dropout_p, train, bidirectional);
    auto hy = stacked(finals, false);
    auto cy = stacked(finals, true);
    return std::vector<Tensor>{out, hy, cy};
  };
  auto r = runRnn("lstm", data, hx, params, dropout_p, train, true, cpu, op_by_op);
  return {r[0], r[1], r[2]};
}

// The cells' argument checks, with the CPU's messages.
void checkCell(const Tensor& input, const Tensor& w_ih, const Tensor& w_hh, int64_t gates, TensorList hiddens) {
  const auto hidden_size = w_hh.sym_size(1);
  TORCH_CHECK(input.sym_size(1) == w_ih.sym_size(1), "input has inconsistent input_size: got ", input.sym_size(1),
              " expected ", w_ih.sym_size(1));
  TORCH_CHECK(w_ih.sym_size(0) == hidden_size * gates, "weight_ih first dim must be ", gates, " * hidden_size = ",
              hidden_size * gates, ", but got ", w_ih.sym_size(0));
  TORCH_CHECK(w_hh.sym_size(0) == hidden_size * gates, "weight_hh first dim must be ", gates, " * hidden_size = ",
              hidden_size * gates, ", but got ", w_hh.sym_size(0));
  for (size_t k = 0; k < hiddens.size(); ++k) {
    const auto& hx = hiddens[k];
    TORCH_CHECK(input.sym_size(0) == hx.sym_size(0), "Input batch size ", input.sym_size(0), " doesn't match hidden",
                k, " batch size ", hx.sym_size(0));
    TORCH_CHECK(hx.sym_size(1) == hidden_size, "hidden", k, " has inconsistent hidden_size: got ", hx.sym_size(1),
                ", expected ", hidden_size);
  }
}

Weights cellWeights(const Tensor& w_ih, const Tensor& w_hh, const std::optional<Tensor>& b_ih,
                    const std::optional<Tensor>& b_hh) {
  return {w_ih, w_hh, b_ih.value_or(Tensor()), b_hh.value_or(Tensor())};
}

std::tuple<Tensor, Tensor> lstmCell(const Tensor& input, TensorList hx, const Tensor& w_ih, const Tensor& w_hh,
                                    const std::optional<Tensor>& b_ih, const std::optional<Tensor>& b_hh) {
  TORCH_CHECK(hx.size() == 2, "lstm_cell expects two hidden states");
  checkCell(input, w_ih, w_hh, 4, hx);
  auto s = step(Cell::Lstm, input, {hx[0], hx[1]}, cellWeights(w_ih, w_hh, b_ih, b_hh), false);
  return {s.h, s.c};
}

template <Cell kCell>
Tensor oneHiddenCell(const Tensor& input, const Tensor& hx, const Tensor& w_ih, const Tensor& w_hh,
                     const std::optional<Tensor>& b_ih, const std::optional<Tensor>& b_hh) {
  checkCell(input, w_ih, w_hh, kCell == Cell::Gru ? 3 : 1, {hx});
  return step(kCell, input, {hx}, cellWeights(w_ih, w_hh, b_ih, b_hh), false).h;
}

// ---- oneDNN's layer on device memory ------------------------------------------------------------

void checkOneDevice(const char* op, const Tensor& input, std::initializer_list<Tensor> others) {
  for (const auto& t : others)
    TORCH_CHECK(!t.defined() || t.device() == input.device(), "Expected all tensors to be on the same device, but ",
                "found at least two devices, ", input.device(), " and ", t.device(), " (in ", op, ")");
}

// aten::mkldnn_rnn_layer and its backward, the CPU kernels on host views of the arguments with their
// results allocated in device memory: what the fallback does, without its boxing (these take 16 and
// 23 arguments, and an LSTM calls them once per layer and direction).
std::tuple<Tensor, Tensor, Tensor, Tensor> oneDnnLayer(const Tensor& input, const Tensor& w0, const Tensor& w1,
                                                       const Tensor& w2, const Tensor& w3, const Tensor& hx,
                                                       const Tensor& cx, bool reverse, c10::IntArrayRef batch_sizes,
                                                       int64_t mode, int64_t hidden_size, int64_t num_layers,
                                                       bool has_biases, bool bidirectional, bool batch_first,
                                                       bool train) {
  const auto d = input.device().index();
  checkOneDevice("mkldnn_rnn_layer", input, {w0, w1, w2, w3, hx, cx});
  DeviceOutputScope scope(d);
  auto [out, hy, cy, workspace] = at::mkldnn_rnn_layer(
      hostArgument(input), hostArgument(w0), hostArgument(w1), hostArgument(w2), hostArgument(w3), hostArgument(hx),
      hostArgument(cx), reverse, batch_sizes, mode, hidden_size, num_layers, has_biases, bidirectional, batch_first,
      train);
  return {deviceResult(out, d), deviceResult(hy, d), deviceResult(cy, d), deviceResult(workspace, d)};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> oneDnnLayerBackward(
    const Tensor& input, const Tensor& w1, const Tensor& w2, const Tensor& w3, const Tensor& w4, const Tensor& hx,
    const Tensor& cx, const Tensor& output, const Tensor& hy, const Tensor& cy,
    const std::optional<Tensor>& grad_output, const std::optional<Tensor>& grad_hy,
    const std::optional<Tensor>& grad_cy, bool reverse, int64_t mode, int64_t hidden_size, int64_t num_layers,
    bool has_biases, bool train, bool bidirectional, c10::IntArrayRef batch_sizes, bool batch_first,
    const Tensor& workspace) {
  const auto d = input.device().index();
  checkOneDevice("mkldnn_rnn_layer_backward", input, {w1, w2, w3, w4, hx, cx, output, hy, cy, workspace});
  DeviceOutputScope scope(d);
  auto [dx, dw1, dw2, db1, db2, dhx, dcx] = at::mkldnn_rnn_layer_backward(
      hostArgument(input), hostArgument(w1), hostArgument(w2), hostArgument(w3), hostArgument(w4), hostArgument(hx),
      hostArgument(cx), hostArgument(output), hostArgument(hy), hostArgument(cy), hostArgument(grad_output),
      hostArgument(grad_hy), hostArgument(grad_cy), reverse, mode, hidden_size, num_layers, has_biases, train,
      bidirectional, batch_sizes, batch_first, hostArgument(workspace));
  return {deviceResult(dx, d),  deviceResult(dw1, d), deviceResult(dw2, d), deviceResult(db1, d),
          deviceResult(db2, d), deviceResult(dhx, d), deviceResult(dcx, d)};
}

constexpr char kOneDnnLayerName[] = "mkldnn_rnn_layer";
constexpr char kOneDnnLayerBackwardName[] = "mkldnn_rnn_layer_backward";

void registerRnns(torch::Library& m) {
  m.impl("lstm.input", TORCH_FN(lstmInput));
  m.impl("lstm.data", TORCH_FN(lstmPacked));
  m.impl("gru.input", TORCH_FN(oneHiddenInput<Cell::Gru>));
  m.impl("gru.data", TORCH_FN(oneHiddenPacked<Cell::Gru>));
  m.impl("rnn_tanh.input", TORCH_FN(oneHiddenInput<Cell::Tanh>));
  m.impl("rnn_tanh.data", TORCH_FN(oneHiddenPacked<Cell::Tanh>));
  m.impl("rnn_relu.input", TORCH_FN(oneHiddenInput<Cell::Relu>));
  m.impl("rnn_relu.data", TORCH_FN(oneHiddenPacked<Cell::Relu>));
  m.impl("lstm_cell", TORCH_FN(lstmCell));
  m.impl("gru_cell", TORCH_FN(oneHiddenCell<Cell::Gru>));
  m.impl("rnn_tanh_cell", TORCH_FN(oneHiddenCell<Cell::Tanh>));
  m.impl("rnn_relu_cell", TORCH_FN(oneHiddenCell<Cell::Relu>));
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) { registerRnns(m); }
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  registerRnns(m);
  m.impl("mkldnn_rnn_layer", TORCH_FN((Launched<kOneDnnLayerName, &oneDnnLayer>::call)));
  m.impl("mkldnn_rnn_layer_backward", TORCH_FN((Launched<kOneDnnLayerBackwardName, &oneDnnLayerBackward>::call)));
}

}  // namespace torchneuron
