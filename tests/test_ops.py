"""Eager ops on neuron compared with the CPU: values, dtypes, shapes, devices and gradients."""

import copy

import pytest
import torch
import torch.nn.functional as F

DEV = torch.device("neuron:0")


# ---- helpers -------------------------------------------------------------------------------------

def _map(obj, fn):
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        mapped = [_map(o, fn) for o in obj]
        return type(obj)(*mapped) if hasattr(obj, "_fields") else type(obj)(mapped)
    if isinstance(obj, dict):
        return {k: _map(v, fn) for k, v in obj.items()}
    return obj


def _flat(obj):
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _flat(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _flat(o)]
    return []


def _leaf(t, device, grad):
    t = t.detach().clone().to(device)
    if grad and (t.is_floating_point() or t.is_complex()):
        t.requires_grad_(True)
    return t


def assert_on_neuron(obj, index=0):
    for t in _flat(obj):
        assert t.device == torch.device("neuron", index), f"output on {t.device}"


def assert_same(dev_out, cpu_out, strides=True, **tol):
    """Same values, dtypes and shapes, and the same strides (the device runs the CPU's kernels)."""
    assert_on_neuron(dev_out)
    dev_cpu = _map(dev_out, lambda t: t.cpu())
    torch.testing.assert_close(dev_cpu, cpu_out, equal_nan=True, **tol)
    for d, c in zip(_flat(dev_out), _flat(cpu_out)):
        if strides and d.numel() > 1:
            assert d.stride() == c.stride(), f"strides {d.stride()} on neuron, {c.stride()} on cpu"


def check(fn, *args, grad=False, strides=True, **tol):
    """Run ``fn`` on CPU tensors and on copies on neuron; compare outputs (and input gradients)."""
    cpu_args = _map(args, lambda t: _leaf(t, "cpu", grad))
    dev_args = _map(args, lambda t: _leaf(t, DEV, grad))
    cpu_out = fn(*cpu_args)
    dev_out = fn(*dev_args)
    assert_same(dev_out, cpu_out, strides=strides, **tol)
    if grad:
        _check_backward(cpu_out, dev_out, _flat(cpu_args), _flat(dev_args), **tol)
    return dev_out


def _check_backward(cpu_out, dev_out, cpu_leaves, dev_leaves, **tol):
    outs_c = [t for t in _flat(cpu_out) if t.requires_grad]
    outs_d = [t for t in _flat(dev_out) if t.requires_grad]
    assert len(outs_c) == len(outs_d) and outs_c, "nothing to differentiate"
    g = torch.Generator().manual_seed(1)
    cot = [torch.randn(t.shape, generator=g, dtype=t.dtype) for t in outs_c]
    torch.autograd.backward(outs_c, cot)
    torch.autograd.backward(outs_d, [c.to(DEV) for c in cot])
    for lc, ld in zip(cpu_leaves, dev_leaves):
        if lc.requires_grad:
            assert (lc.grad is None) == (ld.grad is None)
            if lc.grad is not None:
                assert ld.grad.device == DEV
                torch.testing.assert_close(ld.grad.cpu(), lc.grad, **tol)


def check_module(module, *inputs, grad=True, strides=True, **tol):
    """Run a module on the CPU and a copy on neuron; compare outputs, input and parameter grads."""
    torch.manual_seed(0)
    dev_module = copy.deepcopy(module).to(DEV)
    out = check(lambda *xs: module(*xs) if not isinstance(xs[0], torch.Tensor) or xs[0].device.type == "cpu"
                else dev_module(*xs), *inputs, grad=grad, strides=strides, **tol)
    if grad:
        for (name, pc), pd in zip(module.named_parameters(), dev_module.parameters()):
            assert pd.device == DEV
            assert pc.grad is not None, name
            torch.testing.assert_close(pd.grad.cpu(), pc.grad, msg=lambda m: f"{name}: {m}", **tol)
    for (name, bc), bd in zip(module.named_buffers(), dev_module.buffers()):
        torch.testing.assert_close(bd.cpu(), bc, msg=lambda m: f"buffer {name}: {m}", **tol)
    return out


def rnd(*shape, dtype=torch.float32, seed=0, low=None, high=None):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if not (dtype.is_floating_point or dtype.is_complex):
        return torch.randint(-20 if low is None else low, 20 if high is None else high, shape,
                             generator=g, dtype=dtype)
    t = torch.randn(shape, generator=g, dtype=torch.complex64 if dtype.is_complex else torch.float32)
    if low is not None:
        t = t.abs() + low
    return t.to(dtype)


def distinct(*shape, seed=0):
    """Values without ties, for sort/topk/max-with-indices."""
    g = torch.Generator().manual_seed(seed)
    n = 1
    for s in shape:
        n *= s
    return (torch.randperm(n, generator=g).float() / 7 - n / 14).reshape(shape)


# ---- elementwise ---------------------------------------------------------------------------------

UNARY = {
    "abs": torch.abs, "neg": torch.neg, "exp": torch.exp, "expm1": torch.expm1, "sin": torch.sin,
    "cos": torch.cos, "tan": torch.tan, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu,
    "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "mish": F.mish,
    "elu": F.elu, "leaky_relu": F.leaky_relu, "softplus": F.softplus, "hardswish": F.hardswish,
    "erf": torch.erf, "atan": torch.atan, "asinh": torch.asinh, "square": torch.square,
    "floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc, "frac": torch.frac,
    "sign": torch.sign, "clamp": lambda x: torch.clamp(x, -0.5, 0.7), "clamp_min": lambda x: x.clamp(min=0.1),
    "pow_scalar": lambda x: x ** 3, "lerp": lambda x: torch.lerp(x, torch.ones_like(x), 0.3),
    "nan_to_num": lambda x: torch.nan_to_num(x / (x > 0)), "isfinite": lambda x: torch.isfinite(x / (x > 0)),
    "logit": lambda x: torch.logit(torch.sigmoid(x)), "hardtanh": F.hardtanh, "rsub": lambda x: 1 - x,
}
POSITIVE_UNARY = {
    "log": torch.log, "log2": torch.log2, "log1p": torch.log1p, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
    "reciprocal": torch.reciprocal, "lgamma": torch.lgamma, "digamma": torch.digamma, "acosh": lambda x: torch.acosh(x + 1),
    "pow_tensor": lambda x: torch.pow(x, x),
}


@pytest.mark.parametrize("name", list(UNARY))
def test_unary(name):
    check(UNARY[name], rnd(5, 7), grad=name not in ("floor", "ceil", "round", "trunc", "sign", "isfinite",
                                                     "nan_to_num"))


@pytest.mark.parametrize("name", list(POSITIVE_UNARY))
def test_unary_positive_domain(name):
    check(POSITIVE_UNARY[name], rnd(4, 6, low=0.5), grad=True)


BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "add_alpha": lambda a, b: torch.add(a, b, alpha=2.5), "maximum": torch.maximum, "minimum": torch.minimum,
    "atan2": torch.atan2, "hypot": torch.hypot, "fmod": torch.fmod, "remainder": torch.remainder,
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"), "copysign": torch.copysign,
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "where": lambda a, b: torch.where(a > b, a, b), "xlogy": lambda a, b: torch.xlogy(a.abs(), b.abs() + 1),
    "addcmul": lambda a, b: torch.addcmul(a, a, b, value=0.5), "addcdiv": lambda a, b: torch.addcdiv(a, a, b.abs() + 1),
    "mse_loss": F.mse_loss, "smooth_l1": F.smooth_l1_loss, "huber": F.huber_loss, "l1": F.l1_loss,
}
NO_GRAD_BINARY = {"eq", "ne", "lt", "le", "gt", "ge", "fmod", "remainder", "div_floor"}


@pytest.mark.parametrize("name", list(BINARY))
def test_binary(name):
    check(BINARY[name], rnd(4, 5, seed=1), rnd(4, 5, seed=2), grad=name not in NO_GRAD_BINARY)


@pytest.mark.parametrize("name", ["add", "mul", "maximum", "div", "where", "ge"])
def test_binary_broadcasting(name):
    check(BINARY[name], rnd(3, 1, 5, seed=1), rnd(4, 1, seed=2), grad=name not in NO_GRAD_BINARY)


def test_binary_with_python_scalars_and_cpu_scalar_tensors():
    check(lambda x: (x + 2, 3 * x, x / 4, x ** 2, 2 ** x, x > 0.5, x + True), rnd(6))
    # A 0-dim CPU tensor is accepted as a scalar, as on CUDA.
    check(lambda x: x * torch.tensor(2.5) + torch.tensor(1), rnd(6))
    check(lambda x: torch.where(x > 0, x, torch.tensor(0.0)), rnd(6))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.int8], ids=str)
def test_integer_ops(dtype):
    low = 0 if dtype == torch.uint8 else -20
    a, b = rnd(5, 6, dtype=dtype, low=low, seed=1), rnd(5, 6, dtype=dtype, low=1, high=9, seed=2)
    check(lambda a, b: (a + b, a * b, a // b, a % b, a & b, a | b, a ^ b, a << 1, a >> 1, ~a, a.abs(),
                        torch.div(a, b, rounding_mode="trunc"), a.sum(), a.max(), a.float() / b, a == b,
                        torch.clamp(a, 0, 5), a.cumsum(0), a.prod(1)), a, b)


def test_bool_ops():
    a, b = rnd(6, 5, dtype=torch.bool, seed=1), rnd(6, 5, dtype=torch.bool, seed=2)
    check(lambda a, b: (a & b, a | b, a ^ b, ~a, torch.logical_and(a, b), torch.logical_not(a), a.any(),
                        a.all(1), a.sum(), a.float().mean(), torch.where(a, 1, 2), a.nonzero(),
                        a.int().argmax(1), a == b, a.to(torch.int64).cumsum(0)), a, b)


# ---- floating dtypes ------------------------------------------------------------------------------

LOW_TOL = {torch.float16: dict(atol=1e-2, rtol=1e-2), torch.bfloat16: dict(atol=5e-2, rtol=2e-2),
           torch.float64: {}, torch.float32: {}}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16], ids=str)
def test_floating_dtypes(dtype):
    a, b = rnd(8, 8, dtype=dtype, seed=1), rnd(8, 8, dtype=dtype, seed=2)
    out = check(lambda a, b: (a + b, a * b, a @ b, torch.exp(a), a.sum(1), a.mean(), torch.softmax(a, 1),
                              F.layer_norm(a, (8,)), a.max(0).values, torch.tanh(b), a.to(torch.float32),
                              torch.cat([a, b]), a.t().contiguous(), a.sort(1).values),
                a, b, grad=True, **LOW_TOL[dtype])
    assert all(t.dtype == dtype for t in out[:10])


def test_mixed_dtype_promotion():
    check(lambda a, b, c: (a + b, a * c, b / c, (a > 0) + b, torch.cat([a, b.to(a.dtype)]).dtype == a.dtype),
          rnd(4, dtype=torch.float16), rnd(4, dtype=torch.float64), rnd(4, dtype=torch.int64, low=1, high=5))


# ---- complex ---------------------------------------------------------------------------------------

def test_complex64_ops():
    a, b = rnd(4, 4, dtype=torch.complex64, seed=1), rnd(4, 4, dtype=torch.complex64, seed=2)
    check(lambda a, b: (a + b, a * b, a / b, a @ b, a.conj(), a.conj() * b, torch.conj_physical(a), a.abs(),
                        a.angle(), a.real, a.imag, torch.view_as_real(a), torch.exp(a), a.sum(), a.mean(0),
                        a.mH, torch.vdot(a.flatten(), b.flatten()), torch.linalg.vector_norm(a),
                        a.conj().resolve_conj(), a.conj().imag, a.is_conj(), a.conj().is_conj(),
                        torch.fft.fft(a), torch.fft.ifft(b, dim=0), torch.polar(a.abs(), a.angle())),
          a, b, atol=1e-5, rtol=1e-5)


def test_complex_autograd():
    check(lambda a, b: ((a * b.conj()).abs().sum(), (a @ b).real.sum(), torch.view_as_real(a.conj().resolve_conj()).sum()),
          rnd(3, 3, dtype=torch.complex64, seed=1), rnd(3, 3, dtype=torch.complex64, seed=2), grad=True)


def test_view_as_complex_and_real_share_memory():
    r = torch.arange(8.0, device="neuron").reshape(4, 2)
    c = torch.view_as_complex(r)
    assert c.dtype == torch.complex64 and c.device == DEV
    c.mul_(2j)
    assert torch.equal(r.cpu(), torch.view_as_real(torch.view_as_complex(torch.arange(8.0).reshape(4, 2)) * 2j))


# ---- reductions --------------------------------------------------------------------------------------

