"""Recurrent networks on neuron equal the CPU's bit for bit: LSTM, GRU and RNN, their cells, training steps.

On the CPU an LSTM runs oneDNN's fused layer (``aten::mkldnn_rnn_layer``) and
the other networks a composite of ops; neuron takes the same path
(``csrc/aten/rnn.cpp``): the CPU's op whole without autograd, the CPU's op and
its autograd graph over device memory for the composites, the CPU's ops one by
one otherwise (and under a Python mode, which then sees the CPU's ops). Outputs,
gradients and the weights after a few SGD steps are equal (``rtol=0, atol=0``).
"""

import copy

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from torch.utils._python_dispatch import TorchDispatchMode

DEV = torch.device("neuron:0")
EXACT = dict(rtol=0, atol=0)

MODELS = {
    "lstm": lambda: torch.nn.LSTM(8, 16),
    "lstm_2layer_bidir_batch_first": lambda: torch.nn.LSTM(8, 16, num_layers=2, bidirectional=True, batch_first=True),
    "lstm_nobias_3layer": lambda: torch.nn.LSTM(8, 12, num_layers=3, bias=False),
    "lstm_proj_bidir": lambda: torch.nn.LSTM(8, 16, proj_size=5, num_layers=2, bidirectional=True),
    "lstm_float64_bidir": lambda: torch.nn.LSTM(8, 16, num_layers=2, bidirectional=True).double(),
    "lstm_bfloat16": lambda: torch.nn.LSTM(8, 16, num_layers=2).bfloat16(),
    "gru": lambda: torch.nn.GRU(8, 16),
    "gru_2layer_bidir_batch_first": lambda: torch.nn.GRU(8, 16, num_layers=2, bidirectional=True, batch_first=True),
    "rnn_tanh": lambda: torch.nn.RNN(8, 16),
    "rnn_relu_nobias_bidir": lambda: torch.nn.RNN(8, 16, nonlinearity="relu", bias=False, num_layers=2,
                                                  bidirectional=True),
}


def _dtype(model):
    return next(model.parameters()).dtype


def _batches(model, steps=3, seq=7, batch=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (batch, seq, model.input_size) if model.batch_first else (seq, batch, model.input_size)
    return [torch.randn(shape, generator=g).to(_dtype(model)) for _ in range(steps)]


def _train(model, batches, device, run=None, lr=0.1):
    """A few SGD steps; every step's output, final state and gradients, and the final weights."""
    model = copy.deepcopy(model).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=lr, foreach=False)
    run = run or (lambda m, x: m(x))
    record = []
    for x in batches:
        out, state = run(model, x.to(device))
        loss = out.float().pow(2).mean() + sum(s.float().pow(2).mean() for s in (state if isinstance(state, tuple)
                                                                                  else (state,)))
        loss.backward()
        record += [out.detach(), *(state if isinstance(state, tuple) else (state,)), loss.detach()]
        record += [p.grad.detach().clone() for p in model.parameters()]
        opt.step()
        opt.zero_grad()
    return [t.cpu() for t in record] + [p.detach().cpu() for p in model.parameters()]


def _assert_equal(got, want):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, **EXACT, msg=lambda m: f"tensor {i}: {m}")


@pytest.mark.parametrize("name", list(MODELS))
def test_training_steps_equal_the_cpu(name):
    torch.manual_seed(0)
    model = MODELS[name]()
    batches = _batches(model)
    _assert_equal(_train(model, batches, DEV), _train(model, batches, "cpu"))


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_initial_state_equals_the_cpu(kind):
    torch.manual_seed(0)
    model = getattr(torch.nn, kind)(8, 16, num_layers=2, bidirectional=True)
    g = torch.Generator().manual_seed(5)
    h0 = torch.randn(4, 4, 16, generator=g)
    c0 = torch.randn(4, 4, 16, generator=g)

    def run(m, x):
        dev = x.device
        return m(x, (h0.to(dev), c0.to(dev)) if kind == "LSTM" else h0.to(dev))

    batches = _batches(model)
    _assert_equal(_train(model, batches, DEV, run), _train(model, batches, "cpu", run))


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_packed_sequences_equal_the_cpu(kind):
    torch.manual_seed(0)
    model = getattr(torch.nn, kind)(8, 16, num_layers=2, bidirectional=True)
    lengths = torch.tensor([3, 7, 1, 5])  # unsorted: pack sorts, and unsorts the final states

    def run(m, x):
        out, state = m(pack_padded_sequence(x, lengths, enforce_sorted=False))
        return pad_packed_sequence(out)[0], state

    batches = _batches(model)
    _assert_equal(_train(model, batches, DEV, run), _train(model, batches, "cpu", run))


