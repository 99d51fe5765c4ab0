"""The example kernels as a user runs them (examples/kernels/): fused attention against PyTorch's
scaled_dot_product_attention, the instructions it needs, the kernels as custom ops (opcheck, one node
under torch.compile, fused eager, gradients equal to PyTorch's) and the demo's GPT trained with them."""

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import torchneuron
import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl

KERNELS = Path(__file__).resolve().parent.parent / "examples" / "kernels"
import nki_ops
import train_gpt
from attention import attention_fwd


def _close(got, want, **tol):
    torch.testing.assert_close(got.cpu(), want.cpu(), **tol)


@pytest.mark.parametrize("causal", [True, False])
def test_fused_attention_equals_scaled_dot_product_attention(causal):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 256, 64, generator=g).to("neuron") for _ in range(3))  # two 128-row tiles
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    _close(attention_fwd(q, k, v, causal), want, rtol=1e-4, atol=1e-5)
    short = [z[:, :48] for z in (q, k, v)]  # one tile of 48 rows
    _close(attention_fwd(*short, causal), F.scaled_dot_product_attention(*short, is_causal=causal),
           rtol=1e-4, atol=1e-5)
    qb, kb, vb = (z.bfloat16() for z in (q, k, v))
    _close(attention_fwd(qb, kb, vb, causal), F.scaled_dot_product_attention(qb, kb, vb, is_causal=causal),
           rtol=2e-2, atol=2e-2)
    if causal:  # the causal kernel skips the blocks above the diagonal: 3 of the 4 blocks of TensorE work
        est = attention_fwd.estimate(qb, kb, vb, True, target="trn1").engine_seconds
        full = attention_fwd.estimate(qb, kb, vb, False, target="trn1").engine_seconds
        assert est["TensorE"] == pytest.approx(0.75 * full["TensorE"], rel=1e-9)
        assert est["GpSimd"] > full["GpSimd"]  # the causal mask, on the diagonal blocks only


def test_attention_instructions_equal_torch():
    x = torch.randn(128, 96, device="neuron")
    cond = torch.rand(128, 96, device="neuron") > 0.5

    @nki.jit
    def selects(t, c):
        out = nl.ndarray((4, 128, 96), dtype=t.dtype, buffer=nl.shared_hbm)
        tile = nl.load(t)
        i_p, i_f = nl.arange(128)[:, None], nl.arange(96)[None, :]
        nl.store(out[0], value=nisa.affine_select(i_p - i_f >= 0, tile, -9.0))
        masked = nl.ndarray((128, 96), dtype=t.dtype, buffer=nl.sbuf)
        # The current form: offset + p * channel_multiplier + (-1) * j, compared with 0.
        nisa.affine_select(dst=masked, pattern=[[-1, 96]], offset=0, channel_multiplier=1, on_true_tile=tile,
                           on_false_value=-9.0, cmp_op=nl.greater_equal)
        nl.store(out[1], value=masked)
        nl.store(out[2], value=nl.where(nl.load(c), tile, 0.0))
        nl.store(out[3, 0:96, :], value=nl.load_transpose2d(t[0:96, 0:96]))
        return out

    got = selects(x, cond)
    causal = torch.ones(128, 96, dtype=torch.bool, device="neuron").tril()
    want0 = torch.where(causal, x, torch.tensor(-9.0, device="neuron"))
    _close(got[0], want0, rtol=0, atol=0)
    _close(got[1], want0, rtol=0, atol=0)
    _close(got[2], torch.where(cond, x, torch.zeros((), device="neuron")), rtol=0, atol=0)
    _close(got[3, 0:96], x[0:96, 0:96].t(), rtol=0, atol=0)

    @nki.jit
    def bad_pattern(t):
        return nisa.affine_select(dst=nl.ndarray((128, 96), nl.float32, buffer=nl.sbuf), pattern=[[1, 64]], offset=0,
                                  channel_multiplier=1, on_true_tile=nl.load(t), on_false_value=0.0)

    with pytest.raises(ValueError, match="covers 64 elements") as e:
        bad_pattern(x)
    assert __file__ in str(e.value)


def _rms_inputs():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 70, 128, generator=g).to("neuron")  # 140 rows: a masked tile
    w = torch.randn(128, generator=g).to("neuron")
    return x, w


def _attn_inputs(t=64):
    g = torch.Generator().manual_seed(2)
    return [torch.randn(2, 4, t, 32, generator=g).to("neuron") for _ in range(3)]


