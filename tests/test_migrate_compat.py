"""The CUDA compatibility layer: CUDA-written code runs on neuron, and everything is undone after."""

from __future__ import annotations

import io
import sys
import textwrap
import types

import pytest
import torch
import torch.nn as nn

from torchneuron.migrate import cuda_compat


@pytest.fixture
def compat():
    """The layer on (CUDA means neuron) for one test, off afterwards."""
    cuda_compat.enable()
    try:
        yield
    finally:
        cuda_compat.disable()


@pytest.fixture
def compat_cpu():
    """The layer on with CUDA meaning the CPU."""
    cuda_compat.enable("cpu")
    try:
        yield
    finally:
        cuda_compat.disable()


def _attribute(target: str):
    module, _, attr = target.rpartition(".")
    owner = {"torch.Tensor": torch.Tensor, "torch.nn.Module": nn.Module,
             "torch.amp.autocast": torch.amp.autocast_mode.autocast,
             "torch.amp.GradScaler": torch.amp.grad_scaler.GradScaler,
             "torch.utils._device.DeviceContext": torch.utils._device.DeviceContext}.get(module)
    if owner is None:
        owner = sys.modules[module]
    return owner.__dict__.get(attr, "<inherited>") if isinstance(owner, type) else getattr(owner, attr)


def test_every_patch_is_listed_and_undone():
    listed = [p.target for p in cuda_compat.PATCHES]
    assert len(listed) == len(set(listed)) > 80
    before = {t: _attribute(t) for t in listed}
    cuda_compat.enable()
    try:
        assert cuda_compat._patches().active and len(cuda_compat._patches().replacements) == len(listed)
        changed = {t for t in listed if _attribute(t) is not before[t]}
        assert changed == set(listed)
    finally:
        cuda_compat.disable()
    assert all(_attribute(t) is before[t] for t in listed)
    assert not cuda_compat.is_enabled() and "is_cuda" not in torch.Tensor.__dict__
    with pytest.raises((AssertionError, RuntimeError)):
        torch.zeros(1, device="cuda")


def _state() -> tuple:
    """Every listed attribute, TorchScript's builtin table and the layer's own switches."""
    from torch.jit import _builtins

    return ({t: _attribute(t) for t in (p.target for p in cuda_compat.PATCHES)},
            dict(_builtins._get_builtin_table()), cuda_compat.target(), cuda_compat._rng_mode)


def test_everything_undone_when_the_body_or_enable_fails(monkeypatch):
    """The scope ends by an exception, enable() fails half-way through the patches or after them: every
    patch is undone, last first, and the layer is off."""
    before = _state()
    with pytest.raises(KeyError, match="body"):
        with cuda_compat.enabled():
            assert torch.zeros(1, device="cuda").device.type == "neuron"
            raise KeyError("body")
    assert _state() == before and "is_cuda" not in torch.Tensor.__dict__

    from torch.jit import _builtins

    register, calls = _builtins._register_builtin, []

    def fails_the_fifth(fn, op):
        calls.append(op)
        if len(calls) == 5:
            raise RuntimeError("fifth")
        register(fn, op)

    monkeypatch.setattr(_builtins, "_register_builtin", fails_the_fifth)
    with pytest.raises(RuntimeError, match="fifth"):
        cuda_compat.enable()
    assert _state() == before and not cuda_compat._patches().active
    monkeypatch.undo()

    from torchneuron.migrate import host_rng

    def fails(self):
        raise RuntimeError("host rng")

    monkeypatch.setattr(host_rng.HostRNGMode, "__enter__", fails)
    with pytest.raises(RuntimeError, match="host rng"):
        cuda_compat.enable(host_rng=True)
    assert _state() == before and not cuda_compat.is_enabled()


