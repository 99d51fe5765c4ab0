"""torch.compile on neuron tensors: the default backend (Inductor) and backend="neuron".

Compiled results are compared with eager CPU results. The models are tiny and
shared between tests so that most compiles hit PyTorch's FX graph cache; a
cold run (empty cache) compiles a handful of small graphs.
"""

import copy
import io
import json
import os
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchneuron
import torchneuron.compile as tc

BACKENDS = ["inductor", "neuron"]
TOL = dict(rtol=1e-4, atol=1e-5)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test starts with empty Dynamo caches and an empty compile report."""
    torch._dynamo.reset()
    tc.reset()
    yield
    torch._dynamo.reset()


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def _batch(n=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g)


def _train(model, opt, step_fn, x, y, steps):
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        step_fn()
        opt.zero_grad()
        losses.append(loss.detach().cpu())
    return losses


@pytest.mark.parametrize("backend", BACKENDS)
def test_training_matches_eager(backend):
    """Forward, backward and a compiled AdamW step for 4 steps match CPU eager."""
    ref = _mlp()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    model = _mlp().to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    compiled = torch.compile(model, backend=backend)
    compiled_step = torch.compile(opt.step, backend=backend)
    x, y = _batch()

    got = _train(compiled, opt, compiled_step, x.to("neuron"), y.to("neuron"), steps=4)
    want = _train(ref, ref_opt, ref_opt.step, x, y, steps=4)

    torch.testing.assert_close(got, want, **TOL)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert p.device.type == "neuron"
        torch.testing.assert_close(p.cpu(), q, **TOL)
    report = tc.report()
    assert report.graphs >= 2  # the model (forward and backward) and the optimizer step
    assert report.num_recompiles == 0


@pytest.mark.parametrize("backend", [*BACKENDS, "function"])
def test_inference_no_grad(backend):
    if backend == "function":
        backend = tc.backend  # torch.compile(model, backend=torchneuron.compile.backend)
    model = _mlp().eval()
    compiled = torch.compile(copy.deepcopy(model).to("neuron"), backend=backend)
    x, _ = _batch()
    with torch.no_grad():
        out = compiled(x.to("neuron"))
    assert out.device.type == "neuron" and not out.requires_grad
    torch.testing.assert_close(out.cpu(), model(x).detach(), **TOL)


def test_attention_model_trains():
    """A one-layer GPT (scaled_dot_product_attention, LayerNorm, GELU, embeddings) trains like eager CPU."""
    from torchneuron.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    ref = GPT(GPTConfig(vocab_size=17, block_size=8, n_layer=1, n_head=2, n_embd=16))
    model = copy.deepcopy(ref).to("neuron")
    tokens = torch.randint(0, 17, (2, 9), generator=torch.Generator().manual_seed(0))
    idx, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    loss = torch.compile(model)(idx.to("neuron"), targets.to("neuron"))[1]
    loss.backward()
    ref_loss = ref(idx, targets)[1]
    ref_loss.backward()
    torch.testing.assert_close(loss.cpu(), ref_loss.detach(), **TOL)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-3, atol=1e-5)


def test_second_device():
    """Buffers of a graph on neuron:1 are allocated on neuron:1, whatever the current device."""
    if torch.neuron.device_count() < 2:
        pytest.skip("needs TORCHNEURON_NUM_DEVICES >= 2")
    model = _mlp().eval()
    compiled = torch.compile(copy.deepcopy(model).to("neuron:1"))
    x, _ = _batch()
    with torch.no_grad():
        out = compiled(x.to("neuron:1"))
    assert out.device == torch.device("neuron:1")
    torch.testing.assert_close(out.cpu(), model(x).detach(), **TOL)


def _generated_code(compiled, *args):
    """The wrapper source of every graph compiled while running compiled(*args) forward and backward."""
    from torch._inductor.utils import run_and_get_code

    def run():
        out = compiled(*args)
        out.sum().backward()
        return out

    _, sources = run_and_get_code(run)
    return sources


@pytest.mark.parametrize("backend", BACKENDS)
def test_wrapper_allocates_with_device_allocator(backend):
    """Graph buffers come from the neuron allocator's direct entry point, on the graph's device."""
    model = _mlp().to("neuron")
    x, _ = _batch()
    sources = _generated_code(torch.compile(model, backend=backend), x.to("neuron"))
    assert len(sources) == 2  # forward and backward
    for src in sources:
        assert "= empty_strided_neuron(" in src and "= empty_strided(" not in src
    torch.neuron.reset_peak_memory_stats()
    before = torch.neuron.memory_allocated()
    out = torch.compile(model, backend=backend)(x.to("neuron"))
    assert torch.neuron.memory_allocated() > before and out.device.type == "neuron"


def test_backend_neuron_leaves_input_checks_to_guards():
    """backend="neuron" drops a forward graph's input size asserts (Dynamo guards them); backward keeps them."""
    model = _mlp().to("neuron")
    x, _ = _batch()
    default_fw, default_bw = _generated_code(torch.compile(copy.deepcopy(model)), x.to("neuron"))
    torch._dynamo.reset()
    neuron_fw, neuron_bw = _generated_code(torch.compile(copy.deepcopy(model), backend="neuron"), x.to("neuron"))
    assert "assert_size_stride(primals_" in default_fw
    assert "assert_size_stride(primals_" not in neuron_fw
    assert "assert_size_stride(" in neuron_bw and "assert_size_stride(" in default_bw
    # The guards still protect the graph: an input of another stride recompiles, results stay right.
    compiled = torch.compile(_mlp().to("neuron"), backend="neuron")
    wide = torch.randn(16, 8 * 2).to("neuron")
    with torch.no_grad():
        for inp in (wide, wide.t().contiguous().t()):
            torch.testing.assert_close(compiled(inp).cpu(), _mlp()(inp.cpu()), **TOL)