def test_the_example_ops_pass_opcheck():
    x, w = _rms_inputs()
    torch.library.opcheck(nki_ops.rms_norm, (x, w, 1e-6))
    torch.library.opcheck(nki_ops.attention, (*_attn_inputs(), True))


def test_gradients_through_the_kernels_equal_pytorchs():
    x, w = (t.requires_grad_() for t in _rms_inputs())
    grad = torch.randn_like(x)
    got = torch.autograd.grad(nki_ops.rms_norm(x, w, 1e-6), (x, w), grad)
    want = torch.autograd.grad(F.rms_norm(x, (128,), w, 1e-6), (x, w), grad)
    for a, b in zip(got, want):
        _close(a, b, rtol=1e-4, atol=1e-5)
    for causal in (True, False):
        q, k, v = (t.requires_grad_() for t in _attn_inputs())
        grad = torch.randn_like(q)
        got = torch.autograd.grad(nki_ops.attention(q, k, v, causal), (q, k, v), grad)
        want = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=causal), (q, k, v), grad)
        for a, b in zip(got, want):
            _close(a, b, rtol=1e-4, atol=1e-5)


def test_a_compiled_block_with_the_kernels_has_no_graph_break():
    import torch._dynamo.testing

    x, w = _rms_inputs()
    q, k, v = _attn_inputs()

    def block(x, w, q, k, v):
        return nki_ops.rms_norm(x, w, 1e-6) * 2, nki_ops.attention(q, k, v, True) + 1

    counter = torch._dynamo.testing.CompileCounterWithBackend("neuron")
    torch._dynamo.reset()
    got = torch.compile(block, backend=counter, fullgraph=True)(x, w, q, k, v)
    assert counter.frame_count == 1
    assert sum(1 for n in counter.graphs[0].graph.nodes if n.target is torch.ops.nki_examples.attention.default) == 1
    _close(got[0], F.rms_norm(x, (128,), w, 1e-6) * 2, rtol=1e-5, atol=1e-5)
    _close(got[1], F.scaled_dot_product_attention(q, k, v, is_causal=True) + 1, rtol=1e-4, atol=1e-5)


def test_the_kernels_run_in_fused_eager():
    x, w = _rms_inputs()
    q, k, v = _attn_inputs()
    want = (F.rms_norm(x, (128,), w, 1e-6) + 1, F.scaled_dot_product_attention(q, k, v, is_causal=True) * 3)
    torchneuron.compile.fused_report(reset=True)
    with torch.neuron.eager_mode("fused"):
        got = (nki_ops.rms_norm(x + 0, w, 1e-6) + 1, nki_ops.attention(q * 1, k, v, True) * 3)
        pending = torchneuron.compile.fused_report()
        got = [t.cpu() for t in got]
    report = torchneuron.compile.fused_report(reset=True)
    # Fused eager saw the work: ops were recorded and held until the host read them, then ran as groups.
    assert pending.recorded_ops >= 1 and pending.mode == "fused", pending
    assert report.recorded_ops >= pending.recorded_ops and report.groups, report
    assert sum(g.ops for g in report.groups) == report.recorded_ops, report
    assert "Memcpy DtoH" in report.cuts, report  # the host's read of the results cut the last group
    _close(got[0], want[0], rtol=1e-5, atol=1e-5)
    _close(got[1], want[1], rtol=1e-4, atol=1e-5)


def test_the_demo_gpt_trains_with_the_kernels_as_with_pytorchs_ops():
    text = train_gpt.load_text()
    tok = train_gpt.CharTokenizer(text)
    data = torch.tensor(tok.encode(text), dtype=torch.long)
    plain = train_gpt.build(tok.vocab_size, n_layer=1)
    nki_model = train_gpt.with_nki(plain)
    assert sum(isinstance(m, train_gpt.NkiAttention) for m in nki_model.modules()) == 1
    assert sum(isinstance(m, train_gpt.NkiRMSNorm) for m in nki_model.modules()) == 3
    want, _ = train_gpt.train(plain, data, 3)
    got, _ = train_gpt.train(nki_model, data, 3)
    assert want[-1] < want[0]
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["tensor_add", "softmax", "layernorm"])
def test_the_example_scripts_run_as_a_user_runs_them(name):
    r = subprocess.run([sys.executable, str(KERNELS / f"{name}.py")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "PROJECTION" in r.stdout and "equals" in r.stdout