REDUCTIONS = {
    "sum": lambda x: x.sum(), "sum_dim": lambda x: x.sum((0, 2), keepdim=True), "mean": lambda x: x.mean(1),
    "prod": lambda x: x.prod(2), "std": lambda x: x.std(1), "var_unbiased0": lambda x: x.var(0, unbiased=False),
    "norm": lambda x: x.norm(), "vector_norm_dim": lambda x: torch.linalg.vector_norm(x, 3, dim=-1),
    "amax": lambda x: x.amax((1, 2)), "amin": lambda x: x.amin(0), "logsumexp": lambda x: x.logsumexp(2),
    "max_dim": lambda x: x.max(1), "min_dim": lambda x: x.min(-1), "argmax": lambda x: x.argmax(1),
    "argmin": lambda x: x.argmin(), "aminmax": lambda x: torch.aminmax(x, dim=0),
    "cumsum": lambda x: x.cumsum(1), "cumprod": lambda x: x.cumprod(2), "cummax": lambda x: x.cummax(0),
    "logcumsumexp": lambda x: x.logcumsumexp(1), "median_dim": lambda x: x.median(1),
    "mode": lambda x: torch.round(x).mode(1), "kthvalue": lambda x: x.kthvalue(2, 1),
    "quantile": lambda x: torch.quantile(x, 0.3, dim=1), "nansum": lambda x: x.nansum(),
    "count_nonzero": lambda x: torch.count_nonzero(x > 0, dim=1), "any": lambda x: (x > 1).any(2),
    "all": lambda x: (x > -3).all(), "softmax": lambda x: x.softmax(1), "log_softmax": lambda x: x.log_softmax(-1),
    "var_mean": lambda x: torch.var_mean(x, 1), "trace": lambda x: x[0].trace(), "diff": lambda x: x.diff(dim=1),
}
NO_GRAD_RED = {"argmax", "argmin", "count_nonzero", "any", "all", "mode"}


@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_reductions(name):
    check(REDUCTIONS[name], distinct(3, 4, 5), grad=name not in NO_GRAD_RED)


def test_reductions_of_empty_and_scalar_tensors():
    check(lambda e, s: (e.sum(), e.sum(0), e.amax(1), e.prod(), s.sum(), s.mean(), s * 2, s.item()),
          torch.empty(0, 3), torch.tensor(2.5))


# ---- matmul and linear algebra --------------------------------------------------------------------

MATMUL = {
    "mm": (torch.mm, [(5, 3), (3, 4)]), "bmm": (torch.bmm, [(2, 5, 3), (2, 3, 4)]),
    "matmul_vec": (torch.matmul, [(5, 3), (3,)]), "matmul_batched_broadcast": (torch.matmul, [(2, 1, 5, 3), (4, 3, 2)]),
    "matmul_1d_1d": (torch.matmul, [(6,), (6,)]), "mv": (torch.mv, [(4, 3), (3,)]),
    "addmm": (lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2), [(4,), (5, 3), (3, 4)]),
    "baddbmm": (torch.baddbmm, [(2, 5, 4), (2, 5, 3), (2, 3, 4)]), "outer": (torch.outer, [(4,), (5,)]),
    "einsum": (lambda a, b: torch.einsum("bij,bjk->bik", a, b), [(2, 3, 4), (2, 4, 5)]),
    "tensordot": (lambda a, b: torch.tensordot(a, b, dims=([1, 2], [0, 1])), [(2, 3, 4), (3, 4, 5)]),
    "linear": (F.linear, [(6, 3), (4, 3), (4,)]), "bilinear": (F.bilinear, [(5, 3), (5, 2), (4, 3, 2), (4,)]),
    "matmul_transposed": (lambda a, b: a.t() @ b.t(), [(3, 5), (4, 3)]),
    "cdist": (torch.cdist, [(5, 3), (4, 3)]), "kron": (torch.kron, [(2, 2), (3, 2)]),
}


@pytest.mark.parametrize("name", list(MATMUL))
def test_matmul(name):
    fn, shapes = MATMUL[name]
    check(fn, *[rnd(*s, seed=i) for i, s in enumerate(shapes)], grad=True, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16], ids=str)
def test_matmul_dtypes(dtype):
    check(lambda a, b: (a @ b, torch.bmm(a.unsqueeze(0), b.unsqueeze(0))),
          rnd(16, 8, dtype=dtype, seed=1), rnd(8, 12, dtype=dtype, seed=2), **LOW_TOL[dtype])


def test_linalg():
    a = rnd(4, 4, seed=3) + 4 * torch.eye(4)
    spd = a @ a.t()
    check(lambda a, spd, b: (torch.linalg.inv(a), torch.linalg.solve(a, b), torch.linalg.det(a),
                             torch.linalg.cholesky(spd), torch.linalg.qr(a).R.abs(), torch.linalg.eigvalsh(spd),
                             torch.linalg.svdvals(a), torch.linalg.matrix_norm(a), torch.triu(a), torch.tril(a, -1)),
          a, spd, rnd(4, 2), grad=True, atol=1e-4, rtol=1e-4)


# ---- indexing, scatter/gather, masks -------------------------------------------------------------

def test_basic_indexing():
    check(lambda x: (x[1], x[:, 2], x[1:3, ::2], x[..., -1], x[None, 0], x[-1, -1], x[:, None, 1:]), rnd(4, 5, 6),
          grad=True)


def test_advanced_indexing_with_device_and_cpu_indices():
    x = rnd(6, 5, seed=1)
    idx = torch.tensor([4, 0, 2, 2])
    check(lambda x, i: (x[i], x[:, i], x[i, i], x[i[:2], 1:3], x[[0, 5]], x[x[:, 0] > 0]), x, idx, grad=True)
    # CPU index tensors are accepted by indexing ops, as on CUDA
    d = x.to(DEV)
    assert_same(d[idx], x[idx])
    assert_same(d[idx, idx.flip(0)], x[idx, idx.flip(0)])
    assert_same(d[x[:, 0] > 0], x[x[:, 0] > 0])


def test_index_put_and_setitem():
    x = rnd(6, 4, seed=1)
    idx = torch.tensor([0, 2, 2, 5])
    vals = rnd(4, 4, seed=2)

    def fn(x, idx, vals):
        y = x.clone()
        y[idx] = vals                                      # index_put_
        z = x.clone().index_put_((idx,), vals, accumulate=True)
        w = x.clone()
        w[x > 0] = 0.0                                     # masked fill through indexing
        v = x.clone()
        v[1:3, [0, 3]] = vals[:2, :2]
        u = torch.index_put(x, (idx, idx % 4), vals[:, 0], accumulate=True)
        return y[[0, 1, 5]], z, w, v, u

    check(fn, x, idx, vals, grad=True)
    d = x.to(DEV)
    d[torch.tensor([1, 3])] = torch.tensor(7.0)           # CPU index, CPU scalar value
    ref = x.clone()
    ref[torch.tensor([1, 3])] = 7.0
    assert_same(d, ref)


def test_index_ops():
    x, src = rnd(5, 4, seed=1), rnd(3, 4, seed=2)
    idx = torch.tensor([4, 0, 2])
    check(lambda x, src, idx: (x.index_select(0, idx), x.index_add(0, idx, src, alpha=2),
                               x.index_copy(0, idx, src), x.index_fill(1, idx[:2] % 4, -1.0),
                               torch.take(x, idx * 3), x.index_reduce(0, idx, src, "amax")),
          x, src, idx, grad=True)