def _cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 8 * 8, 4))


@pytest.mark.parametrize("backend", BACKENDS)
def test_convolutional_model(backend):
    """A CNN compiles for inference (Inductor turns its convolutions channels-last) and for training."""
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 4, (4,), generator=g)
    ref = _cnn().eval()
    with torch.no_grad():
        out = torch.compile(copy.deepcopy(ref).to("neuron"), backend=backend)(x.to("neuron"))
        torch.testing.assert_close(out.cpu(), ref(x), **TOL)
    ref.train()
    model = copy.deepcopy(ref).to("neuron")
    compiled = torch.compile(model, backend=backend)
    for _ in range(3):
        for m, inp, tgt in ((ref, x, y), (compiled, x.to("neuron"), y.to("neuron"))):
            F.cross_entropy(m(inp), tgt).backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cnn_inference_allocates_what_cpu_does(backend):
    """Compiled CNN inference on neuron allocates the buffers CPU's compiled code does, in the same layouts.

    In particular the flatten after the last max-pool stays a view: the pool writes its output
    contiguous, with no channels-last copy gathered again for the classifier.
    """
    import re

    from torch._inductor.utils import run_and_get_code

    x = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        _, (cpu_src,) = run_and_get_code(torch.compile(_cnn().eval()), x)
        _, (neuron_src,) = run_and_get_code(torch.compile(_cnn().eval().to("neuron"), backend=backend),
                                            x.to("neuron"))

    def buffers(src, device):
        return sorted(re.findall(rf"empty_strided_{device}\((\([^)]*\)), (\([^)]*\))", src))

    assert buffers(neuron_src, "neuron") == buffers(cpu_src, "cpu")


@pytest.mark.parametrize("backend", BACKENDS)
def test_convolutions_run_channels_last(backend):
    """Both entry points swap a graph's 2-d convolutions for the channels-last op; outputs keep eager's layout."""
    from torch._inductor.utils import run_and_get_code

    conv = nn.Conv2d(3, 8, 3, padding=1)
    x = torch.randn(2, 3, 10, 10)
    ref = conv(x).detach()
    model = copy.deepcopy(conv).to("neuron")
    with torch.no_grad():
        out, (src,) = run_and_get_code(torch.compile(model, backend=backend), x.to("neuron"))
    assert "torchneuron.convolution_channels_last" in src
    torch.testing.assert_close(out.cpu(), ref, **TOL)
    assert out.stride() == ref.stride()  # the graph's output has the layout eager gives it


