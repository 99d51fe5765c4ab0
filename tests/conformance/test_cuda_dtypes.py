"""CUDA's dtype coverage on neuron: every (op, dtype) pair OpInfo lists for CUDA but not for the CPU.

PyTorch's OpInfo database (``op_db``) lists the dtypes each op supports on the CPU (``dtypes``) and on
CUDA (``dtypesIfCUDA``). Libraries take CUDA's code paths on any device that is not the CPU, so neuron
runs the pairs CUDA has and the CPU lacks (csrc/aten/widening.cpp). For each pair, the op's sample
inputs run on neuron and are compared with the CPU's result: each aten op in the dtype itself where
the CPU has a kernel for it, else computed on the CPU in the wider dtype and cast back (CUDA's
semantics: complex32 -> complex64, float16/bfloat16 -> float32, bool -> uint8, integers -> float64;
complex nansum zeroes NaN elements), with
assert_close's tolerances for the result's dtype, as the OpInfo slice uses; for float16 and bfloat16
the gradient of the first input is compared too. Random ops (rrelu) are
compared with the same op run on neuron in the wide dtype from the same seed, since the device draws
from its own generator. Pairs left out are listed in expected_failures.CUDA_DTYPE_XFAILS, strictly (a
listed pair that passes fails the test).
"""

from __future__ import annotations

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

import opcheck
from expected_failures import expected_cuda_dtype_failure

MAX_SAMPLES = 8
NEURON = "neuron:0"
RANDOM = {"nn.functional.rrelu"}


def _pairs():
    out = []
    for op in op_db:
        for dtype in sorted(set(op.dtypesIfCUDA) - set(op.dtypes), key=str):
            out.append(pytest.param(op, dtype, id=f"{op.full_name}-{opcheck.dtype_name(dtype)}"))
    return out


PAIRS = _pairs()

_WIDE = {torch.complex32: torch.complex64, torch.float16: torch.float32, torch.bfloat16: torch.float32,
         torch.bool: torch.uint8}
_TWINS = {torch.complex32: torch.float16, torch.float16: torch.complex32}


def _widening(dtype):
    """narrow -> wide for the pair's dtype (with its real/complex twin), as CUDA computes."""
    if dtype in _WIDE:
        pairs = {dtype: _WIDE[dtype]}
        if dtype in _TWINS:
            pairs[_TWINS[dtype]] = _WIDE[_TWINS[dtype]]
        return pairs
    if not dtype.is_floating_point and not dtype.is_complex:
        return {dtype: torch.float64}
    return {}


class WidenedCPU(TorchDispatchMode):
    """CPU ops in the pair's dtype; an aten op whose CPU kernel refuses it runs in the wide dtypes and
    its results are cast back (each op rounds its own result, as CUDA's kernels do)."""

    def __init__(self, widening):
        super().__init__()
        self.widening = widening
        self.back = {w: n for n, w in widening.items()}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.nansum.default and args[0].is_complex():
            # CUDA's NanSumOps: a complex element is NaN if either part is, and counts as zero.
            x = args[0]
            zeroed = torch.where(torch.isnan(x), torch.zeros((), dtype=x.dtype), x)
            return self._widened(torch.ops.aten.sum.dim_IntList, (zeroed, *args[1:]) if len(args) > 1 else
                                 (zeroed, None), kwargs)
        try:
            return func(*args, **kwargs)
        except (NotImplementedError, RuntimeError):
            if not self.widening:
                raise
            return self._widened(func, args, kwargs)

    def _widened(self, func, args, kwargs):
        def widen(v):
            if isinstance(v, torch.Tensor) and v.dtype in self.widening:
                return v.to(self.widening[v.dtype])
            return self.widening.get(v, v) if isinstance(v, torch.dtype) else v

        result = func(*tree_map(widen, args), **tree_map(widen, kwargs))
        return tree_map(lambda v: v.to(self.back[v.dtype]) if isinstance(v, torch.Tensor) and v.dtype in self.back
                        else v, result)


def _cpu_reference(op, sample, dtype):
    widening = _widening(dtype)
    with WidenedCPU(widening):
        return op(sample.input, *sample.args, **sample.kwargs)


def _widened(op, sample, widening):
    """The op on the sample's tensors in the wide dtypes (on their device), its results cast back."""
    back = {w: n for n, w in widening.items()}
    widen = lambda v: v.to(widening[v.dtype]) if isinstance(v, torch.Tensor) and v.dtype in widening else v
    result = op(widen(sample.input), *tree_map(widen, sample.args), **tree_map(widen, sample.kwargs))
    return tree_map(lambda v: v.to(back[v.dtype]) if isinstance(v, torch.Tensor) and v.dtype in back else v, result)


def _on(sample, device):
    move = lambda v: opcheck.copy_tensor(v, device) if isinstance(v, torch.Tensor) else v
    return type(sample)(move(sample.input), args=tree_map(move, sample.args), kwargs=tree_map(move, sample.kwargs))


def _check(op, dtype):
    samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))[:MAX_SAMPLES]
    assert samples, "no samples"
    for i, sample in enumerate(samples):
        dev = _on(sample, NEURON)
        if op.full_name in RANDOM:
            torch.manual_seed(i)
            got = op(dev.input, *dev.args, **dev.kwargs)
            torch.manual_seed(i)
            want = _widened(op, dev, _widening(dtype))
        else:
            want = _cpu_reference(op, sample, dtype)
            got = op(dev.input, *dev.args, **dev.kwargs)
        got_leaves, want_leaves = tree_flatten(got)[0], tree_flatten(want)[0]
        assert len(got_leaves) == len(want_leaves), f"sample {i}: {len(got_leaves)} results, expected {len(want_leaves)}"
        for g, w in zip(got_leaves, want_leaves):
            if isinstance(w, torch.Tensor):
                assert g.device.type == "neuron", f"sample {i}: result on {g.device}"
                torch.testing.assert_close(g.cpu(), w.cpu(), equal_nan=True, msg=lambda m: f"sample {i}: {m}")
            else:
                assert g == w, f"sample {i}: {g!r} != {w!r}"
    return len(samples)


