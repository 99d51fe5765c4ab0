"""nki.isa's two calling forms (NKI 0.6's destination first, written in place; the earlier one returning a
new tile) against PyTorch on the CPU, masked reductions, and the errors of wrong calls."""

import pytest
import torch

import torchneuron  # noqa: F401
import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


def _close(got, want, **tol):
    torch.testing.assert_close(got.cpu(), want.cpu(), **tol)


def _kernel(body, out_shape):
    """A kernel loading x [P, F] (and y), running ``body(x_tile, y_tile) -> tile`` and storing the tile."""

    @nki.jit
    def kernel(x, y):
        out = nl.ndarray(out_shape, dtype=x.dtype, buffer=nl.shared_hbm)
        a = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        b = nl.ndarray(y.shape, dtype=y.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=a, src=x)
        nisa.dma_copy(dst=b, src=y)
        nisa.dma_copy(dst=out, src=body(a, b))
        return out

    return kernel


def _sbuf(shape, dtype=torch.float32):
    return nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf)


P, F = 128, 64
FORMS = {
    # instruction: (NKI 0.6 positional dst, NKI 0.6 keyword dst, the earlier returning form, torch reference)
    "tensor_scalar": (
        lambda a, b: _ret(lambda d: nisa.tensor_scalar(d, a, op0=nl.multiply, operand0=2.0, op1=nl.add, operand1=1.5)),
        lambda a, b: _ret(lambda d: nisa.tensor_scalar(dst=d, data=a, op0=nl.subtract, operand0=b[:, 0:1],
                                                       reverse0=True)),
        lambda a, b: nisa.tensor_scalar(a, nl.multiply, 2.0, op1=nl.add, operand1=1.5),
        lambda x, y: (x * 2.0 + 1.5, y[:, 0:1] - x, x * 2.0 + 1.5)),
    "tensor_tensor": (
        lambda a, b: _ret(lambda d: nisa.tensor_tensor(d, a, b, nl.multiply)),
        lambda a, b: _ret(lambda d: nisa.tensor_tensor(dst=d, data1=a, data2=b, op=nl.subtract)),
        lambda a, b: nisa.tensor_tensor(a, b, op=nl.maximum),
        lambda x, y: (x * y, x - y, torch.maximum(x, y))),
    "activation": (
        lambda a, b: _ret(lambda d: nisa.activation(d, nl.exp, a, scale=0.5)),
        lambda a, b: _ret(lambda d: nisa.activation(dst=d, op=nl.tanh, data=a, bias=b[:, 0:1])),
        lambda a, b: nisa.activation(nl.exp, a, scale=0.5),
        lambda x, y: (torch.exp(x * 0.5), torch.tanh(x + y[:, 0:1]), torch.exp(x * 0.5))),
}


def _ret(call):
    """Run an NKI 0.6 call into a fresh SBUF tile; the call's return (dst, or nothing) must not matter."""
    d = _sbuf((P, F))
    out = call(d)
    assert out is None or out is d or out.tile is d.tile
    return d