def test_convolution_channels_last_op():
    """The op itself, eagerly: the convolution's values, channels-last; other ranks are refused."""
    conv = nn.Conv2d(3, 8, 3, padding=1)
    x = torch.randn(2, 3, 10, 10)
    ref = conv(x).detach()
    model = copy.deepcopy(conv).to("neuron")
    direct = torch.ops.torchneuron.convolution_channels_last(x.to("neuron"), model.weight, model.bias, [1, 1],
                                                             [1, 1], [1, 1], False, [0, 0], 1)
    assert direct.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(direct.cpu(), ref, **TOL)
    with pytest.raises(ValueError, match="4-d"):
        torch.ops.torchneuron.convolution_channels_last(torch.randn(1, 3, 8, device="neuron"),
                                                        torch.randn(4, 3, 3, device="neuron"), None, [1], [0],
                                                        [1], False, [0], 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_channels_last_training_gradients(backend):
    """Training graphs run channels-last too; the max-pool gradient (a 2-d tiled scatter) lands right.

    Inductor's C++ generator (PyTorch 2.13) shifts the index of a tiled atomic_add twice; with a
    channels-last forward this model's conv gradients came out wrong before neuron kernels avoided it.
    """
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                        nn.Linear(32 * 16 * 16, 10))
    model = copy.deepcopy(ref).to("neuron")
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(4, 3, 32, 32, generator=g), torch.randint(0, 10, (4,), generator=g)
    compiled = torch.compile(model, backend=backend)
    _, sources = run_and_get_code(lambda: F.cross_entropy(compiled(x.to("neuron")), y.to("neuron")).backward())
    assert any("convolution_channels_last" in src for src in sources)
    for _ in range(2):
        F.cross_entropy(compiled(x.to("neuron")), y.to("neuron")).backward()
    for _ in range(3):
        F.cross_entropy(ref(x), y).backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-3, atol=1e-4)


def test_max_pool_gradient_takes_the_cpu_route():
    """With several threads a max-pool's gradient is a scatter_reduce_ left to ATen's kernel, on neuron as on CPU,
    not a generated kernel adding atomically from every thread."""
    from torch._inductor.utils import run_and_get_code

    def backward_code(device):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)).to(device)
        x = torch.randn(2, 3, 16, 16, device=device)
        _, sources = run_and_get_code(lambda: torch.compile(model)(x).sum().backward())
        return sources[-1]

    for device in ("cpu", "neuron"):
        code = backward_code(device)
        assert "scatter_reduce_" in code and "atomic_add" not in code, device


def _cat_qkv(q, k, v):
    return torch.cat([q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)], dim=1)


def _reused_heavy(x):
    y = torch.exp(x).sin() * torch.tanh(x)
    return y + 1, y.sum(dim=1), (y * y).mean(dim=0)


# Graphs whose lowering Inductor decides by asking whether the device is named "cpu".
KERNEL_PARITY = {
    # vectorized copies into the output's slices, not a per-element select between inputs
    "concatenation": (_cat_qkv, [(32, 64)] * 3),
    # two passes (mean, then squared deviations), not Welford's update per element
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (128,), w, b), [(64, 128), (128,), (128,)]),
    # a division, not a multiplication by the reciprocal
    "division_by_constant": (lambda x: x / 3.0 + 1, [(16, 40)]),
    # a pointwise pad, not a concatenation with the fill
    "right_pad": (lambda x: F.pad(x, (0, 3), value=0.5) * 2, [(8, 29)]),
    # the logical index of the maximum, not its position in memory (the GPU's answer was wrong here)
    "argmax_of_permuted": (lambda x: (torch.argmax(x.permute(2, 0, 1)), torch.argmin(x.transpose(0, 2), dim=0)),
                           [(6, 5, 7)]),
    # a heavy value read three times is computed once into a buffer
    "reused_heavy_pointwise": (_reused_heavy, [(48, 64)]),
}