def test_scatter_gather():
    x = rnd(4, 6, seed=1)
    index = torch.tensor([[0, 1, 2], [3, 0, 1], [2, 2, 0], [1, 3, 3]])
    src = rnd(4, 3, seed=2)
    check(lambda x, index, src: (x.gather(0, index), x.gather(1, index), x.scatter(0, index, src),
                                 x.scatter_add(1, index, src), x.scatter(1, index, 0.5),
                                 x.scatter_reduce(1, index, src, "amax", include_self=False),
                                 x.scatter_reduce(0, index, src, "mean"), torch.take_along_dim(x, index, 1)),
          x, index, src, grad=True)


def test_masked_ops():
    x = rnd(5, 6, seed=1)
    mask = rnd(5, 6, dtype=torch.bool, seed=2)
    check(lambda x, m: (x.masked_fill(m, -2.0), x.masked_select(m), x.masked_scatter(m, x * 10),
                        torch.where(m, x, -x), torch.where(m), x[m], x.masked_fill(m[0], 3.0)),
          x, mask, grad=True)


def test_nonzero_and_where_single_argument():
    x = rnd(4, 5, dtype=torch.int64, low=-2, high=3)
    check(lambda x: (x.nonzero(), torch.nonzero(x, as_tuple=True), torch.where(x > 0), torch.argwhere(x),
                     (x == 0).nonzero().shape), x)
    assert torch.zeros(3, device="neuron").nonzero().shape == (0, 1)


def test_unique():
    x = torch.tensor([3, 1, 2, 3, 3, 5, 1, 0, 2])
    check(lambda x: (torch.unique(x), torch.unique(x, return_inverse=True, return_counts=True),
                     torch.unique(x, sorted=True, return_counts=True), torch.unique_consecutive(x),
                     torch.unique(x.reshape(3, 3), dim=1), torch.unique_consecutive(x, return_counts=True),
                     torch.unique(x.float())), x)


def test_sort_argsort_topk():
    x = distinct(4, 7)
    check(lambda x: (x.sort(1), x.sort(0, descending=True), x.argsort(1), torch.topk(x, 3, 1),
                     torch.topk(x, 2, 0, largest=False), x.msort(), torch.sort(x.flatten(), stable=True)),
          x, grad=True)
    check(lambda x: (x.sort(stable=True), x.argsort(stable=True)), torch.tensor([3, 1, 2, 1, 3, 1, 0]))


def test_searchsorted_bucketize_histc():
    sorted_seq, vals = torch.tensor([0.0, 1.0, 2.5, 4.0]), torch.tensor([-1.0, 0.5, 2.5, 9.0])
    check(lambda s, v: (torch.searchsorted(s, v), torch.searchsorted(s, v, right=True), torch.bucketize(v, s),
                        torch.histc(v, bins=4, min=-1, max=9), torch.bincount(torch.tensor([0, 2, 2, 5]).to(s.device))),
          sorted_seq, vals)


# ---- cat, stack and views -----------------------------------------------------------------------------

def test_cat_stack_split():
    a, b, c = rnd(2, 3, seed=1), rnd(4, 3, seed=2), rnd(2, 3, seed=3)
    check(lambda a, b, c: (torch.cat([a, b, c]), torch.cat([a, c], 1), torch.stack([a, c]), torch.stack([a, c], 2),
                           torch.hstack([a, c]), torch.vstack([a, b]), a.split(1), b.split([1, 3]), b.chunk(2),
                           b.unbind(1), torch.cat([a, torch.empty(0, 3, device=a.device)])),
          a, b, c, grad=True)


VIEWS = {
    "view": lambda x: x.view(6, 4), "reshape": lambda x: x.reshape(-1), "transpose": lambda x: x.transpose(0, 2),
    "permute": lambda x: x.permute(2, 0, 1), "t": lambda x: x[0].t(), "expand": lambda x: x[:, :1].expand(2, 5, 4),
    "unsqueeze": lambda x: x.unsqueeze(1), "squeeze": lambda x: x[:, :1].squeeze(1), "flatten": lambda x: x.flatten(1),
    "unflatten": lambda x: x.unflatten(2, (2, 2)), "narrow": lambda x: x.narrow(1, 1, 2), "select": lambda x: x.select(2, 3),
    "diagonal": lambda x: x.diagonal(0, 1, 2), "unfold": lambda x: x.unfold(1, 2, 1), "movedim": lambda x: x.movedim(0, -1),
    "as_strided": lambda x: x.as_strided((3, 3), (4, 1), 2), "split_view": lambda x: x.split(2, 1)[1],
    "view_dtype": lambda x: x.view(torch.int32), "real": lambda x: torch.view_as_complex(x.reshape(2, 3, 2, 2)).real,
    "flip": lambda x: x.flip(1), "roll": lambda x: x.roll(2, 1), "repeat": lambda x: x.repeat(1, 2, 1),
    "tile": lambda x: x.tile(2), "repeat_interleave": lambda x: x.repeat_interleave(2, 0),
    "contiguous": lambda x: x.transpose(1, 2).contiguous(), "clone_t": lambda x: x.mT.clone(),
}


@pytest.mark.parametrize("name", list(VIEWS))
def test_views(name):
    check(VIEWS[name], rnd(2, 3, 4), grad=name != "view_dtype")


@pytest.mark.parametrize("name", ["view", "transpose", "permute", "expand", "narrow", "select", "diagonal",
                                  "unfold", "as_strided", "unsqueeze", "real", "split_view", "view_dtype"])
def test_views_share_storage_with_base(name):
    base = torch.arange(24.0, device="neuron").reshape(2, 3, 4)
    v = VIEWS[name](base)
    assert v.device == DEV
    assert v.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    assert v._is_view() == VIEWS[name](torch.arange(24.0).reshape(2, 3, 4))._is_view()