BACKWARD_DTYPES = (torch.float16, torch.bfloat16)
BACKWARD_SAMPLES = 4


def _first_output(result):
    return result if isinstance(result, torch.Tensor) else result[0]


def _check_backward(op, dtype):
    """Gradients of the first input for a cotangent of ones, neuron against the CPU (widened per op)."""
    for i, sample in enumerate(op.sample_inputs("cpu", dtype, requires_grad=True)):
        if i == BACKWARD_SAMPLES:
            break
        dev = _on(sample, NEURON)
        x, xn = sample.input.detach().requires_grad_(), dev.input.detach().requires_grad_()
        with WidenedCPU(_widening(dtype)):
            y = _first_output(op(x, *sample.args, **sample.kwargs))
            y.backward(torch.ones_like(y))
        yn = _first_output(op(xn, *dev.args, **dev.kwargs))
        yn.backward(torch.ones_like(yn))
        torch.testing.assert_close(xn.grad.cpu(), x.grad, msg=lambda m: f"backward, sample {i}: {m}")


@pytest.mark.parametrize("op,dtype", PAIRS)
def test_cuda_dtype(op, dtype):
    name, dname = op.full_name, opcheck.dtype_name(dtype)
    entry = expected_cuda_dtype_failure(name, dname)
    try:
        with torch.no_grad():
            _check(op, dtype)
        if dtype in BACKWARD_DTYPES and op.supports_autograd and op.full_name not in RANDOM:
            _check_backward(op, dtype)
    except Exception as e:
        if entry is None:
            raise
        return  # listed, with its reason
    if entry is not None:
        pytest.fail(f"{name} {dname} passes but expected_failures.CUDA_DTYPE_XFAILS lists it ({entry.reason}): "
                    "remove the entry")


def test_pairs_are_opinfos_cuda_only_dtypes():
    """The sweep covers every pair: counted from op_db itself, none silently dropped."""
    assert len(PAIRS) == sum(len(set(op.dtypesIfCUDA) - set(op.dtypes)) for op in op_db)
    assert len(PAIRS) > 50


def test_out_and_inplace_write_back():
    """out= and in-place calls of widened ops write CUDA's result into their own tensors."""
    ids = torch.randint(0, 8, (40,), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    out = torch.empty(0, dtype=torch.int32, device=NEURON)  # resized, as out= is
    assert torch.histc(ids.to(NEURON), bins=8, min=0, max=8, out=out) is out
    torch.testing.assert_close(out.cpu(), torch.histc(ids.double(), bins=8, min=0, max=8).int())
    # min and max convert to the input's integer type first (0.7 -> 0, 6.9 -> 6), as CUDA's kernel does
    torch.testing.assert_close(torch.histc(ids.to(NEURON), bins=4, min=0.7, max=6.9).cpu(),
                               torch.histc(ids.double(), bins=4, min=0, max=6).int())

    z = torch.randn(6, dtype=torch.complex64, generator=torch.Generator().manual_seed(1)).to(torch.complex32)
    zn = z.to(NEURON)
    assert zn.sin_() is zn
    torch.testing.assert_close(zn.cpu(), z.to(torch.complex64).sin().to(torch.complex32))
    zout = torch.empty(6, dtype=torch.complex32, device=NEURON)
    torch.exp(z.to(NEURON), out=zout)
    torch.testing.assert_close(zout.cpu(), z.to(torch.complex64).exp().to(torch.complex32))
    assert torch.angle(z.to(NEURON)).dtype == torch.float16

    b = torch.tensor([True, False, True], device=NEURON)
    assert b.abs_() is b and b.dtype == torch.bool and b.cpu().tolist() == [True, False, True]
    t = torch.trace(torch.eye(3, dtype=torch.bool, device=NEURON))
    assert t.dtype == torch.int64 and t.item() == 3  # bool sums to int64, as on CUDA

    c = torch.tensor([1 + 1j, complex(float("nan"), 0), 2j, complex(0, float("nan"))], device=NEURON)
    s = torch.empty((), dtype=torch.complex64, device=NEURON)
    torch.nansum(c, 0, out=s)
    torch.testing.assert_close(s.cpu(), torch.tensor(1 + 3j, dtype=torch.complex64))


def test_fused_eager_records_widened_ops():
    """Fused eager records ops and runs them later: a dtype the CPU kernel lacks is widened when recorded."""
    ids = torch.randint(0, 8, (40,), generator=torch.Generator().manual_seed(2), dtype=torch.int32)
    z = torch.randn(4, dtype=torch.complex64, generator=torch.Generator().manual_seed(3)).to(torch.complex32)
    with torch.neuron.eager_mode("fused"):
        h = torch.histc(ids.to(NEURON) + 0, bins=8, min=0, max=8)
        s = torch.sin(z.to(NEURON) * 2)
        t = torch.trace(torch.eye(3, dtype=torch.bool, device=NEURON))
        got = (h.cpu(), s.cpu(), t.cpu())
    torch.testing.assert_close(got[0], torch.histc(ids.double(), bins=8, min=0, max=8).int())
    want = (z.to(torch.complex64) * 2).to(torch.complex32).to(torch.complex64).sin().to(torch.complex32)
    torch.testing.assert_close(got[1], want)
    assert got[2].dtype == torch.int64 and got[2].item() == 3
