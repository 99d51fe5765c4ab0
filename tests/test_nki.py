"""NKI-style kernels on the emulated NeuronCore (torchneuron.nki): AWS's tutorial kernels against
PyTorch, the chip's limits with the kernel's line in the error, cost estimates, custom ops."""

import pytest
import torch

import torchneuron  # noqa: F401
import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki import nki_op

from attention import attention_fwd  # examples/kernels (pytest pythonpath): AWS's tutorial kernels
from layernorm import layernorm
from matmul import matmul_basic, matmul_hoisted, matmul_tiled
from rmsnorm import rmsnorm
from softmax import softmax
from tensor_add import tensor_add, tensor_add_grid


def _close(got, want, **tol):
    torch.testing.assert_close(got.cpu(), want.cpu(), **tol)


def test_tensor_add_both_styles_equal_torch():
    a, b = torch.randn(256, 1024, device="neuron"), torch.randn(256, 1024, device="neuron")
    _close(tensor_add(a, b), a + b, rtol=0, atol=0)
    _close(tensor_add_grid[2, 2](a, b), a + b, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmul_basic_and_tiled_equal_torch(dtype):
    lhsT, rhs = torch.randn(128, 64, device="neuron", dtype=dtype), torch.randn(128, 512, device="neuron", dtype=dtype)
    want = (lhsT.float().t() @ rhs.float()).to(dtype)
    _close(matmul_basic(lhsT, rhs), want, rtol=1e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-2)
    lhsT, rhs = torch.randn(256, 256, device="neuron", dtype=dtype), torch.randn(256, 1024, device="neuron", dtype=dtype)
    want = (lhsT.float().t() @ rhs.float()).to(dtype)
    tol = dict(rtol=2e-2, atol=5e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-4)
    _close(matmul_tiled(lhsT, rhs), want, **tol)
    _close(matmul_hoisted(lhsT, rhs), want, **tol)


def test_rmsnorm_softmax_layernorm_equal_torch():
    a, g = torch.randn(300, 256, device="neuron"), torch.randn(256, device="neuron")  # 300 rows: a masked tile
    want = a * torch.rsqrt(a.square().mean(1, keepdim=True)) * g
    _close(rmsnorm(a, g), want, rtol=1e-5, atol=1e-5)
    _close(rmsnorm(a, g, 1e-6), torch.nn.functional.rms_norm(a, (256,), g, 1e-6), rtol=1e-5, atol=1e-5)
    x = torch.randn(256, 384, device="neuron")
    _close(softmax(x), torch.softmax(x, 1), rtol=1e-5, atol=1e-6)
    gamma, beta = torch.randn(384, device="neuron"), torch.randn(384, device="neuron")
    _close(layernorm(x, gamma, beta), torch.nn.functional.layer_norm(x, (384,), gamma, beta), rtol=1e-4, atol=1e-4)


def _kernel_error(kernel, *args, kind):
    with pytest.raises(kind) as e:
        kernel(*args)
    msg = str(e.value)
    assert __file__ in msg, msg  # the kernel's own line
    return msg


def test_the_chips_limits_raise_at_the_kernels_line():
    x = torch.randn(256, 512, device="neuron")

    @nki.jit
    def too_many_partitions(t):
        return nl.load(t)  # 256 partitions

    assert "at most 128 partitions" in _kernel_error(too_many_partitions, x, kind=ValueError)

    @nki.jit
    def sbuf_overflow(t):
        keep = [nl.zeros((128, 16384), nl.float32) for _ in range(4)]  # 4 x 64 KiB per partition, all live ...
        out = nl.ndarray((128, 16384), nl.float32, buffer=nl.shared_hbm)
        for k in keep:
            nl.store(out, value=k)  # ... until each is stored
        return out

    assert "SBUF is full" in _kernel_error(sbuf_overflow, x, kind=MemoryError)
    # trn1's partitions hold 192 KiB: 3 such tiles fit, as they do on trn2 (224 KiB) and trn3 (256 KiB).

    @nki.jit
    def psum_banks(t):
        keep = [nl.zeros((128, 512), nl.float32, buffer=nl.psum) for _ in range(9)]  # a bank each, 8 banks
        return [nl.copy(k) for k in keep] and None

    assert "PSUM is full" in _kernel_error(psum_banks, x, kind=MemoryError)

    @nki.jit
    def wide_moving(t):
        a = nl.load(t[0:128, 0:128])
        b = nl.load(t[0:128, 0:512])
        wide = nl.ndarray((128, 1024), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=wide[:, 0:512], src=b)
        nisa.tensor_copy(dst=wide[:, 512:1024], src=b)
        return nisa.nc_matmul(a, wide)

    assert "at most 512" in _kernel_error(wide_moving, x, kind=ValueError)

    @nki.jit
    def uninitialized(t):
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        tile = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile[:, 0:256], src=t[0:128, 0:256])  # half of it
        total = nl.sum(nl.exp(tile), axis=1, keepdims=True)  # every row sums garbage ...
        nl.store(out[:, 0:1], value=total)  # ... and storing it is the error
        return out

    assert "never written" in _kernel_error(uninitialized, x, kind=RuntimeError)

    @nki.jit
    def bf16_psum(t):  # trn2 (the default): TensorE writes a matmul's result into PSUM as float32
        acc = nl.ndarray((128, 512), nl.bfloat16, buffer=nl.psum)
        a = nl.load(t[0:128, :], dtype=nl.bfloat16)
        acc[...] = nisa.nc_matmul(a[:, 0:128], a)
        return acc

    assert "TensorE writes float32 into PSUM" in _kernel_error(bf16_psum, x, kind=TypeError)

    @nki.jit
    def f64_psum(t):
        return nl.ndarray((128, 256), torch.float64, buffer=nl.psum)

    assert "4 bytes at most" in _kernel_error(f64_psum, x, kind=TypeError)

    @nki.jit
    def partition_reduce(t):
        return nl.sum(nl.load(t[0:128, :]), axis=0)

    assert "partition axis" in _kernel_error(partition_reduce, x, kind=ValueError)
    with pytest.raises(ValueError, match="neuron device"):
        tensor_add(torch.randn(128, 512), torch.randn(128, 512))