@pytest.mark.parametrize("instr", sorted(FORMS))
@pytest.mark.parametrize("form", [0, 1, 2])
def test_both_calling_forms_equal_torch(instr, form):
    x, y = torch.randn(P, F, device="neuron"), torch.randn(P, F, device="neuron")
    got = _kernel(FORMS[instr][form], (P, F))(x, y)
    _close(got, FORMS[instr][3](x.cpu(), y.cpu())[form], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", ["positional", "keyword", "earlier"])
def test_tensor_reduce_both_forms_equal_torch(form):
    def body(a, b):
        if form == "earlier":
            return nisa.tensor_reduce(nl.add, a, axis=1, keepdims=True)
        d = _sbuf((P, 1))
        if form == "positional":
            nisa.tensor_reduce(d, nl.maximum, a, 1, negate=True, keepdims=True)
        else:
            nisa.tensor_reduce(dst=d, op=nl.add, data=a, axis=[1])
        return d

    x = torch.randn(P, F, device="neuron")
    want = -x.cpu().amax(1, keepdim=True) if form == "positional" else x.cpu().sum(1, keepdim=True)
    _close(_kernel(body, (P, 1))(x, x), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", ["positional", "keyword", "earlier"])
def test_iota_both_forms_equal_torch(form):
    def body(a, b):
        expr = nl.arange(F)[None, :] + 0 * nl.arange(P)[:, None]
        if form == "earlier":
            return nisa.iota(expr, dtype=nl.float32)
        d = _sbuf((P, F))
        nisa.iota(d, expr) if form == "positional" else nisa.iota(dst=d, expr=expr)
        return d

    x = torch.zeros(P, F, device="neuron")
    _close(_kernel(body, (P, F))(x, x), torch.arange(F, dtype=torch.float32).expand(P, F))


def test_dst_form_keeps_the_dst_dtype_and_psum_buffer():
    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=torch.bfloat16, buffer=nl.shared_hbm)
        a = _sbuf(x.shape)
        nisa.dma_copy(dst=a, src=x)
        p = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.psum)
        nisa.tensor_scalar(p, a, op0=nl.add, operand0=1.0)
        assert p.buffer is nl.psum
        s = _sbuf(x.shape, torch.bfloat16)
        nisa.tensor_copy(s, p)
        assert s.dtype == torch.bfloat16
        nisa.dma_copy(dst=out, src=s)
        return out

    x = torch.randn(P, F, device="neuron")
    _close(kernel(x), (x.cpu() + 1.0).bfloat16())


@pytest.mark.parametrize("call, message", [
    (lambda d, a: nisa.tensor_scalar(d, a, op0=nl.add, operand0=1.0), "tensor_scalar: the result has shape"),
    (lambda d, a: nisa.tensor_tensor(d, a, a, nl.add), "tensor_tensor: the result has shape"),
    (lambda d, a: nisa.activation(d, nl.exp, a), "activation: the result has shape"),
    (lambda d, a: nisa.tensor_reduce(d, nl.add, a, 1), "tensor_reduce: the result has shape"),
])
def test_dst_of_the_wrong_shape_raises(call, message):
    @nki.jit
    def kernel(x):
        a = _sbuf(x.shape)
        nisa.dma_copy(dst=a, src=x)
        call(_sbuf((P, 3)), a)
        return x

    with pytest.raises(ValueError, match=message):
        kernel(torch.randn(P, F, device="neuron"))


@pytest.mark.parametrize("name, ref", [("sum", lambda t, m: (t * m).sum(1, keepdim=True)),
                                       ("max", lambda t, m: t.masked_fill(~m, float("-inf")).amax(1, keepdim=True)),
                                       ("min", lambda t, m: t.masked_fill(~m, float("inf")).amin(1, keepdim=True)),
                                       ("mean", lambda t, m: (t * m).sum(1, keepdim=True) / m.sum(1, keepdim=True))])
