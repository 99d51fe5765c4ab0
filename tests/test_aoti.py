"""Inductor's C++ wrapper on neuron: AOTInductor packages (torch.export, aoti_compile_and_package,
aoti_load_package) and torch.compile with cpp_wrapper=True, against eager results."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._inductor import codecache
from torch._inductor.codegen import cpp_utils

import torchneuron  # noqa: F401
from torchneuron.compile import aoti

TOL = dict(rtol=1e-4, atol=1e-5)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()


class ConvAttention(nn.Module):
    """A convolution stem (conv, batch norm, max-pool) whose pixels then attend to each other."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.norm = nn.LayerNorm(16)
        self.qkv = nn.Linear(16, 48)
        self.out = nn.Linear(16, 5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)  # (n, 16, 4, 4)
        seq = x.flatten(2).transpose(1, 2)  # (n, 16 tokens, 16)
        q, k, v = self.qkv(self.norm(seq)).view(x.shape[0], 16, 3, 2, 8).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(seq.shape)
        return self.out((seq + a).mean(1))


def _package(model, x, path):
    ep = torch.export.export(model, (x,))
    return torch._inductor.aoti_load_package(torch._inductor.aoti_compile_and_package(ep, package_path=str(path)))


def _untouched():
    """Inductor's device table and build entry point are PyTorch's own, and no neuron scope is open."""
    assert cpp_utils.DEVICE_TO_ATEN == {"meta": "at::kMeta", "cpu": "at::kCPU", "cuda": "at::kCUDA",
                                        "xpu": "at::kXPU", "mps": "at::kMPS"}
    assert "neuron" not in cpp_utils.DEVICE_TO_ATEN
    assert codecache.AotCodeCompiler.__dict__["compile"].__func__.__module__ == "torch._inductor.codecache"
    assert not aoti.BUILD_PATCHES.active


def test_packaged_mlp_equals_eager(tmp_path):
    model = _mlp().to("neuron")
    x = torch.randn(3, 8, device="neuron")
    loaded = _package(model, x, tmp_path / "mlp.pt2")
    _untouched()
    before = torch.neuron.memory_allocated()
    y = loaded(x)
    assert y.device == torch.device("neuron:0")
    with torch.no_grad():
        torch.testing.assert_close(y, model(x), **TOL)
    # The first run moved the weights into device memory, where they stay.
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert torch.neuron.memory_allocated() - before >= weights + y.numel() * y.element_size()
    x2 = torch.randn(3, 8, device="neuron")
    with torch.no_grad():
        torch.testing.assert_close(loaded(x2), model(x2), **TOL)
    # The package is host code, loaded by the CPU runner; its metadata says so.
    assert loaded.get_metadata()["AOTI_DEVICE_KEY"] == "cpu"


def test_packaged_model_rejects_another_device(tmp_path):
    model = _mlp().to("neuron")
    x = torch.randn(3, 8, device="neuron")
    loaded = _package(model, x, tmp_path / "mlp.pt2")
    with pytest.raises(RuntimeError, match=r"input 0 of this model must be a tensor on neuron:0"):
        loaded(x.cpu())


def test_packaged_conv_attention_equals_eager(tmp_path):
    torch.manual_seed(0)
    model = ConvAttention().eval()
    with torch.no_grad():  # batch-norm statistics that are not the identity
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    model = model.to("neuron")
    x = torch.randn(2, 3, 8, 8, device="neuron")
    loaded = _package(model, x, tmp_path / "conv_attention.pt2")
    y = loaded(x)
    assert y.device.type == "neuron"
    with torch.no_grad():
        torch.testing.assert_close(y, model(x), **TOL)
        torch.testing.assert_close(y.cpu(), model.cpu()(x.cpu()), **TOL)


def test_packaged_model_on_second_device(tmp_path, two_devices):
    _, dev1 = two_devices
    model = _mlp().to(dev1)
    x = torch.randn(3, 8, device=dev1)
    loaded = _package(model, x, tmp_path / "mlp1.pt2")
    y = loaded(x)
    assert y.device == dev1
    with torch.no_grad():
        torch.testing.assert_close(y, model(x), **TOL)
    with pytest.raises(RuntimeError, match=r"neuron:1"):
        loaded(x.to("neuron:0"))


def test_cpu_package_unchanged_after_neuron(tmp_path):
    neuron = _package(_mlp().to("neuron"), torch.randn(3, 8, device="neuron"), tmp_path / "n.pt2")
    x = torch.randn(3, 8)
    model = _mlp()
    cpu = _package(model, x, tmp_path / "cpu.pt2")
    _untouched()
    y = cpu(x)
    assert y.device.type == "cpu"
    with torch.no_grad():
        torch.testing.assert_close(y, model(x), **TOL)
    torch.testing.assert_close(neuron(x.to("neuron")).cpu(), y, **TOL)


def test_cpp_wrapper_inference_equals_eager():
    model = _mlp().to("neuron")
    x = torch.randn(5, 8, device="neuron")
    compiled = torch.compile(model, options={"cpp_wrapper": True})
    with torch.no_grad():
        y = compiled(x)
        assert y.device.type == "neuron"
        torch.testing.assert_close(y, model(x), **TOL)
    _untouched()


def test_cpp_wrapper_training_neuron_backend():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 1))
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 1)).to("neuron")
    model.load_state_dict(ref.state_dict())
    x = torch.randn(4, 8)
    compiled = torch.compile(model, backend="neuron", options={"cpp_wrapper": True})
    loss = compiled(x.to("neuron")).square().sum()
    loss.backward()
    ref_loss = ref(x).square().sum()
    ref_loss.backward()
    torch.testing.assert_close(loss.cpu(), ref_loss, **TOL)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert p.grad.device.type == "neuron"
        torch.testing.assert_close(p.grad.cpu(), q.grad, **TOL)


STRICT_RUN = r"""
import sys
sys.path.insert(0, sys.argv[1])
import torch
import torchneuron
from test_aoti import ConvAttention, _package
torch.manual_seed(0)
model = ConvAttention().eval()
with torch.no_grad():
    model.bn.running_mean.uniform_(-0.5, 0.5)
    model.bn.running_var.uniform_(0.5, 2.0)
x = torch.randn(2, 3, 8, 8)
with torch.no_grad():
    expected = model(x)
model = model.to("neuron")
loaded = _package(model, x.to("neuron"), sys.argv[2])
for _ in range(3):  # the weights' first copy to the device, then runs from device memory
    torch.testing.assert_close(loaded(x.to("neuron")).cpu(), expected, rtol=1e-4, atol=1e-5)
print("ok")
"""


@pytest.mark.parametrize("mode", ["TORCHNEURON_STRICT", "TORCHNEURON_ASYNC"])
def test_packaged_model_in_strict_and_async_mode(tmp_path, mode):
    """Each C++ kernel and C shim call of the model is a launch: in strict mode device memory is open
    only while one runs, and asynchronous streams order it after earlier work; the ops the CPU's
    kernels dispatch from inside (addmm's copy_ of its bias) run before the kernel goes on."""
    import os
    import pathlib
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHNEURON_")}
    env[mode] = "1"
    here = str(pathlib.Path(__file__).parent)
    done = subprocess.run([sys.executable, "-c", STRICT_RUN, here, str(tmp_path / "m.pt2")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
