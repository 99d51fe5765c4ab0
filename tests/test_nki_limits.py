"""NKI kernels against the chip's limits as the compiler sees them (a tile holds its memory from its
allocation to its last use; PSUM accumulation in place; the live tiles named when a kernel is over),
and the replay of a traced kernel as one compiled graph, bit for bit the interpreter's."""

import pytest
import torch

import torchneuron  # noqa: F401
import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki import _exp, _replay

from layernorm import layernorm  # examples/kernels (pytest pythonpath): AWS's tutorial kernels
from matmul import matmul_hoisted, matmul_tiled
from rmsnorm import rmsnorm
from softmax import softmax
from tensor_add import tensor_add, tensor_add_grid


@pytest.fixture
def interpreted(monkeypatch):
    monkeypatch.setenv("TORCHNEURON_NKI_REPLAY", "0")


def test_a_tile_is_dead_after_its_last_use_while_its_name_lives(interpreted):
    @nki.jit
    def scale_rows(x):  # three 96 KiB tiles per partition, two of them live at once at most
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        first = nl.load(x)
        doubled = nl.multiply(first, 2.0)  # `first`'s last use: its name stays bound to the end
        tripled = nl.add(doubled, doubled)
        nl.store(out, value=tripled)
        assert first.shape == (128, 24576)  # the name lives ...
        return out

    x = torch.randn(128, 24576, device="neuron")  # 96 KiB per partition a tile
    torch.testing.assert_close(scale_rows(x).cpu(), (x * 2.0 + x * 2.0).cpu())
    # ... yet trn1's 192 KiB hold it: at most two of the three tiles are live together
    assert scale_rows.estimate(x, target="trn1").sbuf_peak_bytes_per_partition == 2 * 96 * 1024


def test_layernorm_tutorial_at_its_default_size_fits(interpreted):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():  # AWS's LayerNorm tutorial size, 4096 x 8192 float32, shapes only
        x = torch.empty(4096, 8192, device="neuron")
        g = torch.empty(8192, device="neuron")
        est = layernorm.estimate(x, g, g, target="trn2")
    assert 0 < est.sbuf_peak_bytes_per_partition <= 224 * 1024


def test_a_loops_rebinding_counts_once(interpreted):
    lhsT, rhs = torch.randn(256, 256, device="neuron"), torch.randn(256, 1024, device="neuron")
    matmul_tiled(lhsT, rhs)
    assert matmul_tiled.last_estimate.psum_peak_bytes_per_partition == 2048  # one [128, 512] fp32 accumulator


def test_eight_psum_accumulators_in_place(interpreted):
    @nki.jit
    def eight(lhsT, rhs):
        out = nl.ndarray((128, 8 * 512), nl.float32, buffer=nl.shared_hbm)
        accs = [nl.zeros((128, 512), nl.float32, buffer=nl.psum) for _ in range(8)]  # all 8 banks
        for k in nl.affine_range(lhsT.shape[0] // 128):
            stationary = nl.load(lhsT[k * 128:(k + 1) * 128, :])
            for j in nl.affine_range(8):
                moving = nl.load(rhs[k * 128:(k + 1) * 128, j * 512:(j + 1) * 512])
                if j % 2:
                    accs[j] += nisa.nc_matmul(stationary, moving)  # the matmul accumulates into the bank
                else:
                    accs[j][...] += nisa.nc_matmul(stationary, moving)
        for j in range(8):
            nl.store(out[:, j * 512:(j + 1) * 512], value=nl.copy(accs[j]))
        return out

    lhsT, rhs = torch.randn(256, 128, device="neuron"), torch.randn(256, 4096, device="neuron")
    torch.testing.assert_close(eight(lhsT, rhs).cpu(), lhsT.cpu().t() @ rhs.cpu(), rtol=1e-4, atol=1e-4)
    assert eight.last_estimate.psum_peak_bytes_per_partition <= 8 * 2048

    @nki.jit
    def assigned(lhsT, rhs):  # `acc[...] = nc_matmul(...)`: the matmul writes the accumulator
        out = nl.ndarray((128, 8 * 512), nl.float32, buffer=nl.shared_hbm)
        accs = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum) for _ in range(8)]
        stationary = nl.load(lhsT[0:128, :])
        for j in nl.affine_range(8):
            accs[j][...] = nisa.nc_matmul(stationary, nl.load(rhs[0:128, j * 512:(j + 1) * 512]))
        for j in range(8):
            nl.store(out[:, j * 512:(j + 1) * 512], value=nl.copy(accs[j]))
        return out

    torch.testing.assert_close(assigned(lhsT, rhs).cpu(), lhsT.cpu()[0:128].t() @ rhs.cpu()[0:128],
                               rtol=1e-4, atol=1e-4)

    @nki.jit
    def ninth(lhsT, rhs):  # a PSUM result read twice is a tile of its own: the ninth bank
        accs = [nl.zeros((128, 512), nl.float32, buffer=nl.psum) for _ in range(8)]
        result = nisa.nc_matmul(nl.load(lhsT[0:128, :]), nl.load(rhs[0:128, 0:512]))
        extra = nl.copy(result)
        accs[0] += result
        for acc in accs:
            nl.copy(acc)
        return None

    with pytest.raises(MemoryError, match="PSUM is full"):
        ninth(lhsT, rhs)