@pytest.mark.parametrize("case", list(KERNEL_PARITY))
def test_kernels_match_cpu(case):
    """These graphs compile to the same C++ kernels on neuron as on CPU, and compute the same values."""
    import re

    from torch._inductor.utils import run_and_get_code

    fn, shapes = KERNEL_PARITY[case]
    args = [torch.randn(shape) for shape in shapes]
    expected = fn(*args)
    kernels = {}
    for device in ("cpu", "neuron"):
        torch._dynamo.reset()
        out, (src,) = run_and_get_code(torch.compile(fn), *(a.to(device) for a in args))
        torch.testing.assert_close(tuple(t.cpu() for t in out) if isinstance(out, tuple) else out.cpu(), expected)
        kernels[device] = re.findall(r"r\'\'\'(.*?)\'\'\'", src, re.S)
    assert kernels["neuron"] and kernels["neuron"] == kernels["cpu"]


def _conv_variety():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(4, 8, 3, stride=2, padding=1), nn.GELU(),
                         nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=4), nn.BatchNorm2d(8),
                         nn.ConvTranspose2d(8, 4, 2, stride=2), nn.SiLU(), nn.Conv2d(4, 4, 1, bias=False))


@pytest.mark.parametrize("dynamic", [False, True])
def test_channels_last_conv_variety_training(dynamic):
    """Strided, dilated, grouped, transposed and 1x1 convolutions train channels-last like eager, also with dynamic shapes."""
    ref = _conv_variety()
    model = copy.deepcopy(ref).to("neuron")
    compiled = torch.compile(model, dynamic=dynamic)
    g = torch.Generator().manual_seed(7)
    for batch in (3, 5):
        x = torch.randn(batch, 4, 12, 12, generator=g)
        out = compiled(x.to("neuron"))
        expected = ref(x)
        torch.testing.assert_close(out.cpu(), expected, rtol=1e-4, atol=1e-4)
        assert out.stride() == expected.stride()
        out.square().mean().backward()
        expected.square().mean().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-3, atol=1e-4)
        assert p.grad.is_contiguous() and q.grad.is_contiguous()  # (strides of size-1 dims may differ)


def test_channels_last_conv_bfloat16_autocast():
    """Under autocast the convolutions run in bfloat16 channels-last; results match eager within bfloat16 tolerance."""
    ref = _conv_variety().eval()
    model = copy.deepcopy(ref).to("neuron")
    x = torch.randn(2, 4, 12, 12)
    with torch.no_grad(), torch.autocast("neuron", dtype=torch.bfloat16):
        out = torch.compile(model, backend="neuron")(x.to("neuron"))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = ref(x)
    assert out.dtype == expected.dtype
    torch.testing.assert_close(out.cpu().float(), expected.float(), rtol=3e-2, atol=3e-2)


def test_cpu_scalars_mixed_in():
    def f(x, scale, shift):
        return (x * scale + shift).softmax(-1) + torch.ones(3, device=x.device)

    x = torch.randn(4, 3)
    scale = torch.tensor(2.5)  # a 0-dim CPU tensor next to neuron tensors
    got = torch.compile(f)(x.to("neuron"), scale, 0.5)
    assert got.device.type == "neuron"
    torch.testing.assert_close(got.cpu(), f(x, scale, 0.5), **TOL)


def test_dropout_reproducible_under_manual_seed():
    model = nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.5)).to("neuron").train()
    compiled = torch.compile(model, backend="neuron")
    x = torch.randn(8, 16, device="neuron")
    torch.manual_seed(123)
    a = compiled(x).cpu()
    torch.manual_seed(123)
    b = compiled(x).cpu()
    c = compiled(x).cpu()
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(a, c)
    assert 0.2 < (a == 0).float().mean().item() < 0.8


def test_autocast_inside_compiled_code():
    model = _mlp().to("neuron")
    x, _ = _batch()

    def f(inp):
        with torch.autocast("neuron", dtype=torch.bfloat16):
            return model(inp)

    got = torch.compile(f)(x.to("neuron"))
    want = f(x.to("neuron"))
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got.float().cpu(), want.float().cpu(), rtol=2e-2, atol=2e-2)


def test_batch_size_change_recompiles_at_most_once():
    model = _mlp().to("neuron")
    compiled = torch.compile(model)
    with torch.no_grad():
        for n in (8, 16, 32, 5, 16):
            x, _ = _batch(n)
            torch.testing.assert_close(compiled(x.to("neuron")).cpu(), model(x.to("neuron")).cpu(), **TOL)
    report = tc.report()
    assert report.num_recompiles == 1, str(report)
    assert "size mismatch" in report.recompiles[0].reason