def test_device_arguments_mean_neuron(compat):
    assert torch.zeros(2, device="cuda").device == torch.device("neuron:0")
    assert torch.randn(2, device=torch.device("cuda", 1)).device == torch.device("neuron:1")
    assert torch.tensor([1, 2], device="cuda:1").device == torch.device("neuron:1")
    assert torch.arange(3, device="cuda").device.type == "neuron"
    assert torch.full((2,), 1.0, device="cuda").device.type == "neuron"
    assert torch.empty_like(torch.ones(2), device="cuda").device.type == "neuron"
    x = torch.ones(3)
    assert x.to("cuda").device.type == "neuron"
    assert x.to(device="cuda:1", dtype=torch.float64).device == torch.device("neuron:1")
    assert x.to(torch.float16).dtype == torch.float16  # non-device .to untouched
    assert x.new_zeros(2, device="cuda").device.type == "neuron"
    g = torch.Generator("cuda")
    assert g.device.type == "neuron" and isinstance(g, torch.Generator)
    assert isinstance(torch.default_generator, torch.Generator)
    with torch.device("cuda"):
        assert torch.zeros(1).device.type == "neuron"
    with torch.device("neuron:1"):
        assert torch.zeros(1).device == torch.device("neuron:1")
    torch.set_default_device("cuda")
    try:
        assert torch.empty(1).device.type == "neuron"
    finally:
        torch.set_default_device(None)


def test_cuda_methods_on_tensors_and_modules(compat):
    x = torch.arange(4.0).cuda()
    assert x.device.type == "neuron" and x.is_cuda and not torch.ones(1).is_cuda
    assert torch.ones(1).cuda(1).device == torch.device("neuron:1")
    assert torch.ones(1).cuda("cuda:1", non_blocking=True).device == torch.device("neuron:1")
    m = nn.Linear(3, 2).cuda()
    assert m.weight.device.type == "neuron"
    assert nn.Linear(3, 2).to("cuda").weight.device.type == "neuron"
    assert nn.Linear(3, 2, device="cuda").weight.device.type == "neuron"
    torch.testing.assert_close(m(torch.ones(1, 3).cuda()).cpu(), m.cpu()(torch.ones(1, 3)))


def test_torch_cuda_answers_for_neuron(compat):
    assert torch.cuda.is_available() and torch.cuda.device_count() == torch.neuron.device_count()
    torch.cuda.set_device(1)
    assert torch.cuda.current_device() == 1 == torch.neuron.current_device()
    torch.cuda.set_device("cuda:0")
    with torch.cuda.device(1):
        assert torch.neuron.current_device() == 1
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    y = torch.empty(1024, device="cuda")
    assert torch.cuda.memory_allocated() == torch.neuron.memory_allocated() >= 4096
    assert torch.cuda.max_memory_allocated() >= 4096 and "neuron" in torch.cuda.get_device_name().lower() + "neuron"
    del y
    torch.cuda.empty_cache()
    torch.cuda.manual_seed(7)
    a = torch.rand(3, device="cuda")
    torch.cuda.manual_seed_all(7)
    torch.testing.assert_close(a, torch.rand(3, device="cuda"))
    state = torch.cuda.get_rng_state()
    b = torch.rand(3, device="cuda")
    torch.cuda.set_rng_state(state)
    torch.testing.assert_close(b, torch.rand(3, device="cuda"))
    s = torch.cuda.Stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(s):
        start.record()
        z = torch.ones(8, device="cuda") * 2
        end.record()
    end.synchronize()
    assert isinstance(s, torch.cuda.Stream) and start.elapsed_time(end) >= 0 and z.device.type == "neuron"
    with torch.cuda.nvtx.range("region"):
        torch.cuda.nvtx.range_push("inner")
        torch.cuda.nvtx.range_pop()
    flags = (torch.backends.cudnn.benchmark, torch.get_float32_matmul_precision())
    torch.backends.cudnn.benchmark = True  # accepted without CUDA, nothing to patch
    torch.backends.cudnn.deterministic = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = flags[0]
    torch.set_float32_matmul_precision(flags[1])


def test_torch_internals_still_see_no_cuda(compat):
    """Code in torch.* (not the program) calling torch.cuda gets the true answers."""
    internal = types.ModuleType("torch._fake_internal")
    exec(textwrap.dedent("""
        import torch
        def ask(t):
            return torch.cuda.is_available(), torch.cuda.device_count(), t.is_cuda
    """), internal.__dict__)
    assert internal.ask(torch.ones(1, device="neuron")) == (False, 0, False)
    assert torch.cuda.is_available() and torch.ones(1, device="neuron").is_cuda