IN_PLACE_ON_VIEWS = {
    "row.add_": lambda x: x[1].add_(10),
    "col.mul_": lambda x: x[:, 2].mul_(-1),
    "t.sub_": lambda x: x.t()[1:3].sub_(5),
    "strided.fill_": lambda x: x[::2, ::2].fill_(0.5),
    "diag.copy_": lambda x: x.diagonal().copy_(torch.arange(4.0, device=x.device)),
    "view.zero_": lambda x: x.view(-1)[3:7].zero_(),
    "setitem_slice": lambda x: x[1:, :2].__setitem__(Ellipsis, 9.0),
    "clamp_": lambda x: x[2].clamp_(-0.1, 0.1),
    "unsqueeze.relu_": lambda x: x.unsqueeze(0)[0, 0].relu_(),
    "masked_fill_": lambda x: x[:, 1:].masked_fill_(x[:, 1:] > 0, 1.0),
    "index_add_": lambda x: x[1:].index_add_(1, torch.tensor([0, 0], device=x.device), torch.ones(3, 2, device=x.device)),
    "scatter_": lambda x: x.t().scatter_(0, torch.tensor([[1, 0, 2, 3]], device=x.device), 7.0),
    "mul_out_view": lambda x: torch.mul(x[0], 2, out=x[3]),
    "mm_out_view": lambda x: torch.mm(x[:2, :2], x[2:, 2:], out=x[:2, 2:]),
    "transpose_": lambda x: x[1:3].transpose_(0, 1),
    "squeeze_": lambda x: x[:, :1].squeeze_(1),
    "as_strided_": lambda x: x.view(-1).as_strided_((2, 2), (1, 2)).mul_(3),
    "resize_": lambda x: x.view(-1)[2:].clone().resize_(2, 3),
    "swap_via_set_": lambda x: torch.empty(0, device=x.device).set_(x.untyped_storage(), 4, (2, 2), (1, 4)),
}


@pytest.mark.parametrize("name", list(IN_PLACE_ON_VIEWS))
def test_in_place_ops_on_views(name):
    def fn(x):
        x = x.clone()
        r = IN_PLACE_ON_VIEWS[name](x)
        return (x, r)
    base = rnd(4, 4, seed=5)
    assert_same(fn(base.to(DEV)), fn(base))


def test_in_place_on_view_autograd():
    def fn(leaf):
        x = leaf * 1.0
        x[1].mul_(3)
        x.t()[0].add_(x[2])
        x[:, 1:3].sigmoid_()
        return x
    check(fn, rnd(4, 4), grad=True)


# In-place ops of the unboxed fast path (fast_ops.cpp) write through a host view of `self`: the
# write must reach every alias of self's memory (its base, other views), a second argument on the
# same memory must be read as the CPU reads it, and a conjugate or negative view keeps its bit.
IN_PLACE_FAST = {
    "add_(view of base)": lambda x: x[1:3].add_(x[0]),
    "add_(self, alpha)": lambda x: x.add_(x, alpha=2),
    "add_(other half of the same storage)": lambda x: x.view(4, 4)[:2].add_(x.view(4, 4)[2:]),
    "add_.Scalar on a strided view": lambda x: x.view(4, 4)[:, ::2].add_(3),
    "sub_(row of self)": lambda x: x.view(4, 4)[::2].sub_(x.view(4, 4)[3]),
    "mul_(column of self)": lambda x: x.view(4, 4).t()[1:].mul_(x.view(4, 4)[:, :1].t()),
    "mul_.Scalar then read through base": lambda x: x.view(2, 8)[1].mul_(-1.5),
    "masked_fill_(mask from self)": lambda x: x.view(4, 4)[1:].masked_fill_(x.view(4, 4)[1:] > 0, 7.0),
    "add_ on a neg view": lambda x: torch._neg_view(x.view(4, 4)[0]).add_(1),
    "cpu scalar other": lambda x: x.add_(torch.tensor(2.5)),
}


@pytest.mark.parametrize("name", list(IN_PLACE_FAST))
def test_in_place_fast_ops_update_aliases(name):
    def fn(x):
        base = x.clone()
        other_view = base.view(4, 4).t()   # another alias of the memory the op writes
        r = IN_PLACE_FAST[name](base)
        return (base, other_view.contiguous(), r)
    t = rnd(16, seed=7)
    got, want = fn(t.to(DEV)), fn(t)
    assert_same(got, want)
    assert got[2].device.type == "neuron"


def test_in_place_fast_op_returns_self_and_keeps_conj_bit():
    a = torch.randn(4, dtype=torch.complex64, generator=torch.Generator().manual_seed(3))
    b = torch.randn(4, dtype=torch.complex64, generator=torch.Generator().manual_seed(4))
    da, db = a.to(DEV), b.to(DEV)
    dc = da.conj()
    r = dc.mul_(db)
    c = a.conj()
    c.mul_(b)
    assert r is dc and dc.is_conj() == c.is_conj()
    torch.testing.assert_close(dc.cpu(), c, rtol=0, atol=0)
    torch.testing.assert_close(da.cpu(), a, rtol=0, atol=0)


def test_in_place_fast_op_refuses_a_cpu_self():
    x = torch.tensor(1.0)                     # a CPU scalar may be read by a neuron op, never written
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        x.add_(torch.ones((), device=DEV))


# Writes whose destination partially overlaps a source. The CPU (and CUDA) refuse them; the neuron
# fallback gives arguments that share device memory one CPU storage, so PyTorch's overlap checks
# see the aliasing as on the CPU.
OVERLAPPING_WRITES = {
    "copy_(shifted self)": (lambda x: x[1:].copy_(x[:-1]), ()),
    "copy_(self.t())": (lambda x: x.view(4, 4).copy_(x.view(4, 4).t()), ()),
    "add_(shifted self)": (lambda x: x[1:].add_(x[:-1]), ()),
    "add(out=shifted self)": (lambda x: torch.add(x[:-1], 1, out=x[1:]), ()),
    "index_select(out=self)": (lambda x: torch.index_select(x, 0, torch.tensor([2, 1, 0], device=x.device), out=x), ()),
    "cat(out overlaps input)": (lambda x: torch.cat([x[:2], x[:2]], out=x[:4]), ()),
    "index_put_(values alias self)": (lambda x: x.index_put_((torch.tensor([1, 2, 3], device=x.device),), x[0:3]), ()),
    "mul_(expanded self)": (lambda x: x[:4].expand(3, 4).mul_(2), ()),
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=m) for n, (_, m) in OVERLAPPING_WRITES.items()])
def test_overlapping_writes_are_refused_like_cpu(name, device_works):
    fn = OVERLAPPING_WRITES[name][0]
    with pytest.raises(RuntimeError, match="unsupported operation"):
        fn(torch.arange(16.0))      # the CPU refuses it ...
    d = torch.arange(16.0, device="neuron")
    try:
        fn(d)                        # ... and so must neuron, rather than compute on aliased memory
    except RuntimeError as e:
        assert "unsupported operation" in str(e)
    else:
        pytest.fail(f"no error; the tensor became {d.cpu().tolist()}")
    device_works()


# ---- out= variants --------------------------------------------------------------------------------