@pytest.mark.parametrize("backend", BACKENDS)
def test_training_with_three_batch_size_changes_recompiles_once(backend):
    """Training (compiled model and AdamW step) through batch sizes 8, 16, 32, 5: one recompile, in the report."""
    model = _mlp().to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    compiled = torch.compile(model, backend=backend)
    opt_step = torch.compile(lambda: opt.step(), backend=backend)
    ref = _mlp()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    for n in (8, 16, 32, 5):
        x, y = _batch(n, seed=n)
        loss = F.cross_entropy(compiled(x.to("neuron")), y.to("neuron"))
        loss.backward()
        opt_step()
        opt.zero_grad()
        ref_loss = F.cross_entropy(ref(x), y)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        torch.testing.assert_close(loss.cpu(), ref_loss.detach(), rtol=1e-4, atol=1e-5)
    report = tc.report()
    assert report.num_recompiles == 1, str(report)
    assert "size mismatch" in report.recompiles[0].reason and "recompile" in str(report)


def test_dynamic_true_never_recompiles():
    model = _mlp().to("neuron")
    compiled = torch.compile(model, dynamic=True)
    with torch.no_grad():
        for n in (3, 8, 17):
            x, _ = _batch(n)
            torch.testing.assert_close(compiled(x.to("neuron")).cpu(), model(x.to("neuron")).cpu(), **TOL)
    report = tc.report()
    assert report.num_recompiles == 0, str(report)
    assert report.frames == 1


def test_checkpoint_between_steps_does_not_recompile():
    model = _mlp().to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compiled = torch.compile(model)
    x, y = (t.to("neuron") for t in _batch())
    for step in range(3):
        loss = F.cross_entropy(compiled(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        buffer = io.BytesIO()
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, buffer)
        buffer.seek(0)
        torch.load(buffer, weights_only=True)
    report = tc.report()
    assert report.frames == 1 and report.num_recompiles == 0, str(report)


def test_report_graph_break_with_source_line():
    def f(x):
        y = x.sin()
        torch._dynamo.graph_break()
        return y.cos()

    x = torch.randn(4, device="neuron")
    torch.testing.assert_close(torch.compile(f, backend="neuron")(x).cpu(), f(x).cpu(), **TOL)
    report = tc.report()
    assert report.num_graph_breaks == 1 and report.graphs == 2, str(report)
    line = f.__code__.co_firstlineno + 2
    assert any(loc.endswith(f"test_compile.py:{line}") for loc in report.graph_breaks[0].locations), str(report)
    assert "graph break" in str(report)


def test_fullgraph_raises_on_graph_break():
    def f(x):
        torch._dynamo.graph_break()
        return x + 1

    with pytest.raises(torch._dynamo.exc.Unsupported):
        torch.compile(f, backend="neuron", fullgraph=True)(torch.randn(2, device="neuron"))


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune-no-cudagraphs"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_modes_accepted(backend, mode):
    w = torch.randn(8, 8)

    def f(x, w):
        return torch.relu(x @ w + 1)

    x = torch.randn(4, 8)
    got = torch.compile(f, backend=backend, mode=mode, fullgraph=True)(x.to("neuron"), w.to("neuron"))
    torch.testing.assert_close(got.cpu(), f(x, w), **TOL)


def test_unknown_mode_rejected():
    with pytest.raises(Exception, match="mode"):
        torch.compile(lambda x: x + 1, backend="neuron", mode="fastest")(torch.ones(2, device="neuron"))


def test_import_torch_loads_no_compiler(run_python):
    proc = run_python("import sys, torch; torch.ones(1, device='neuron');"
                      "print('torch._dynamo' in sys.modules, 'torch._inductor' in sys.modules)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False"]


_CACHE_PROGRAM = textwrap.dedent("""
    import torch
    from torch._dynamo.utils import counters
    def f(x):
        return (x.sin() * 2).sum(-1)
    x = torch.randn(4, 8, device="neuron")
    torch.testing.assert_close(torch.compile(f)(x).cpu(), f(x.cpu()))
    print("fx", counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"])
""")


def test_cache_reused_by_second_process_and_log_env(run_python, tmp_path):
    """A second process reuses the FX graph cache in TORCHNEURON_CACHE_DIR; TORCHNEURON_COMPILE_LOG logs compiles."""
    env = {"TORCHNEURON_CACHE_DIR": str(tmp_path), "TORCHNEURON_COMPILE_LOG": "1",
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "not-this-one")}
    first = run_python(_CACHE_PROGRAM, env=env, timeout=600)
    assert first.returncode == 0, first.stderr
    assert "fx 0 1" in first.stdout
    assert "[torchneuron] torch.compile [0/0] compiled f" in first.stderr
    assert (tmp_path / "fxgraph").is_dir() and not (tmp_path / "not-this-one").exists()

    second = run_python(_CACHE_PROGRAM, env=env, timeout=600)
    assert second.returncode == 0, second.stderr
    assert "fx 1 0" in second.stdout

    # A process in which Inductor's check of the host's vector instructions fails compiles its own
    # entry instead of taking vectorized kernels it cannot build (Inductor's keys leave the
    # instruction set out; the check fails e.g. when a module in the working directory shadows the
    # standard library's).
    failed_check = "from torch._inductor import cpu_vec_isa\ncpu_vec_isa.VecISA.check_build = lambda *a: False\n"
    scalar = run_python(failed_check + _CACHE_PROGRAM, env=env, timeout=600)
    assert scalar.returncode == 0, scalar.stderr
    assert "fx 0 1" in scalar.stdout