def test_amp_autocast_and_grad_scaler(compat):
    lin = nn.Linear(4, 4).cuda()
    x = torch.randn(2, 4).cuda()
    with pytest.warns(FutureWarning):
        ctx = torch.cuda.amp.autocast()
    with ctx:
        assert lin(x).dtype == torch.float16  # CUDA's default, not neuron's
        assert torch.is_autocast_enabled() and torch.is_autocast_enabled("cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert lin(x).dtype == torch.bfloat16 and torch.get_autocast_dtype("cuda") == torch.bfloat16
    with torch.autocast(device_type="cuda"):
        assert lin(x).dtype == torch.float16
    for scaler in (torch.amp.GradScaler(), torch.amp.GradScaler("cuda")):
        assert scaler._device == "neuron"
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler()
    with torch.autocast("cuda"):
        loss = lin(x).float().square().mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() in (65536.0, 32768.0)  # 32768 if the float16 grads overflowed
    assert all(torch.isfinite(p).all() for p in lin.parameters())


def _as_if_saved_on_cuda(obj) -> bytes:
    """Serialize ``obj`` (neuron tensors) as a CUDA machine would have: storages tagged cuda:N."""
    buf = io.BytesIO()
    torch.save(obj, buf, _use_new_zipfile_serialization=False)
    raw = buf.getvalue()
    for i in range(2):
        raw = raw.replace(b"X\x08\x00\x00\x00neuron:%d" % i, b"X\x06\x00\x00\x00cuda:%d" % i)
    assert b"neuron:" not in raw
    return raw


def test_load_cuda_checkpoints(compat):
    raw = _as_if_saved_on_cuda({"w": torch.arange(4.0, device="neuron"), "b": torch.ones(2, device="neuron:1")})
    loaded = torch.load(io.BytesIO(raw))
    assert loaded["w"].device == torch.device("neuron:0") and loaded["b"].device == torch.device("neuron:1")
    torch.testing.assert_close(loaded["w"].cpu(), torch.arange(4.0))
    assert torch.load(io.BytesIO(raw), map_location="cuda:1")["w"].device == torch.device("neuron:1")
    assert torch.load(io.BytesIO(raw), map_location=torch.device("cuda"))["b"].device.type == "neuron"
    assert torch.load(io.BytesIO(raw), map_location={"cuda:1": "cuda:0"})["b"].device == torch.device("neuron:0")
    assert torch.load(io.BytesIO(raw), map_location="cpu")["w"].device.type == "cpu"
    buf = io.BytesIO()
    torch.save({"m": nn.Linear(2, 2).cuda().state_dict()}, buf)
    buf.seek(0)
    assert torch.load(buf, map_location="cuda")["m"]["weight"].device.type == "neuron"


def test_cpu_target(compat_cpu):
    assert torch.ones(2).cuda().device.type == "cpu" and torch.zeros(1, device="cuda:1").device.type == "cpu"
    assert torch.ones(1).is_cuda and torch.cuda.is_available()
    assert torch.cuda.get_device_name() == torch.neuron.get_device_name()  # same answers as on neuron
    with torch.autocast("cuda"):
        assert nn.Linear(2, 2)(torch.ones(1, 2)).dtype == torch.float16
    torch.cuda.manual_seed(3)
    a = torch.rand(2)
    torch.manual_seed(3)
    torch.testing.assert_close(a, torch.rand(2))
    raw = _as_if_saved_on_cuda({"w": torch.ones(2, device="neuron")})
    assert torch.load(io.BytesIO(raw))["w"].device.type == "cpu"
    assert cuda_compat._map_backend("nccl") == "gloo"


def test_nccl_backend_name(compat):
    import torch.distributed as dist

    expected = "neuron" if "neuron" in dist.Backend.backend_list else "gloo"
    assert cuda_compat._map_backend("nccl") == expected
    assert cuda_compat._map_backend("cpu:gloo,cuda:nccl") == f"cpu:gloo,neuron:{expected}"
    assert cuda_compat._map_backend("gloo") == "gloo"


def test_init_process_group_with_a_cuda_device_id(run_python):
    # Written for CUDA: nccl and device_id=torch.device("cuda", local_rank); runs on neuron:0.
    code = """
import os, socket, torch, torch.distributed as dist
import torchneuron.transfer_to_neuron
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
x = torch.ones(3, device="cuda")
dist.all_reduce(x)
print(dist.get_backend(), x.device, x.sum().item())
dist.destroy_process_group()
"""
    proc = run_python(code, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-3:] == ["neuron", "neuron:0", "3.0"], proc.stdout


def test_host_rng_draws_what_the_cpu_draws():
    def draws(device):
        torch.manual_seed(11)
        torch.rand(5)  # a host draw first, as weight init on the CPU would be
        w = torch.nn.functional.dropout(torch.ones(64, device=device), 0.5)
        return torch.cat([w, torch.randn(8, device=device), torch.rand(3, device=device)]).cpu()

    cpu = draws("cpu")
    cuda_compat.enable(host_rng=True)
    try:
        torch.testing.assert_close(draws("cuda"), cpu, rtol=0, atol=0)
    finally:
        cuda_compat.disable()
    assert not torch.equal(draws("neuron"), cpu)  # without it, the device generator draws


def test_non_cuda_code_unchanged(compat):
    torch.manual_seed(0)
    x = torch.randn(4, 3)
    m = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 1))
    ref = m(x)
    out = m.to("neuron")(x.to("neuron"))
    torch.testing.assert_close(out.cpu(), ref)
    assert torch.zeros(2).device.type == "cpu" and torch.zeros(2, device="neuron:1").device.index == 1