def test_out_variants_resize_empty_outputs():
    a, b = rnd(3, 4, seed=1), rnd(3, 4, seed=2)
    da, db = a.to(DEV), b.to(DEV)
    out = torch.empty(0, device="neuron")
    r = torch.add(da, db, out=out)
    assert r is out and out.shape == (3, 4) and out.device == DEV
    assert_same(out, a + b)
    out2 = torch.empty(0, device="neuron")
    torch.mm(da, db.t(), out=out2)
    assert_same(out2, a @ b.t())
    vals, idx = torch.empty(0, device="neuron"), torch.empty(0, dtype=torch.long, device="neuron")
    torch.sort(da, 1, out=(vals, idx))
    assert_same((vals, idx), torch.sort(a, 1))
    out3 = torch.empty(0, device="neuron")
    torch.cat([da, db], out=out3)
    assert_same(out3, torch.cat([a, b]))
    out4 = torch.empty(0, dtype=torch.long, device="neuron")
    torch.nonzero(da > 0, out=out4)
    assert_same(out4, torch.nonzero(a > 0))
    out5 = torch.empty(0, device="neuron")
    torch.sum(da, 1, out=out5)
    assert_same(out5, a.sum(1))


def test_out_variants_into_larger_and_noncontiguous_outputs():
    a = rnd(3, 4)
    da = a.to(DEV)
    big = torch.full((20,), -1.0, device="neuron")
    with pytest.warns(UserWarning, match="resized"):
        torch.exp(da, out=big)        # resizing a non-empty out warns, as on the CPU
    assert big.shape == (3, 4)
    assert_same(big, a.exp())
    nc = torch.zeros(4, 3, device="neuron").t()
    torch.mul(da, 2, out=nc)
    assert not nc.is_contiguous()
    assert_same(nc.contiguous(), a * 2)
    same = torch.empty(3, 4, device="neuron")
    ptr = same.data_ptr()
    torch.sin(da, out=same)
    assert same.data_ptr() == ptr     # an out of the right size is written in place
    assert_same(same, a.sin())


def test_out_variant_keeps_other_views_consistent():
    base = torch.zeros(2, 6, device="neuron")
    row = base[1]
    torch.add(torch.ones(6, device="neuron"), 1, out=row)
    assert_same(base, torch.tensor([[0.0] * 6, [2.0] * 6]))


def test_resize_and_set_():
    x = torch.arange(6.0, device="neuron")
    x.resize_(2, 3)
    assert_same(x, torch.arange(6.0).reshape(2, 3))
    x.resize_(4, 4)
    assert x.shape == (4, 4)
    assert_same(x.flatten()[:6], torch.arange(6.0))    # old contents kept
    y = torch.empty(0, device="neuron")
    y.set_(x.untyped_storage(), 0, (3,), (1,))
    assert_same(y, torch.arange(3.0))
    y.set_(x)
    assert y.shape == x.shape and y.data_ptr() == x.data_ptr()
    z = torch.empty(5, device="neuron").set_()
    assert z.numel() == 0


def test_factories_on_device():
    check(lambda d: (torch.zeros(2, 3, device=d.device), torch.ones(4, dtype=torch.int64, device=d.device),
                     torch.full((2,), 7.5, device=d.device), torch.arange(1, 10, 2, device=d.device),
                     torch.linspace(0, 1, 5, device=d.device), torch.eye(3, device=d.device),
                     torch.empty(3, device=d.device).fill_(2), torch.zeros_like(d), torch.ones_like(d),
                     torch.full_like(d, 3), torch.tensor([[1, 2], [3, 4]], device=d.device),
                     torch.logspace(0, 2, 3, device=d.device), torch.tril_indices(3, 3, device=d.device),
                     torch.empty_strided((2, 3), (1, 2), device=d.device).fill_(1)),
          torch.empty(2))
    assert torch.arange(3, device="neuron:1").device == torch.device("neuron:1")


# ---- nn: convolution ---------------------------------------------------------------------------

CONVS = {
    "conv2d": (lambda: torch.nn.Conv2d(3, 4, 3, padding=1), (2, 3, 8, 8)),
    "conv2d_stride_nobias": (lambda: torch.nn.Conv2d(3, 6, 3, stride=2, bias=False), (2, 3, 9, 9)),
    "conv2d_groups_dilation": (lambda: torch.nn.Conv2d(4, 8, 3, groups=2, dilation=2, padding=2), (1, 4, 7, 7)),
    "conv2d_channels_last": (lambda: torch.nn.Conv2d(3, 4, 1), (2, 3, 5, 5)),
    "conv1d": (lambda: torch.nn.Conv1d(2, 3, 5, padding="same"), (2, 2, 11)),
    "conv3d": (lambda: torch.nn.Conv3d(2, 2, 2), (1, 2, 4, 4, 4)),
    "conv_transpose2d": (lambda: torch.nn.ConvTranspose2d(3, 2, 3, stride=2, output_padding=1), (2, 3, 5, 5)),
}


@pytest.mark.parametrize("name", list(CONVS))
def test_convolution_forward_backward(name):
    make, shape = CONVS[name]
    torch.manual_seed(0)
    m = make()
    x = rnd(*shape, seed=3)
    if name != "conv2d_channels_last":
        check_module(m, x, atol=1e-4, rtol=1e-4)
        return
    # Channels-last input: the CPU answers channels-last, neuron contiguous (docs/runtime.md).
    out = check_module(m, x.to(memory_format=torch.channels_last), strides=False, atol=1e-4, rtol=1e-4)
    assert out.is_contiguous()


def test_functional_conv2d():
    check(lambda x, w, b: F.conv2d(x, w, b, stride=1, padding=2), rnd(1, 2, 6, 6, seed=1), rnd(3, 2, 3, 3, seed=2),
          rnd(3, seed=3), grad=True, atol=1e-4, rtol=1e-4)


# ---- nn: recurrent ------------------------------------------------------------------------------------

RNNS = {
    "lstm": lambda: torch.nn.LSTM(4, 5),
    "lstm_2layer_bidir_batch_first": lambda: torch.nn.LSTM(4, 5, num_layers=2, bidirectional=True, batch_first=True),
    "lstm_proj": lambda: torch.nn.LSTM(4, 6, proj_size=3),
    "gru": lambda: torch.nn.GRU(4, 5),
    "gru_2layer_bidir": lambda: torch.nn.GRU(4, 5, num_layers=2, bidirectional=True),
    "rnn_tanh": lambda: torch.nn.RNN(4, 5),
    "rnn_relu_nobias": lambda: torch.nn.RNN(4, 5, nonlinearity="relu", bias=False, num_layers=2),
}


@pytest.mark.parametrize("name", list(RNNS))
def test_rnn_forward_backward(name):
    torch.manual_seed(0)
    m = RNNS[name]()
    x = rnd(3, 6, 4, seed=2)   # (seq, batch, feature), or (batch, seq, feature) for batch_first
    check_module(m, x, atol=1e-5, rtol=1e-4)