@pytest.mark.parametrize("cell", ["LSTMCell", "GRUCell", "RNNCell"])
def test_cells_equal_the_cpu(cell):
    torch.manual_seed(0)
    model = getattr(torch.nn, cell)(8, 16)

    def run(m, xs):
        state = None
        outs = []
        for x in xs:
            state = m(x, state)
            outs.append(state[0] if isinstance(state, tuple) else state)
        return torch.stack(outs), state

    g = torch.Generator().manual_seed(1)
    batches = [torch.randn(5, 4, 8, generator=g) for _ in range(3)]
    _assert_equal(_train(model, batches, DEV, run), _train(model, batches, "cpu", run))


def _states(state):
    return list(state) if isinstance(state, tuple) else [state]


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("name", list(MODELS))
def test_without_autograd_equals_the_cpu(name, mode):
    # Nothing to record: the CPU's own op runs whole on the device memory.
    torch.manual_seed(0)
    model = MODELS[name]()
    x = _batches(model, steps=1)[0]
    lengths = torch.tensor([7, 6, 3, 1])
    with getattr(torch, mode)():
        for run in (lambda m, x: m(x), lambda m, x: m(pack_padded_sequence(x, lengths, batch_first=m.batch_first))):
            want = run(model, x)
            got = run(copy.deepcopy(model).to(DEV), x.to(DEV))
            out_w, out_g = (want[0], got[0]) if isinstance(want[0], torch.Tensor) else (want[0].data, got[0].data)
            _assert_equal([out_g.cpu(), *[s.cpu() for s in _states(got[1])]], [out_w, *_states(want[1])])


def test_dropout_without_autograd_draws_from_the_device_generator():
    model = torch.nn.LSTM(8, 16, num_layers=2, dropout=0.5).to(DEV)
    x = torch.randn(5, 3, 8, device=DEV)
    torch.neuron.manual_seed(3)
    with torch.no_grad():
        first = model(x)[0]
        second = model(x)[0]
    torch.neuron.manual_seed(3)
    with torch.no_grad():
        again = model(x)[0]
    assert not torch.equal(first.cpu(), second.cpu())
    torch.testing.assert_close(again.cpu(), first.cpu(), **EXACT)


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _ops(model, x, lengths=None):
    with _Ops() as mode:
        out, _ = model(x if lengths is None else pack_padded_sequence(x, lengths))
        (out if lengths is None else out.data).sum().backward()
    return mode.ops


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "LSTM packed", "GRU packed", "LSTM float64"])
def test_dispatches_the_cpus_ops(kind):
    torch.manual_seed(0)
    model = getattr(torch.nn, kind.split()[0])(8, 16, num_layers=2, bidirectional=True)
    if "float64" in kind:
        model = model.double()
    x = _batches(model, steps=1)[0]
    lengths = torch.tensor([7, 5, 3, 1]) if "packed" in kind else None  # sorted: no index to move to the device
    cpu_ops = _ops(model, x, lengths)
    neuron_ops = _ops(copy.deepcopy(model).to(DEV), x.to(DEV), lengths)
    assert neuron_ops == cpu_ops
    assert not any("_thnn_fused" in op for op in neuron_ops)
    if kind == "LSTM":
        assert "aten.mkldnn_rnn_layer.default" in neuron_ops and "aten.mkldnn_rnn_layer_backward.default" in neuron_ops