def test_masked_reduction_runs_over_the_masked_in_elements(name, ref):
    n = 40  # only the first 40 columns of each row

    @nki.jit
    def kernel(x):
        out = nl.ndarray((P, 1), dtype=x.dtype, buffer=nl.shared_hbm)
        i_p, i_f = nl.mgrid[0:P, 0:F]
        a = nl.load(x[i_p, i_f])
        r = getattr(nl, name)(a[i_p, i_f], axis=1, keepdims=True, mask=(i_f < n))
        nl.store(out, value=r)
        return out

    x = torch.randn(P, F, device="neuron")
    m = torch.arange(F)[None, :].expand(P, F) < n
    _close(kernel(x), ref(x.cpu(), m), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", ["earlier", "dst"])
def test_masked_tensor_reduce_partitions_and_free(form):
    rows, n = 100, 17  # partitions below 100, columns below 17: the other outputs are left as they were

    @nki.jit
    def kernel(x):
        out = nl.ndarray((P, 1), dtype=x.dtype, buffer=nl.shared_hbm)
        i_p, i_f = nl.mgrid[0:P, 0:F]
        a = nl.load(x)
        mask = (i_p < rows) & (i_f < n)
        d = _sbuf((P, 1))
        nisa.memset(d, -7.0)
        if form == "dst":
            nisa.tensor_reduce(d, nl.add, a, 1, keepdims=True, mask=mask)
        else:
            r = nisa.tensor_reduce(nl.add, a, axis=1, keepdims=True, mask=mask)
            nisa.tensor_copy(dst=d[0:rows, :], src=r[0:rows, :])
        nl.store(out, value=d)
        return out

    x = torch.randn(P, F, device="neuron")
    want = torch.full((P, 1), -7.0)
    want[:rows] = x.cpu()[:rows, :n].sum(1, keepdim=True)
    _close(kernel(x), want, rtol=1e-5, atol=1e-5)


def test_mask_of_another_shape_is_a_clear_error():
    @nki.jit
    def kernel(x):
        a = nl.load(x)
        nl.sum(a, axis=1, mask=nl.arange(5)[None, :] < 3)
        return x

    with pytest.raises(ValueError, match="nl.sum: a mask of shape"):
        kernel(torch.randn(P, F, device="neuron"))


def test_positional_optional_parameters_in_both_forms():
    """reverse0/op1/operand1 (tensor_scalar), bias/scale (activation), negate/keepdims (tensor_reduce) by position."""

    def body(a, b):
        d = _sbuf((P, F))
        nisa.tensor_scalar(d, a, nl.subtract, 1.0, True, nl.multiply, 3.0)  # (1 - a) * 3
        e = nisa.tensor_scalar(a, nl.subtract, 1.0, True, nl.multiply, 3.0)
        f = nisa.tensor_tensor(d, e, nl.add)
        g = _sbuf((P, F))
        nisa.activation(g, nl.exp, f, b[:, 0:1], 0.25)  # exp(f * 0.25 + b0)
        h = _sbuf((P, 1))
        nisa.tensor_reduce(h, nl.add, g, 1, True, True)  # -sum
        return h

    x, y = torch.randn(P, F, device="neuron"), torch.randn(P, F, device="neuron")
    xc, yc = x.cpu(), y.cpu()
    f = 2 * ((1 - xc) * 3)
    want = -torch.exp(f * 0.25 + yc[:, 0:1]).sum(1, keepdim=True)
    _close(_kernel(body, (P, 1))(x, y), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("call, kind, message", [
    (lambda d, a: nisa.tensor_scalar(d, a, op0=nl.add), TypeError, "tensor_scalar: missing the argument 'operand0'"),
    (lambda d, a: nisa.tensor_tensor(a, a, a), TypeError, "tensor_tensor: missing the argument 'op'"),
    (lambda d, a: nisa.tensor_scalar(a, d, 1.0), TypeError, "tensor_scalar: missing the argument 'operand0'"),
    (lambda d, a: nisa.activation(d, a, nl.exp), TypeError, "activation: a tile"),
])
def test_wrong_calls_are_clear_errors(call, kind, message):
    @nki.jit
    def kernel(x):
        a = _sbuf(x.shape)
        nisa.dma_copy(dst=a, src=x)
        call(_sbuf(x.shape), a)
        return x

    with pytest.raises(kind, match=message):
        kernel(torch.randn(P, F, device="neuron"))


@pytest.mark.parametrize("keyword", [False, True])
def test_iota_pattern_form_equal_torch(keyword):
    """NKI 0.6's iota(dst, pattern, offset, channel_multiplier): offset + p * multiplier + sum(step_i * j_i)."""

    def body(a, b):
        d = _sbuf((P, 4, 16))
        if keyword:
            nisa.iota(dst=d, pattern=[[16, 4], [1, 16]], offset=3, channel_multiplier=-2)
        else:
            nisa.iota(d, [[16, 4], [1, 16]], 3, -2)
        return d

    x = torch.zeros(P, 4, 16, device="neuron")
    want = (3 - 2 * torch.arange(P)[:, None, None] + 16 * torch.arange(4)[None, :, None]
            + torch.arange(16)[None, None, :])
    _close(_kernel(body, (P, 4, 16))(x, x), want.float())


def test_iota_pattern_of_the_wrong_size_raises():
    @nki.jit
    def kernel(x):
        nisa.iota(_sbuf((P, F)), [[1, F + 1]], 0)
        return x

    with pytest.raises(ValueError, match="iota: the pattern"):
        kernel(torch.zeros(P, F, device="neuron"))


@pytest.mark.parametrize("instr", ["tensor_scalar", "tensor_tensor", "activation", "tensor_copy"])
def test_mask_of_an_elementwise_instruction_leaves_the_rest_of_dst(instr):
    n = 24

    def body(a, b):
        i_p, i_f = nl.mgrid[0:P, 0:F]
        d = _sbuf((P, F))
        nisa.memset(d, 5.0)
        m = i_f < n
        if instr == "tensor_scalar":
            nisa.tensor_scalar(d, a, op0=nl.add, operand0=1.0, mask=m)
        elif instr == "tensor_tensor":
            nisa.tensor_tensor(d, a, b, nl.add, mask=m)
        elif instr == "activation":
            nisa.activation(d, nl.exp, a, mask=m)
        else:
            nisa.tensor_copy(d, a, mask=m)
        return d

    x, y = torch.randn(P, F, device="neuron"), torch.randn(P, F, device="neuron")
    xc, yc = x.cpu(), y.cpu()
    full = {"tensor_scalar": xc + 1.0, "tensor_tensor": xc + yc, "activation": torch.exp(xc), "tensor_copy": xc}[instr]
    want = torch.where(torch.arange(F)[None, :] < n, full, torch.full_like(full, 5.0))
    _close(_kernel(body, (P, F))(x, y), want, rtol=1e-5, atol=1e-5)


def test_activation_reduction_into_reduce_res():
    @nki.jit
    def kernel(x):
        out = nl.ndarray((P, 1), dtype=x.dtype, buffer=nl.shared_hbm)
        a = _sbuf(x.shape)
        nisa.dma_copy(dst=a, src=x)
        r = _sbuf((P, 1))
        nisa.activation(_sbuf(x.shape), nl.exp, a, reduce_op=nl.add, reduce_res=r)
        nisa.dma_copy(dst=out, src=r)
        return out

    x = torch.randn(P, F, device="neuron")
    torch.testing.assert_close(kernel(x).cpu(), torch.exp(x.cpu()).sum(1, keepdim=True))


def test_masked_reduction_in_a_custom_op_under_compile():
    """The fake kernel (shapes only) of a masked reduction: no data-dependent decision on fake tensors."""

    @nki.jit
    def kernel(x):
        out = nl.ndarray((P, 1), dtype=x.dtype, buffer=nl.shared_hbm)
        i_p, i_f = nl.mgrid[0:P, 0:F]
        a = nl.load(x)
        r = nl.sum(a[i_p, i_f], axis=1, keepdims=True, mask=(i_f < 40))
        d = _sbuf((P, 1))
        nisa.tensor_reduce(d, nl.add, a, 1, keepdims=True, mask=(i_f < 40))
        nl.store(out, value=nl.add(r, d))
        return out

    @nki.nki_op("nkitest::masked_sum", mutates_args=())
    def masked_sum(x: torch.Tensor) -> torch.Tensor:
        return kernel(x)

    x = torch.randn(P, F, device="neuron")
    want = 2 * x.cpu()[:, :40].sum(1, keepdim=True)
    _close(masked_sum(x), want, rtol=1e-5, atol=1e-5)
    torch.library.opcheck(masked_sum, (x,))
    compiled = torch.compile(lambda x: masked_sum(x) * 2, fullgraph=True, backend="neuron")
    _close(compiled(x), want * 2, rtol=1e-5, atol=1e-5)