def test_lstm_with_initial_state():
    torch.manual_seed(0)
    m = torch.nn.LSTM(3, 4, num_layers=2)
    check_module(m, rnd(5, 2, 3, seed=1), (rnd(2, 2, 4, seed=2), rnd(2, 2, 4, seed=3)), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("cell", ["LSTMCell", "GRUCell", "RNNCell"])
def test_rnn_cells(cell):
    torch.manual_seed(0)
    m = getattr(torch.nn, cell)(3, 4)
    check_module(m, rnd(5, 3, seed=1), atol=1e-5, rtol=1e-4)


def test_packed_sequence_lstm():
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    torch.manual_seed(0)
    m = torch.nn.GRU(3, 4)
    dm = copy.deepcopy(m).to(DEV)
    x = rnd(5, 3, 3, seed=1)
    lengths = torch.tensor([5, 3, 2])
    out_c, h_c = m(pack_padded_sequence(x, lengths))
    out_d, h_d = dm(pack_padded_sequence(x.to(DEV), lengths))
    assert_same(pad_packed_sequence(out_d)[0], pad_packed_sequence(out_c)[0], atol=1e-5, rtol=1e-4)
    assert_same(h_d, h_c, atol=1e-5, rtol=1e-4)


# ---- nn: attention, embeddings, normalization, losses, pooling -------------------------------

@pytest.mark.parametrize("variant", ["plain", "causal", "bool_mask", "float_mask", "scale", "gqa_shapes"])
def test_scaled_dot_product_attention(variant):
    q, k, v = rnd(2, 3, 5, 8, seed=1), rnd(2, 3, 7, 8, seed=2), rnd(2, 3, 7, 8, seed=3)
    kwargs = {}
    if variant == "causal":
        k, v = k[:, :, :5], v[:, :, :5]
        kwargs = {"is_causal": True}
    elif variant == "scale":
        kwargs = {"scale": 0.3}
    elif variant == "gqa_shapes":
        q = rnd(2, 1, 5, 8, seed=4)   # broadcast over heads
    mask = None
    if variant == "bool_mask":
        mask = rnd(5, 7, dtype=torch.bool, seed=5)
        mask[:, 0] = True
    elif variant == "float_mask":
        mask = rnd(1, 3, 5, 7, seed=6)
    if mask is not None:
        check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, mask, grad=True,
              atol=1e-5, rtol=1e-4)
    else:
        check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kwargs), q, k, v, grad=True,
              atol=1e-5, rtol=1e-4)


def test_multihead_attention_module():
    torch.manual_seed(0)
    m = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    x = rnd(2, 5, 8, seed=1)
    check_module(m, x, x, x, atol=1e-5, rtol=1e-4)


def test_transformer_encoder_layer():
    torch.manual_seed(0)
    m = torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
    check_module(m, rnd(2, 4, 8, seed=1), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag(mode):
    torch.manual_seed(0)
    m = torch.nn.EmbeddingBag(10, 3, mode=mode)
    dm = copy.deepcopy(m).to(DEV)
    inp = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
    offsets = torch.tensor([0, 4, 5])
    out_c = m(inp, offsets)
    out_d = dm(inp.to(DEV), offsets.to(DEV))
    assert_same(out_d, out_c)
    cot = rnd(*out_c.shape, seed=4)
    out_c.backward(cot)
    out_d.backward(cot.to(DEV))
    assert_same(dm.weight.grad, m.weight.grad)
    if mode == "sum":
        psw = rnd(8, seed=3)
        assert_same(dm(inp.to(DEV), offsets.to(DEV), per_sample_weights=psw.to(DEV)),
                    m(inp, offsets, per_sample_weights=psw))
    assert_same(dm(inp.view(2, 4).to(DEV)), m(inp.view(2, 4)))


def test_embedding():
    torch.manual_seed(0)
    m = torch.nn.Embedding(10, 4, padding_idx=0)
    check_module(m, torch.tensor([[0, 3, 3], [9, 1, 0]]), grad=False)
    dm = copy.deepcopy(m).to(DEV)
    idx = torch.tensor([[0, 3, 3], [9, 1, 0]])
    m(idx).sum().backward()
    dm(idx.to(DEV)).sum().backward()
    assert_same(dm.weight.grad, m.weight.grad)
    check(lambda w, i: F.embedding(i, w, max_norm=1.0), rnd(10, 4, seed=2), idx)


@pytest.mark.parametrize("name", ["layer_norm", "layer_norm_no_affine", "group_norm", "instance_norm",
                                  "rms_norm", "local_response_norm"])
def test_normalization(name):
    x = rnd(4, 6, 3, 3, seed=1)
    torch.manual_seed(0)
    m = {"layer_norm": lambda: torch.nn.LayerNorm([3, 3]),
         "layer_norm_no_affine": lambda: torch.nn.LayerNorm(3, elementwise_affine=False),
         "group_norm": lambda: torch.nn.GroupNorm(2, 6),
         "instance_norm": lambda: torch.nn.InstanceNorm2d(6, affine=True),
         "rms_norm": lambda: torch.nn.RMSNorm([3]),
         "local_response_norm": lambda: torch.nn.LocalResponseNorm(3)}[name]()
    for p in m.parameters():
        with torch.no_grad():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(9)) * 0.1)
    if not list(m.parameters()):
        check(m, x, grad=True, atol=1e-5, rtol=1e-4)
    else:
        check_module(m, x, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dims", [1, 2])
def test_batch_norm_train_and_eval(dims):
    torch.manual_seed(0)
    m = torch.nn.BatchNorm1d(5) if dims == 1 else torch.nn.BatchNorm2d(5)
    dm = copy.deepcopy(m).to(DEV)
    for step in range(3):                        # training: batch statistics, running stats updated
        x = rnd(8, 5, *([4, 4] if dims == 2 else []), seed=step)
        m.train(), dm.train()
        out_c, out_d = m(x), dm(x.to(DEV))
        assert_same(out_d, out_c, atol=1e-5, rtol=1e-4)
        out_c.pow(2).sum().backward()
        out_d.pow(2).sum().backward()
    assert_same(dm.running_mean, m.running_mean, atol=1e-5, rtol=1e-4)
    assert_same(dm.running_var, m.running_var, atol=1e-5, rtol=1e-4)
    assert dm.num_batches_tracked.item() == m.num_batches_tracked.item() == 3
    assert_same(dm.weight.grad, m.weight.grad, atol=1e-4, rtol=1e-4)
    assert_same(dm.bias.grad, m.bias.grad, atol=1e-4, rtol=1e-4)
    m.eval(), dm.eval()                          # eval: running statistics
    x = rnd(3, 5, *([4, 4] if dims == 2 else []), seed=10)
    assert_same(dm(x.to(DEV)), m(x), atol=1e-5, rtol=1e-4)
    assert dm.num_batches_tracked.item() == 3


def test_functional_batch_norm_with_grads():
    x, rm, rv, w, b = rnd(6, 4, seed=1), rnd(4, seed=2), rnd(4, seed=3, low=0.5), rnd(4, seed=4), rnd(4, seed=5)
    check(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), x, w, b, grad=True, atol=1e-5, rtol=1e-4)
    check(lambda x, rm, rv: F.batch_norm(x, rm, rv, training=False), x, rm, rv)