_TRAIN_CACHE_PROGRAM = textwrap.dedent("""
    import json, sys
    import torch
    from torch._dynamo.utils import counters
    device, backend = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                                torch.nn.Linear(16, 1)).to(device)
    x = torch.randn(4, 8, device=device)
    model(x).sum().backward()
    eager = [p.grad.cpu() for p in model.parameters()]
    model.zero_grad()
    torch.compile(model, backend=backend)(x).sum().backward()
    for p, g in zip(model.parameters(), eager):
        torch.testing.assert_close(p.grad.cpu(), g)
    inductor, aot = counters["inductor"], counters["aot_autograd"]
    print(json.dumps([inductor["fxgraph_cache_hit"], inductor["fxgraph_cache_miss"],
                      inductor["fxgraph_cache_bypass"], aot["autograd_cache_hit"], aot["autograd_cache_miss"],
                      aot["autograd_cache_bypass"], counters["frames"]["ok"]]))
""")


@pytest.mark.parametrize("device,backend", [("neuron", "inductor"), ("neuron", "neuron")])
def test_training_compile_cached_as_on_cpu(run_python, tmp_path, device, backend):
    """A training graph's compile is cached as the CPU's is: a second process takes the AOTAutograd entry and
    both FX graphs (forward, backward) from the cache, nothing bypasses it, and Dynamo compiles one frame
    (the counts the CPU gives for the same program: ("cpu", "inductor") here passes too, run by hand).
    A bypass (an unpicklable or device-specific object in a cache key or entry) would make every process
    compile the graphs again; bench_compile.py --compile-ratio measures the time."""
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path), "TORCHNEURON_CACHE_DIR": str(tmp_path)}
    runs = []
    for _ in range(2):
        proc = run_python(_TRAIN_CACHE_PROGRAM.replace("sys.argv[1], sys.argv[2]", f"{device!r}, {backend!r}"),
                          env=env, timeout=900)
        assert proc.returncode == 0, proc.stderr
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    #             fx hit/miss/bypass, AOT hit/miss/bypass, frames
    assert cold == [0, 2, 0, 0, 1, 0, 1]
    assert warm == [2, 0, 0, 1, 0, 0, 1]


def test_cache_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHNEURON_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", os.environ.get("TORCHINDUCTOR_CACHE_DIR", "/tmp/unused"))
    assert tc.cache_dir() == str(tmp_path / "c")