def test_a_rejected_kernel_lists_its_live_tiles(interpreted):
    @nki.jit
    def too_much(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        rows = [nl.load(x) for _ in range(7)]  # 7 x 32 KiB: all of trn2's 224 KiB
        bias = nl.zeros((128, 8192), nl.float32)  # one more
        for r in rows:
            nl.store(out, value=nl.add(r, bias))
        return out

    with pytest.raises(MemoryError) as e:
        too_much(torch.randn(128, 8192, device="neuron"))
    msg = str(e.value)
    assert "SBUF is full" in msg and "target trn2" in msg
    lines = [ln.strip() for ln in msg.splitlines()[1:]]
    assert len(lines) == 8, msg
    assert sum(ln.startswith("rows: shape (128, 8192)") for ln in lines) == 7, msg
    bias_line = [ln for ln in lines if ln.startswith("bias:")]
    assert bias_line and "32768 bytes per partition" in bias_line[0] and "does not fit" in bias_line[0], msg
    assert all(f"{__file__}:" in ln for ln in lines), msg  # where each tile was made


def test_every_kernel_over_a_limit_is_still_rejected(interpreted):
    @nki.jit
    def nine_banks(x):
        accs = [nl.zeros((128, 512), nl.float32, buffer=nl.psum) for _ in range(9)]
        for acc in accs:
            nl.copy(acc)
        return None

    with pytest.raises(MemoryError, match=r"PSUM is full(.|\n)*9 tiles live"):
        nine_banks(torch.randn(128, 4, device="neuron"))


def _bit_equal(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a.cpu(), b.cpu()), (a.cpu() - b.cpu()).abs().max()


CASES = [
    ("tensor_add", lambda d: (tensor_add, (d(256, 1024), d(256, 1024)))),
    ("tensor_add_grid", lambda d: (tensor_add_grid[2, 2], (d(256, 1024), d(256, 1024)))),
    ("softmax", lambda d: (softmax, (d(256, 512),))),
    ("layernorm", lambda d: (layernorm, (d(256, 512), d(512), d(512)))),
    ("rmsnorm", lambda d: (rmsnorm, (d(300, 256), d(256), 1e-6))),  # a masked last tile
    ("matmul_tiled", lambda d: (matmul_tiled, (d(256, 256), d(256, 1024)))),
    ("matmul_hoisted", lambda d: (matmul_hoisted, (d(256, 128), d(256, 512)))),
]


@pytest.mark.parametrize("name,make", CASES, ids=[c[0] for c in CASES])
def test_replay_equals_the_interpreter_bit_for_bit(name, make, monkeypatch):
    g = torch.Generator().manual_seed(3)
    dev = lambda *shape: torch.randn(*shape, generator=g).to("neuron")  # noqa: E731
    kernel, args = make(dev)
    table = _replay.entries(kernel.fn)
    table.clear()
    monkeypatch.setenv("TORCHNEURON_NKI_REPLAY", "0")
    want = kernel(*args)
    want_estimate = kernel.last_estimate
    monkeypatch.setenv("TORCHNEURON_NKI_REPLAY", "early")
    _bit_equal(kernel(*args), want)  # interpreted (first call at this key)
    _bit_equal(kernel(*args), want)  # traced and compiled
    (entry,) = table.values()
    assert entry.runner is not None, entry.reason  # replayed from now on
    replays = entry.replays
    got = kernel(*args)
    assert entry.replays == replays + 1
    _bit_equal(got, want)
    assert kernel.last_estimate == want_estimate  # the estimate and the peaks are the traced run's
    # New data, same shapes: the replay against the interpreter
    fresh = tuple(dev(*a.shape) if isinstance(a, torch.Tensor) else a for a in args)
    replayed = kernel(*fresh)
    monkeypatch.setenv("TORCHNEURON_NKI_REPLAY", "0")
    _bit_equal(replayed, kernel(*fresh))


def test_data_dependent_control_flow_keeps_the_interpreter(monkeypatch):
    monkeypatch.setenv("TORCHNEURON_NKI_REPLAY", "early")

    @nki.jit
    def positive_or_negative(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        total = nl.sum(t, axis=1, keepdims=True)
        if bool(total.data[0, 0] > 0):  # control flow on the data
            nl.store(out, value=nl.multiply(t, 2.0))
        else:
            nl.store(out, value=nl.multiply(t, -1.0))
        return out

    x = torch.randn(128, 64, device="neuron")
    for _ in range(3):
        positive_or_negative(x)
    (entry,) = _replay.entries(positive_or_negative.fn).values()
    assert entry.runner is None and "reads its data" in entry.reason
    y = x.abs() * (1 if x.cpu()[0].sum() <= 0 else -1)  # the other branch now
    want = y * 2.0 if float(y.cpu()[0].sum()) > 0 else y * -1.0
    torch.testing.assert_close(positive_or_negative(y).cpu(), want.cpu())


def _replayed(kernel, args, monkeypatch):
    """The kernel called three times under early replay (interpreted, traced and compiled, replayed): its
    entry, checked to replay bit for bit what the interpreter computes on new data."""
    table = _replay.entries(kernel.fn)
    table.clear()
    monkeypatch.setenv("TORCHNEURON_NKI_REPLAY", "early")
    for _ in range(3):
        kernel(*args)
    (entry,) = table.values()
    assert entry.runner is not None, entry.reason
    fresh = tuple(torch.randn(a.shape).to("neuron") if isinstance(a, torch.Tensor) else a for a in args)
    replayed = kernel(*fresh)
    monkeypatch.setenv("TORCHNEURON_NKI_REPLAY", "0")
    _bit_equal(replayed, kernel(*fresh))
    return entry


def test_replay_runs_each_per_tile_aten_op_once_for_all_tiles(monkeypatch):
    # softmax's sum runs as ATen's kernel (bit equality): one call for the 4 tiles, not 4; its exp (Inductor's
    # vectorized exp in the interpreter too) is fused
    entry = _replayed(softmax, (torch.randn(512, 256).to("neuron"),), monkeypatch)
    assert entry.exp_fused and entry.merges == 1 and entry.aten_calls == 1, (entry.merges, entry.aten_calls)
    # layernorm's two means: the first reads the input's rows in place (no stack), the second its squares
    entry = _replayed(layernorm, (torch.randn(512, 256).to("neuron"), torch.randn(256).to("neuron"),
                                  torch.randn(256).to("neuron")), monkeypatch)
    assert entry.aten_calls == 2 and entry.ops.get("aten.stack.default") == 1, entry.ops

    @nki.jit
    def tanh_tanh(x):  # two ATen calls per tile, the second on the first's result
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        for i in nl.affine_range(x.shape[0] // 128):
            t = nl.load(x[i * 128:(i + 1) * 128, :])
            nl.store(out[i * 128:(i + 1) * 128, :], value=nl.tanh(nl.multiply(nl.tanh(t), 0.5)))
        return out

    entry = _replayed(tanh_tanh, (torch.randn(384, 64).to("neuron"),), monkeypatch)
    assert entry.merges == 2 and entry.aten_calls == 2, (entry.merges, entry.aten_calls)


def test_replay_keeps_apart_the_tiles_that_reuse_one_buffer(monkeypatch):
    @nki.jit
    def reused(x):  # one SBUF tile written by every iteration: each tanh must read it before the next load
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        buf = nl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        for i in nl.sequential_range(x.shape[0] // 128):
            buf[...] = nl.load(x[i * 128:(i + 1) * 128, :])
            nl.store(out[i * 128:(i + 1) * 128, :], value=nl.tanh(buf))
        return out

    x = torch.randn(384, 64).to("neuron")
    entry = _replayed(reused, (x,), monkeypatch)
    assert entry.merges == 0 and entry.aten_calls >= 3, (entry.merges, entry.aten_calls)
    torch.testing.assert_close(reused(x).cpu(), x.cpu().tanh(), rtol=0, atol=0)


@nki.jit
def _exps(x, bias):
    out = nl.ndarray((3,) + tuple(x.shape), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    nl.store(out[0], value=nl.exp(t))
    nl.store(out[1], value=nisa.activation(op=nl.exp, data=t, bias=nl.load(bias), scale=0.5))
    nl.store(out[2], value=nisa.exponential(t, max_value=nl.load(bias)))
    return out


@pytest.mark.parametrize("cols", [1, 15, 16, 77])
def test_nl_exp_is_inductors_vectorized_exp(cols, monkeypatch):
    # ScalarE's exp (nl.exp, activation, exponential) is the exp Inductor generates, on every element (a row's
    # vector tail included): what Inductor's own compiled code gives, and within float32's tolerance of ATen's
    monkeypatch.setenv("TORCHNEURON_NKI_REPLAY", "0")
    x, bias = torch.randn(128, cols) * 4, torch.randn(128, 1)
    got = _exps(x.to("neuron"), bias.to("neuron")).cpu()
    want = torch.compile(lambda a, b: torch.stack([a.exp(), (a * 0.5 + b).exp(), (a - b).exp()]),
                         backend="inductor", dynamic=False)(x, bias)
    _bit_equal(got, want)
    torch.testing.assert_close(got, torch.stack([x.exp(), (x * 0.5 + bias).exp(), (x - bias).exp()]))
    special = torch.tensor([0.0, -0.0, 88.7, 88.8, -87.3, -103.0, -104.0, float("inf"), float("-inf"), float("nan")])
    torch.testing.assert_close(_exp.exp(special.to("neuron")).cpu(), special.exp(), equal_nan=True)


def test_replay_keeps_the_interpreters_exp_where_its_fused_exp_differs(monkeypatch):
    def fuse_differently(gm):  # a fused "exp" that is not the interpreter's: the first compiled run differs
        n = 0
        for node in gm.graph.nodes:
            if node.target is _exp.vec_exp:
                node.target, n = torch.ops.aten.expm1.default, n + 1
        gm.recompile()
        return n

    monkeypatch.setattr(_replay, "fuse_exp", fuse_differently)
    entry = _replayed(softmax, (torch.randn(512, 256).to("neuron"),), monkeypatch)
    assert not entry.exp_fused and entry.merges == 2 and entry.aten_calls == 2, (entry.merges, entry.aten_calls)
    assert entry.ops.get("nki_exact.vec_exp.default") == 1, entry.ops


def test_replay_computes_a_tiled_elementwise_map_in_one_pass(monkeypatch):
    # tensor_add stores [128, 512] tiles along both axes, each the same add of the same tiles of a and b:
    # the replay is that add of the whole tensors, written once into the output (no per-tile pieces, no
    # concatenation copying them)
    a, b = torch.randn(256, 1024).to("neuron"), torch.randn(256, 1024).to("neuron")
    entry = _replayed(tensor_add, (a, b), monkeypatch)
    assert entry.ops == {"aten.add.Tensor": 1}, entry.ops

    @nki.jit
    def shifted(a_input, b_input):  # each tile adds a's tile to b's next one: not one map of whole tensors
        out = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
        n = a_input.shape[0] // 128
        for i in nl.affine_range(n):
            j = (i + 1) % n
            x = nl.load(a_input[i * 128:(i + 1) * 128, :])
            y = nl.load(b_input[j * 128:(j + 1) * 128, :])
            nl.store(out[i * 128:(i + 1) * 128, :], value=nl.add(x, y))
        return out

    entry = _replayed(shifted, (a, b), monkeypatch)
    assert entry.ops.get("aten.add.Tensor") == 2 and entry.ops.get("aten.cat.default") == 1, entry.ops
    torch.testing.assert_close(shifted(a, b).cpu(), a.cpu() + b.cpu().roll(-128, 0), rtol=0, atol=0)

    @nki.jit
    def left_half(a_input):  # tiles of a wider input: the map of the whole input would not be the output
        out = nl.ndarray((a_input.shape[0], a_input.shape[1] // 2), dtype=a_input.dtype, buffer=nl.shared_hbm)
        for i in nl.affine_range(a_input.shape[0] // 128):
            for j in nl.affine_range(a_input.shape[1] // 1024):
                x = nl.load(a_input[i * 128:(i + 1) * 128, j * 512:(j + 1) * 512])
                nl.store(out[i * 128:(i + 1) * 128, j * 512:(j + 1) * 512], value=nl.multiply(x, 2.0))
        return out

    wide = torch.randn(256, 2048).to("neuron")
    entry = _replayed(left_half, (wide,), monkeypatch)
    assert entry.ops.get("aten.mul.Tensor") == 4, entry.ops
    torch.testing.assert_close(left_half(wide).cpu(), wide.cpu()[:, :1024] * 2.0, rtol=0, atol=0)


def test_a_kernel_taking_an_nl_dtype_is_replayed(monkeypatch):
    @nki.jit
    def cast(x, dtype):
        out = nl.ndarray(x.shape, dtype=dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.multiply(nl.load(x), 3.0, dtype=dtype))
        return out

    x = torch.randn(128, 64).to("neuron")
    entry = _replayed(cast, (x, nl.bfloat16), monkeypatch)
    assert entry.runner is not None
    torch.testing.assert_close(cast(x, nl.bfloat16).cpu(), (x.cpu() * 3.0).to(torch.bfloat16))