LOSSES = {
    "cross_entropy": lambda x, t: F.cross_entropy(x, t),
    "cross_entropy_smooth_weight": lambda x, t: F.cross_entropy(x, t, weight=torch.arange(1.0, 6.0, device=x.device),
                                                                 label_smoothing=0.1),
    "cross_entropy_ignore_index": lambda x, t: F.cross_entropy(x, t, ignore_index=2, reduction="sum"),
    "cross_entropy_probs": lambda x, t: F.cross_entropy(x, F.one_hot(t, 5).float() * 0.8 + 0.04),
    "cross_entropy_none": lambda x, t: F.cross_entropy(x, t, reduction="none"),
    "nll_loss": lambda x, t: F.nll_loss(F.log_softmax(x, 1), t),
    "bce_with_logits": lambda x, t: F.binary_cross_entropy_with_logits(x, F.one_hot(t, 5).float()),
    "bce": lambda x, t: F.binary_cross_entropy(torch.sigmoid(x), F.one_hot(t, 5).float()),
    "kl_div": lambda x, t: F.kl_div(F.log_softmax(x, 1), F.softmax(x.detach() * 2, 1), reduction="batchmean"),
    "multi_margin": lambda x, t: F.multi_margin_loss(x, t),
    "cosine_embedding": lambda x, t: F.cosine_embedding_loss(x, x.flip(0), (t > 2).float() * 2 - 1),
}


@pytest.mark.parametrize("name", list(LOSSES))
def test_losses(name):
    check(LOSSES[name], rnd(6, 5, seed=1), torch.tensor([0, 4, 2, 2, 1, 3]), grad=True, atol=1e-5, rtol=1e-4)


def test_cross_entropy_spatial():
    check(lambda x, t: F.cross_entropy(x, t), rnd(2, 4, 3, 3, seed=1),
          torch.randint(0, 4, (2, 3, 3), generator=torch.Generator().manual_seed(2)), grad=True)


POOLING = {
    "max_pool2d": lambda x: F.max_pool2d(x, 2), "max_pool2d_indices": lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True),
    "avg_pool2d": lambda x: F.avg_pool2d(x, 3, stride=2, padding=1), "adaptive_avg_pool2d": lambda x: F.adaptive_avg_pool2d(x, (2, 3)),
    "adaptive_max_pool2d": lambda x: F.adaptive_max_pool2d(x, 2), "interpolate_bilinear": lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
    "interpolate_nearest": lambda x: F.interpolate(x, size=(5, 7)), "pad_reflect": lambda x: F.pad(x, (1, 2, 2, 1), mode="reflect"),
    "pad_constant": lambda x: F.pad(x, (1, 1), value=3.0), "pixel_shuffle": lambda x: F.pixel_shuffle(x[:, :4], 2),
    "unfold": lambda x: F.unfold(x, 2), "avg_pool1d": lambda x: F.avg_pool1d(x.flatten(2), 4),
    "grid_sample": lambda x: F.grid_sample(x, torch.linspace(-1, 1, 24, device=x.device).reshape(1, 3, 4, 2).expand(2, 3, 4, 2),
                                           align_corners=False),
}


@pytest.mark.parametrize("name", list(POOLING))
def test_pooling_and_resampling(name):
    check(POOLING[name], distinct(2, 4, 6, 6), grad=True, atol=1e-5, rtol=1e-4)


# ---- a small end-to-end training loop -------------------------------------------------------------

def test_small_training_loop_matches_cpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 3))
    dmodel = copy.deepcopy(model).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    dopt = torch.optim.SGD(dmodel.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(3)
    for _ in range(5):
        x = torch.randn(4, 1, 8, 8, generator=g)
        t = torch.randint(0, 3, (4,), generator=g)
        for m, o, xx, tt in ((model, opt, x, t), (dmodel, dopt, x.to(DEV), t.to(DEV))):
            o.zero_grad()
            F.cross_entropy(m(xx), tt).backward()
            o.step()
    for (name, p), dp in zip(model.state_dict().items(), dmodel.state_dict().values()):
        assert dp.device == DEV, name
        torch.testing.assert_close(dp.cpu(), p, atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")


# ---- autograd machinery -----------------------------------------------------------------------

def test_double_backward_gradient_penalty():
    def fn(x, w):
        y = torch.tanh(x @ w).sum()
        (g,) = torch.autograd.grad(y, x, create_graph=True)
        return g.pow(2).sum()
    check(fn, rnd(4, 3, seed=1), rnd(3, 2, seed=2), grad=True, atol=1e-5, rtol=1e-4)


def test_conv_double_backward():
    def fn(x, w):
        y = F.conv2d(x, w, padding=1).pow(2).sum()
        (g,) = torch.autograd.grad(y, w, create_graph=True)
        return g.abs().sum()
    check(fn, rnd(1, 2, 5, 5, seed=1), rnd(3, 2, 3, 3, seed=2), grad=True, atol=1e-4, rtol=1e-4)


def test_torch_func_transforms():
    from torch.func import grad, jacrev, vmap
    x = rnd(5, 3, seed=1)
    check(lambda x: (vmap(torch.dot)(x, x), grad(lambda a: a.sin().sum())(x), jacrev(torch.tanh)(x[0]),
                     vmap(lambda r: r @ r.unsqueeze(1))(x)), x, atol=1e-5, rtol=1e-5)


def test_hooks_retain_grad_and_checkpoint():
    def fn(x):
        y = x * 3
        y.retain_grad()
        y.register_hook(lambda g: g * 2)
        z = torch.utils.checkpoint.checkpoint(lambda a: a.sin() * a, y, use_reentrant=False)
        z.sum().backward()
        return x.grad, y.grad
    xc = rnd(6, seed=1).requires_grad_()
    xd = rnd(6, seed=1).to(DEV).requires_grad_()
    assert_same(fn(xd), fn(xc), atol=1e-6, rtol=1e-5)


def test_repr_of_large_tensor_matches_cpu():
    x = torch.arange(2000.0).reshape(40, 50) / 3
    assert repr(x.to("neuron")) == repr(x)[:-1] + ", device='neuron:0')"
    assert str(x.to("neuron:1")[:2, :3]) == str(x[:2, :3])[:-1] + ", device='neuron:1')"