# A neuron compile that fails half-way (in its kernel generation, after lowering), then a CPU compile:
# the CPU compile must see Inductor as a fresh process does (same config, same FX graph cache key,
# PyTorch's own functions in place).
_SCOPE_PROGRAM = textwrap.dedent('''
    import json, sys
    from unittest import mock
    import torch, torchneuron
    import torch._inductor.codecache as codecache
    import torch._inductor.lowering as lowering
    import torch._inductor.utils as inductor_utils
    import torch._inductor.decomposition as decomposition
    import torch._inductor.ir as ir

    originals = {"lowering.use_two_step_variance": lowering.use_two_step_variance,
                 "lowering.use_scatter_fallback": lowering.use_scatter_fallback,
                 "decomposition.use_scatter_fallback": decomposition.use_scatter_fallback,
                 "utils.use_scatter_fallback": inductor_utils.use_scatter_fallback,
                 "ir.is_cpu": ir.is_cpu, "lowering.cat": lowering.lowerings[torch.ops.aten.cat.default]}
    mode, backend = sys.argv[1], sys.argv[2]
    seen = {}
    if mode == "fail":
        from torchneuron.compile import inductor
        def failing(self, node):
            seen["patched_during_compile"] = (
                lowering.use_two_step_variance is not originals["lowering.use_two_step_variance"]
                and decomposition.use_scatter_fallback is not originals["decomposition.use_scatter_fallback"])
            seen["config_during_compile"] = torch._inductor.config.loop_ordering_after_fusion
            raise RuntimeError("injected failure half-way through a neuron compile")
        with mock.patch.object(inductor.Scheduling, "codegen_node", failing):
            x = torch.randn(8, 16, device="neuron")
            try:
                torch.compile(lambda x: torch.nn.functional.layer_norm(x, (16,)).relu(), backend=backend)(x)
                seen["raised"] = False
            except Exception as e:
                seen["raised"] = "injected failure" in str(e)
    keys = []
    prepare_key = codecache.FxGraphCache.prepare_key
    def recording(*args, **kwargs):
        result = prepare_key(*args, **kwargs)
        keys.append(result[0][0] if result[0] else None)
        return result
    with mock.patch.object(codecache.FxGraphCache, "prepare_key", recording):
        y = torch.compile(lambda x: torch.cat([x, x]).sin().sum(0))(torch.randn(8, 16))
    import torch._inductor.utils as utils_again
    state = {name: value is {"lowering.use_two_step_variance": lowering.use_two_step_variance,
                             "lowering.use_scatter_fallback": lowering.use_scatter_fallback,
                             "decomposition.use_scatter_fallback": decomposition.use_scatter_fallback,
                             "utils.use_scatter_fallback": utils_again.use_scatter_fallback,
                             "ir.is_cpu": ir.is_cpu,
                             "lowering.cat": lowering.lowerings[torch.ops.aten.cat.default]}[name]
             for name, value in originals.items()}
    config = {k: repr(v) for k, v in torch._inductor.config.get_config_copy().items()}
    print(json.dumps({"seen": seen, "keys": keys, "originals_in_place": state, "config": config}))
''')