def test_errors_are_the_cpus():
    model = torch.nn.LSTM(8, 16)
    x = torch.randn(5, 2, 8)
    with pytest.raises(RuntimeError, match="Input and hidden tensors are not at the same device"):
        torch.lstm(x.to(DEV), (torch.zeros(1, 2, 16), torch.zeros(1, 2, 16)),
                   [p.to(DEV) for p in model._flat_weights], True, 1, 0.0, True, False, False)
    cell = torch.nn.GRUCell(8, 16).to(DEV)
    with pytest.raises(RuntimeError, match="input has inconsistent input_size: got 7 expected 8"):
        torch.gru_cell(torch.randn(2, 7, device=DEV), torch.zeros(2, 16, device=DEV), cell.weight_ih, cell.weight_hh,
                       cell.bias_ih, cell.bias_hh)


@pytest.mark.parametrize("kind", ["GRU", "RNN", "LSTM float64"])
def test_double_backward_matches_the_cpu(kind):
    # A gradient penalty: the gradient's graph recorded (create_graph=True), then differentiated again.
    # The first gradient is the CPU's bit for bit; the second goes through the same ops recomputed on
    # the device, whose contributions add up in another order: equal to rounding.
    torch.manual_seed(0)
    model = getattr(torch.nn, kind.split()[0])(8, 16, num_layers=2)
    if "float64" in kind:
        model = model.double()
    x = _batches(model, steps=1)[0]

    def penalty(device):
        m = copy.deepcopy(model).to(device)
        xd = x.to(device).requires_grad_(True)
        out = m(xd)[0]
        (gx,) = torch.autograd.grad(out.pow(2).sum(), xd, create_graph=True)
        gx.pow(2).sum().backward()
        return [gx.detach().cpu()] + [p.grad.cpu() for p in m.parameters()]

    got, want = penalty(DEV), penalty("cpu")
    torch.testing.assert_close(got[0], want[0], **EXACT)
    for g, w in zip(got[1:], want[1:]):
        torch.testing.assert_close(g, w)


def test_retain_graph_and_a_second_backward_equal_the_cpu():
    torch.manual_seed(0)
    model = torch.nn.GRU(8, 16, num_layers=2, bidirectional=True)
    x = _batches(model, steps=1)[0]

    def twice(device):
        m = copy.deepcopy(model).to(device)
        out = m(x.to(device))[0].pow(2).mean()
        out.backward(retain_graph=True)
        out.backward()
        return [p.grad.cpu() for p in m.parameters()]

    _assert_equal(twice(DEV), twice("cpu"))
    m = copy.deepcopy(model).to(DEV)
    out = m(x.to(DEV))[0].sum()
    out.backward()
    with pytest.raises(RuntimeError, match="a second time"):
        out.backward()


def test_a_weight_changed_before_backward_is_caught():
    model = torch.nn.GRU(8, 16).to(DEV)
    out = model(torch.randn(5, 3, 8, device=DEV))[0].sum()
    with torch.no_grad():
        model.weight_hh_l0.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward()


def test_backward_frees_what_the_forward_kept():
    model = torch.nn.GRU(32, 64, num_layers=2).to(DEV)
    x = torch.randn(20, 8, 32, device=DEV)
    model(x)[0].sum().backward()  # gradients allocated once
    torch.neuron.synchronize()
    before = torch.neuron.memory_allocated()
    out = model(x)[0].sum()
    assert torch.neuron.memory_allocated() > before  # the graph's saved tensors are device memory
    out.backward()
    del out
    torch.neuron.synchronize()
    assert torch.neuron.memory_allocated() == before


@pytest.mark.parametrize("how", ["checkpoint", "checkpoint reentrant", "save_on_cpu"])
def test_activation_checkpointing_and_offloading_equal_the_cpu(how):
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(0)
    model = torch.nn.GRU(8, 16, num_layers=2)
    x = _batches(model, steps=1)[0]

    def grads(device):
        m = copy.deepcopy(model).to(device)
        xd = x.to(device).requires_grad_(True)
        if how == "save_on_cpu":
            with torch.autograd.graph.save_on_cpu():
                out = m(xd)[0]
        else:
            out = checkpoint(lambda t: m(t)[0], xd, use_reentrant=how.endswith("reentrant"))
        out.pow(2).sum().backward()
        return [xd.grad.cpu()] + [p.grad.cpu() for p in m.parameters()]

    _assert_equal(grads(DEV), grads("cpu"))