def _hold(tiles):
    """Store every tile once all are made: they are live together (a tile holds its space until its last use)."""
    for t in tiles:
        nl.store(nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm), value=t)


def test_capacity_follows_the_target_generation(monkeypatch):
    x = torch.randn(128, 512, device="neuron")

    @nki.jit
    def three_and_a_half(t):  # 3.5 x 64 KiB = 224 KiB per partition: fits trn2 and trn3, not trn1
        _hold([nl.zeros((128, 16384), nl.float32) for _ in range(3)] + [nl.zeros((128, 8192), nl.float32)])
        return None

    for target, fits in (("trn1", False), ("trn2", True), ("trn3", True)):
        monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", target)
        if fits:
            three_and_a_half(x)
        else:
            with pytest.raises(MemoryError, match="SBUF is full"):
                three_and_a_half(x)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn9")
    with pytest.raises(ValueError, match="NEURON_PLATFORM_TARGET_OVERRIDE"):
        three_and_a_half(x)


def test_estimates_follow_the_engines_rates():
    lhsT = torch.randn(1024, 1024, device="neuron", dtype=torch.bfloat16)
    rhs = torch.randn(1024, 1024, device="neuron", dtype=torch.bfloat16)
    est = {t: matmul_tiled.estimate(lhsT, rhs, target=t) for t in ("trn1", "trn2", "trn3")}
    flops = 2 * 1024 ** 3
    # TensorE time: 128 matmuls of 128x128x512 at 512 cycles each: 92 TFLOPS bf16 on trn1 (2.8 GHz), 79 on trn2.
    assert flops / est["trn1"].engine_seconds["TensorE"] == pytest.approx(2 * 128 * 128 * 2.8e9, rel=1e-6)
    assert flops / est["trn2"].engine_seconds["TensorE"] == pytest.approx(2 * 128 * 128 * 2.4e9, rel=1e-6)
    # Each input tile is loaded once per output tile: 2 x 8 x 2 x (128x128 + 128x512) bf16 ... over HBM bandwidth.
    moved = 8 * 2 * 8 * (128 * 128 + 128 * 512) * 2 + 1024 * 1024 * 2
    assert est["trn1"].engine_seconds["DMA"] == pytest.approx(moved / (820e9 / 2), rel=1e-6)
    # DMA-bound everywhere: a NeuronCore's share of HBM is 410 GB/s on trn1, 375 on trn2, 588 on trn3.
    assert all(e.bound == "DMA" for e in est.values())
    assert est["trn3"].seconds < est["trn1"].seconds < est["trn2"].seconds
    fp32 = matmul_tiled.estimate(lhsT.float(), rhs.float(), target="trn2")
    assert fp32.engine_seconds["TensorE"] == pytest.approx(4 * est["trn2"].engine_seconds["TensorE"])
    assert "PROJECTION" in str(est["trn2"])


def test_nki_op_is_a_custom_op_in_eager_compile_and_autograd():
    @nki_op("nkitest::rmsnorm", mutates_args=())
    def rms(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return rmsnorm(a, g)

    a, g = torch.randn(200, 128, device="neuron"), torch.randn(128, device="neuron")
    want = a * torch.rsqrt(a.square().mean(1, keepdim=True)) * g
    _close(rms(a, g), want, rtol=1e-5, atol=1e-5)
    torch.library.opcheck(rms, (a, g))
    compiled = torch.compile(lambda a, g: rms(a, g) * 2, fullgraph=True, backend="neuron")
    _close(compiled(a, g), want * 2, rtol=1e-5, atol=1e-5)

    @nki_op("nkitest::add", mutates_args=())
    def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return tensor_add(a, b)

    add.register_autograd(lambda ctx, grad: (grad, grad))
    x = torch.randn(128, 512, device="neuron", requires_grad=True)
    y = torch.randn(128, 512, device="neuron", requires_grad=True)
    add(x, y).sum().backward()
    _close(x.grad, torch.ones_like(x), rtol=0, atol=0)
    torch.library.opcheck(add, (x.detach(), y.detach()))


def test_platform_target_is_the_kernels_own_and_the_override_and_estimate_win(monkeypatch):
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)
    x = torch.randn(128, 512, device="neuron")

    def fill(t):  # 3.5 x 64 KiB per partition: more than trn1's 192 KiB, within trn2's 224
        _hold([nl.zeros((128, 16384), nl.float32) for _ in range(3)] + [nl.zeros((128, 8192), nl.float32)])
        return None

    on_trn1, on_trn2 = nki.jit(platform_target="trn1")(fill), nki.jit(fill)
    with pytest.raises(MemoryError, match="target trn1"):
        on_trn1(x)
    on_trn2(x)
    with pytest.raises(MemoryError, match="target trn1"):
        on_trn1[2](x)  # a grid keeps the kernel's target
    on_trn1.estimate(x, target="trn2")  # estimate(target=) wins
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")  # the override wins over platform_target
    on_trn1(x)
    with pytest.raises(ValueError, match="platform_target='trn7'"):
        nki.jit(platform_target="trn7")(fill)
    with pytest.raises(ValueError, match="target='trn0'"):
        on_trn2.estimate(x, target="trn0")