@pytest.mark.parametrize("backend", ["inductor", "neuron"])
def test_failed_neuron_compile_leaves_cpu_compiles_as_fresh(run_python, tmp_path, backend):
    import json

    code = _SCOPE_PROGRAM + "\n"
    runs = {}
    for mode in ("fail", "fresh"):  # caches of their own: a cache hit computes no FX graph key
        env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / mode), "TORCHNEURON_CACHE_DIR": ""}
        proc = subprocess_run(code, mode, backend, env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    failed, fresh = runs["fail"], runs["fresh"]
    assert failed["seen"] == {"patched_during_compile": True, "config_during_compile": False, "raised": True}
    assert failed["originals_in_place"] == dict.fromkeys(failed["originals_in_place"], True)
    assert failed["keys"] and failed["keys"] == fresh["keys"]
    assert failed["config"] == fresh["config"]


def subprocess_run(code, mode, backend, env):
    import subprocess
    import sys

    full_env = dict(os.environ)
    full_env.update(env)
    return subprocess.run([sys.executable, "-c", code, mode, backend], capture_output=True, text=True,
                          env=full_env, timeout=600)


def test_inductor_changes_are_listed_and_scoped():
    """Every change is listed, none is in force outside a neuron compile, and a scope undoes on failure."""
    import torch._inductor.lowering as lowering
    from torchneuron.compile import inductor

    targets = [p.target for p in inductor.PATCHES]
    assert "torch._inductor.ir.is_cpu" in targets and "torch._inductor.lowering.lowerings[aten.cat]" in targets
    assert all(p.what for p in inductor.PATCHES)
    before = lowering.use_two_step_variance
    assert not inductor.COMPILE_PATCHES.active
    with pytest.raises(ValueError, match="inside"):
        with inductor.neuron_compile():
            assert lowering.use_two_step_variance is inductor._use_two_step_variance
            raise ValueError("inside")
    assert lowering.use_two_step_variance is before and not inductor.COMPILE_PATCHES.active


def test_patch_set_undoes_on_failure_and_rebinds_imported_names(monkeypatch):
    """PatchSet: a replacement that fails undoes those applied before it; a name another module imported is
    replaced there too, and put back, also in a module imported while the scope lasted."""
    import sys
    import types

    from torchneuron import _patch

    def original():
        return "original"

    home, user = types.ModuleType("tnpatchpkg.home"), types.ModuleType("tnpatchpkg.user")
    home.f = user.f = original  # `from .home import f`
    monkeypatch.setitem(sys.modules, "tnpatchpkg.home", home)
    monkeypatch.setitem(sys.modules, "tnpatchpkg.user", user)
    table = {"k": 1}

    def broken(_):
        raise RuntimeError("cannot build")

    patches = _patch.PatchSet("test", [
        _patch.attribute(home, "f", lambda orig: (lambda: "patched"), "f answers patched", bindings="tnpatchpkg"),
        _patch.item(table, lambda: ["k"], lambda orig: orig + 1, "k plus one", target="table[k]"),
        _patch.attribute(home, "g", broken, "fails", bindings="tnpatchpkg"),
    ])
    with pytest.raises(AttributeError):  # home has no g: the third change fails
        patches.apply()
    assert home.f is original and user.f is original and table == {"k": 1} and not patches.active

    ok = _patch.PatchSet("test", patches.replacements[:2])
    with ok.scope():
        assert home.f() == user.f() == "patched" and table == {"k": 2}
        late = types.ModuleType("tnpatchpkg.late")
        late.f = home.f  # imported inside the scope
        monkeypatch.setitem(sys.modules, "tnpatchpkg.late", late)
    assert home.f is original and user.f is original and late.f is original and table == {"k": 1}
    assert [p.target for p in ok.patches] == ["tnpatchpkg.home.f", "table[k]"]


def test_patch_guard_skips_a_patch_the_installed_version_no_longer_needs(monkeypatch, caplog):
    """A Patch records why, upstream and its guard; PatchSet skips, with a warning, a patch whose fixed_in
    the installed package has reached, and applies one it has not (or one without a guard)."""
    import logging
    import sys
    import types

    from torchneuron import _patch

    lib = types.ModuleType("tnguardlib")
    lib.__version__ = "1.4.0+cpu"
    lib.a = lib.b = lib.c = "original"
    monkeypatch.setitem(sys.modules, "tnguardlib", lib)

    def answer(value):
        return lambda orig: value

    patches = _patch.PatchSet("guarded", [
        _patch.attribute(lib, "a", answer("a patched"), "a fixed upstream", why="bug", upstream="lib#1",
                         package="tnguardlib", fixed_in="1.4"),
        _patch.attribute(lib, "b", answer("b patched"), "b fixed later", why="bug", upstream="lib#2",
                         package="tnguardlib", fixed_in="1.10.0"),
        _patch.attribute(lib, "c", answer("c patched"), "c not fixed", why="bug", upstream="lib 1.4.0",
                         package="tnguardlib"),
    ])
    a, b, c = patches.patches
    assert (a.why, a.upstream, a.package, a.fixed_in) == ("bug", "lib#1", "tnguardlib", "1.4")
    assert not a.needed() and b.needed() and c.needed()
    with caplog.at_level(logging.WARNING, logger="torchneuron"), patches.scope():
        assert (lib.a, lib.b, lib.c) == ("original", "b patched", "c patched")
    assert (lib.a, lib.b, lib.c) == ("original", "original", "original")
    assert any("tnguardlib.a not applied" in r.getMessage() and "1.4.0+cpu" in r.getMessage()
               for r in caplog.records)
    with pytest.raises(TypeError):  # the record's fields after what are keyword only
        _patch.Patch("t", "w", "why")
    with pytest.raises(ValueError, match="needs the package"):
        _patch.Patch("t", "w", fixed_in="2.0")