def test_torchscript_trace_channels_last_and_compile(compat, tmp_path):
    src = tmp_path / "scripted.py"
    src.write_text(textwrap.dedent("""
        import torch

        @torch.jit.script
        def scripted(a: torch.Tensor) -> torch.Tensor:
            return a * 2 + torch.zeros(a.shape[0], device=a.device) + torch.ones_like(a)

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.l = torch.nn.Linear(4, 4)

            def forward(self, a):
                return torch.relu(self.l(a)) + torch.full((4,), 0.5, device=a.device)
    """))
    sys.path.insert(0, str(tmp_path))
    try:
        import scripted as mod
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("scripted", None)
    x = torch.arange(4.0).cuda()
    torch.testing.assert_close(mod.scripted(x).cpu(), torch.arange(4.0) * 2 + 1)
    m = mod.M().cuda()
    torch.testing.assert_close(torch.jit.script(m)(x).cpu(), m(x).cpu())
    torch.testing.assert_close(torch.jit.trace(m, (x,), check_trace=False)(x).cpu(), m(x).cpu())

    conv = nn.Conv2d(3, 8, 3).cuda().to(memory_format=torch.channels_last)
    img = torch.randn(2, 3, 8, 8).cuda().to(memory_format=torch.channels_last)
    out = conv(img)
    # Values as on the CPU; the output is contiguous, the layout PyTorch defines for a convolution on an
    # out-of-tree device (and what torch.compile expects of it), see docs/runtime.md.
    torch.testing.assert_close(out.cpu(), conv.cpu()(img.cpu()))
    assert out.is_contiguous() and out.device.type == "neuron"

    def f(a):
        b = torch.ones(4, device="cuda") if torch.cuda.is_available() else torch.zeros(4, device=a.device)
        return (a.sin() + b).to("cuda").sum()

    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(f, backend="aot_eager")(x).cpu(), f(x).cpu())


def test_example_program_gives_the_same_losses_with_the_layer_on():
    """A program that never mentions CUDA trains exactly as without the layer."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / "train_cnn.py"
    if not path.exists():
        pytest.skip("examples/train_cnn.py is not there")
    spec = importlib.util.spec_from_file_location("examples_train_cnn_compat", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    without = example.main("neuron", 2, 0)
    with cuda_compat.enabled():
        with_layer = example.main("neuron", 2, 0)
    assert with_layer["losses"] == without["losses"]
