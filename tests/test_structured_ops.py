"""Ops run as PyTorch's structured kernels over device memory (csrc/aten/fast_ops.cpp, "structured
kernels on device memory"): the op's TensorIterator is built over the neuron tensors, and the
DispatchStub its impl calls launches the CPU kernel on the device. Compared with the CPU bit for bit,
with their dtypes, strides, errors and launches."""

import pytest
import torch
import torch.nn.functional as F

DEV = torch.device("neuron:0")

BINARY = {
    "add": torch.add,
    "add_alpha": lambda a, b: torch.add(a, b, alpha=3),
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "pow": torch.pow,
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "lerp": lambda a, b: torch.lerp(a, b, 0.3),
    "addcmul": lambda a, b: torch.addcmul(a, a, b, value=0.5),
    "addcdiv": lambda a, b: torch.addcdiv(a, a, b, value=0.5),
    "threshold_backward": lambda a, b: torch.ops.aten.threshold_backward(a, b, 0.1),
    "sigmoid_backward": torch.ops.aten.sigmoid_backward,
    "tanh_backward": torch.ops.aten.tanh_backward,
    "silu_backward": torch.ops.aten.silu_backward,
}
UNARY = {
    "neg": torch.neg, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
    "reciprocal": torch.reciprocal, "sin": torch.sin, "cos": torch.cos, "tanh": torch.tanh,
    "sigmoid": torch.sigmoid, "erf": torch.erf, "relu": torch.relu, "silu": F.silu,
    "leaky_relu": F.leaky_relu, "elu": F.elu, "softplus": F.softplus,
    "clamp_min": lambda a: a.clamp_min(0.2),
    "pow_2": lambda a: a ** 2, "pow_half": lambda a: a ** 0.5, "pow_0": lambda a: a ** 0, "pow_1": lambda a: a ** 1,
    "amax": lambda a: a.amax(-1), "amin": lambda a: a.amin(0, keepdim=True),
    "fill": lambda a: a.clone().fill_(2.5), "zero": lambda a: a.clone().zero_(),
}
# A Python number or a 0-dim CPU tensor beside a device tensor.
WITH_SCALARS = {
    "add_int": lambda a: a + 1, "mul_float": lambda a: a * 0.9, "rdiv": lambda a: 2.5 / a,
    "sub_bool": lambda a: a - True,  # refused by sub's meta, as on the CPU
    "mul_cpu_tensor": lambda a: a * torch.tensor(3.0, dtype=torch.float64),
    "add_overflowing": lambda a: a + 1e300,  # inf in float32, as the CPU's cast gives
    "maximum_cpu_tensor": lambda a: torch.maximum(a, torch.tensor(0.5)),
}
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.bool]
# Views made the same way on each device (a view of a CPU tensor moved over would come out contiguous).
VIEWS = {
    "contiguous": lambda t: t,
    "transposed": lambda t: t.t(),
    "broadcast_row": lambda t: t[:1],
    "strided": lambda t: t[..., ::2],
}


def _inputs(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(33, 65, generator=g) * 3).to(dtype) for _ in range(2)]


def _same_outcome(fn, cpu_args, neuron_args):
    """fn on both devices: equal bit for bit with the same dtype and strides, or the same error."""
    try:
        expected = fn(*cpu_args)
    except Exception as e:  # noqa: BLE001  (whatever the CPU raises, neuron raises too)
        with pytest.raises(type(e)):
            fn(*neuron_args)
        return None
    got = fn(*neuron_args)
    assert got.device == DEV
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0, equal_nan=True)
    assert got.dtype == expected.dtype and got.stride() == expected.stride()
    return got


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_ops_equal_the_cpus(name, dtype):
    a, b = _inputs(dtype)
    an, bn = a.to(DEV), b.to(DEV)
    for view_name, view in VIEWS.items():
        first = (lambda t: t) if view_name == "broadcast_row" else view  # the row broadcasts against a whole
        _same_outcome(BINARY[name], (first(a), view(b)), (first(an), view(bn)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_ops_equal_the_cpus(name, dtype):
    a, _ = _inputs(dtype)
    an = a.to(DEV)
    for view in VIEWS.values():
        _same_outcome(UNARY[name], (view(a),), (view(an),))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32], ids=str)
@pytest.mark.parametrize("name", list(WITH_SCALARS))
def test_python_numbers_and_cpu_scalars_are_cast_as_on_the_cpu(name, dtype):
    a, _ = _inputs(dtype)
    _same_outcome(WITH_SCALARS[name], (a,), (a.to(DEV),))


IN_PLACE = {
    "add_": lambda x, y: x.add_(y), "sub_alpha": lambda x, y: x.sub_(y, alpha=2), "mul_": lambda x, y: x.mul_(y),
    "div_": lambda x, y: x.div_(y), "mul_number": lambda x, y: x.mul_(0.5), "add_number": lambda x, y: x.add_(1),
    "relu_": lambda x, y: x.relu_(), "add_into_a_view": lambda x, y: x[:, :3].add_(y[:, :3]),
    "add_broadcast": lambda x, y: x.add_(y[:1]),
    "add_into_broadcast_shape": lambda x, y: x[:1].add_(y),  # refused: the result's shape is not self's
    "add_into_an_expanded_tensor": lambda x, y: x[:1].expand(5, 6).add_(1),  # refused: overlapping writes
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16, torch.bool], ids=str)
@pytest.mark.parametrize("name", list(IN_PLACE))
def test_in_place_ops_write_self_as_on_the_cpu(name, dtype):
    a, b = [t[:5, :6].contiguous() for t in _inputs(dtype)]
    xc, xn = a.clone(), a.clone().to(DEV)

    def run(x, y):
        out = IN_PLACE[name](x, y)
        assert out.data_ptr() == x.data_ptr() or out._base is x or out._base is x._base  # self (or its view)
        return x

    _same_outcome(run, (xc, b), (xn, b.to(DEV)))


def _device_work(fn):
    """The runtime calls that put work on the device while fn runs (kernels, copies)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.PrivateUse1]) as prof:
        fn()
    return [e.name for e in prof.events() if e.name in ("neuronLaunchKernel", "neuronMemcpyAsync")]


@pytest.mark.parametrize("name", list(BINARY) + list(UNARY))
def test_each_structured_op_launches_one_kernel(name):
    """The stub's device kernel launches the CPU kernel: an impl that called the CPU's kernel itself
    (which those listed must not) would launch nothing."""
    a, b = (t.to(DEV) for t in _inputs(torch.float32))
    fn = BINARY.get(name)
    call = (lambda: fn(a, b)) if fn is not None else (lambda: UNARY[name](a))
    call()  # warm
    expected = ["neuronLaunchKernel"]
    if name in ("fill", "zero"):
        expected = ["neuronMemcpyAsync", "neuronLaunchKernel"]  # the clone's copy, then the fill
    elif name == "pow_1":
        expected = ["neuronMemcpyAsync"]  # pow's impl copies the base for an exponent of 1
    assert _device_work(call) == expected


def test_mixed_dtypes_run_through_the_cpus_casts():
    """TensorIterator casts inputs to the common dtype only on the CPU: such calls take the host-view
    path and promote as the CPU does."""
    x = torch.arange(6, dtype=torch.int64)
    f = torch.linspace(0, 1, 6)
    for a, b in [(x, f), (f, x), (x, x.to(torch.int32)), (f.to(torch.bfloat16), f)]:
        _same_outcome(torch.add, (a, b), (a.to(DEV), b.to(DEV)))
        _same_outcome(torch.div, (a, b), (a.to(DEV), b.to(DEV)))
    _same_outcome(torch.exp, (x,), (x.to(DEV),))  # an integer input to a floating op


def test_a_device_mismatch_raises_pytorchs_error():
    with pytest.raises(RuntimeError, match="same device"):
        torch.randn(3, device=DEV) + torch.randn(3)


def test_fill_converts_as_the_cpu_does():
    for dtype, value in [(torch.int8, 1000), (torch.uint8, -1), (torch.float16, 1e10), (torch.bool, 2)]:
        _same_outcome(lambda t: t.fill_(value), (torch.zeros(4, dtype=dtype),), (torch.zeros(4, dtype=dtype, device=DEV),))


def test_autograd_through_structured_ops():
    x = torch.randn(8, 5)
    xn = x.to(DEV).requires_grad_(True)
    xc = x.clone().requires_grad_(True)
    for t in (xc, xn):
        (torch.sigmoid(t) * t.exp() - t.relu() / (t.tanh() + 2)).sum().backward()
    torch.testing.assert_close(xn.grad.cpu(), xc.grad, rtol=0, atol=0)


# Matrix products: the CPU's structured impl runs inside the op's launch (LaunchedStructured), and
# what it dispatches there (addmm's copy of its input, the clone of an operand of unusual strides,
# zero_ for an empty inner dimension) is nested work of that launch.
MATRIX_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.complex64, torch.int64,
                 torch.int32, torch.uint8]
OPERANDS = {
    "contiguous": lambda t: t,
    "transposed": lambda t: t.t().contiguous().t(),  # column-major: BLAS's transposed operand
    "strided": lambda t: torch.cat([t, t], 1)[:, ::2],  # neither layout: cloned inside the impl
    "conj": lambda t: t.conj() if t.is_complex() else t,
}
PRODUCTS = {
    "mm": lambda a, b, c: torch.mm(a, b),
    "addmm_row": lambda a, b, c: torch.addmm(c[0], a, b),
    "addmm_matrix": lambda a, b, c: torch.addmm(c, a, b, beta=0.5, alpha=2),
    "addmm_beta0": lambda a, b, c: torch.addmm(c.fill_(float("nan")) if c.is_floating_point() else c, a, b, beta=0),
    "linear": lambda a, b, c: F.linear(a, b.t(), c[0]),
}


def _matrices(dtype, m=7, k=9, n=5):
    g = torch.Generator().manual_seed(1)
    make = lambda *s: (torch.randn(*s, generator=g, dtype=torch.complex64) if dtype.is_complex
                       else torch.randn(*s, generator=g) * 4).to(dtype)  # noqa: E731
    return make(m, k), make(k, n), make(m, n)


@pytest.mark.parametrize("dtype", MATRIX_DTYPES, ids=str)
@pytest.mark.parametrize("name", list(PRODUCTS))
def test_matrix_products_equal_the_cpus(name, dtype):
    for shape in [(7, 9, 5), (1, 9, 5), (7, 0, 5), (0, 3, 4)]:
        a, b, c = _matrices(dtype, *shape)
        for left, right in [("contiguous", "contiguous"), ("transposed", "contiguous"),
                            ("contiguous", "transposed"), ("strided", "strided"), ("conj", "conj")]:
            la, rb = OPERANDS[left], OPERANDS[right]
            _same_outcome(lambda x, y, z: PRODUCTS[name](la(x), rb(y), z.clone()),
                          (a, b, c), (a.to(DEV), b.to(DEV), c.to(DEV)))


@pytest.mark.parametrize("name", ["mm", "addmm_row", "linear"])
def test_a_matrix_product_is_one_launch(name):
    """The input addmm copies into its result is nested work of addmm's launch, not a launch of its own."""
    a, b, c = (t.to(DEV) for t in _matrices(torch.float32))
    call = lambda: PRODUCTS[name](a, b, c)  # noqa: E731
    call()
    assert _device_work(call) == ["neuronLaunchKernel"]


def test_matrix_product_errors_are_the_cpus():
    a, b, c = _matrices(torch.float32)
    for fn in [lambda x, y, z: torch.mm(x, x),  # shapes that cannot be multiplied
               lambda x, y, z: torch.mm(x, y.double()),  # two dtypes
               lambda x, y, z: torch.addmm(z[:2], x, y),  # an input that does not broadcast
               lambda x, y, z: torch.mm(x[0], y)]:  # not a matrix
        _same_outcome(fn, (a, b, c), (a.to(DEV), b.to(DEV), c.to(DEV)))
    with pytest.raises(RuntimeError, match="same device|device"):
        torch.mm(a.to(DEV), b)


def test_autograd_through_matrix_products():
    x, w, bias = torch.randn(6, 4), torch.randn(3, 4), torch.randn(3)
    grads = []
    for dev in ("cpu", DEV):
        p = [t.to(dev, copy=True).requires_grad_(True) for t in (x, w, bias)]
        (F.linear(*p).tanh() @ p[1]).sum().backward()
        grads.append([t.grad.cpu() for t in p])
    for got, expected in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_copies_between_neuron_tensors_equal_the_cpus():
    """copy_ between neuron tensors goes to the device's copy from the first dispatch: casts,
    broadcasts, conjugate and negative views, the tensor itself, overlapping and refused copies."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 8, generator=g)
    z = torch.randn(6, 8, generator=g, dtype=torch.complex64)
    cases = [
        (lambda t, u: torch.empty(6, 8, dtype=torch.int32, device=t.device).copy_(t), (x, z)),
        (lambda t, u: torch.empty(3, 6, 8, device=t.device).copy_(t[0]), (x, z)),
        (lambda t, u: torch.empty_like(u).copy_(u.conj()), (x, z)),
        (lambda t, u: torch.empty_like(t).copy_(t._neg_view()), (x, z)),
        (lambda t, u: t.clone().copy_(t), (x, z)),
        (lambda t, u: t.t().clone().copy_(t.t()), (x, z)),
        (lambda t, u: t.clone()[:, :4].copy_(t[:, 4:]), (x, z)),
        (lambda t, u: (lambda v: v[:, 1:].copy_(v[:, :-1]))(t.clone()), (x, z)),  # overlapping in one storage
        (lambda t, u: t[:1].expand(6, 8).copy_(t), (x, z)),  # refused: overlapping writes
        (lambda t, u: torch.empty(0, 8, device=t.device).copy_(t[:0]), (x, z)),
    ]
    for fn, args in cases:
        _same_outcome(fn, args, tuple(a.to(DEV) for a in args))


# CPU functions run whole on device memory inside their launch (LaunchedNative), and the softmaxes
# (LaunchedStructured): forward and backward against the CPU, bit for bit.
def _with_grads(fn, inputs, dev):
    """fn's output and the gradients of its floating-point inputs, for one fixed output gradient."""
    leaves = [t.detach().to(dev, copy=True).requires_grad_(t.is_floating_point()) for t in inputs]
    out = fn(*leaves)
    out = out[0] if isinstance(out, tuple) else out
    grads = []
    if out.requires_grad:
        g = torch.Generator().manual_seed(3)
        go = torch.randn(out.shape, generator=g).to(out.dtype).to(dev)
        grads = torch.autograd.grad(out, [t for t in leaves if t.requires_grad], go)
    return [out.detach().cpu()] + [t.cpu() for t in grads]


NATIVE = {
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5), lambda d: [(7, 3, 12), (12,), (12,)]),
    "layer_norm_without_affine": (lambda x: F.layer_norm(x, (3, 12)), lambda d: [(7, 3, 12)]),
    "softmax": (lambda x: torch.softmax(x, -1), lambda d: [(5, 9)]),
    "softmax_dim0": (lambda x: torch.softmax(x, 0), lambda d: [(5, 9)]),
    "log_softmax": (lambda x: torch.log_softmax(x, 1), lambda d: [(2, 5, 9)]),
    "sdpa": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v), lambda d: [(2, 3, 8, 16)] * 3),
    "sdpa_causal": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), lambda d: [(2, 3, 8, 16)] * 3),
    "cross_entropy": (lambda x: F.cross_entropy(x, torch.arange(6, device=x.device) % 5), lambda d: [(6, 5)]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", list(NATIVE))
def test_launched_cpu_functions_equal_the_cpus(name, dtype):
    fn, shapes = NATIVE[name]
    g = torch.Generator().manual_seed(4)
    inputs = [(torch.randn(*s, generator=g) * 2).to(dtype) for s in shapes(dtype)]
    try:
        expected = _with_grads(fn, inputs, "cpu")
    except RuntimeError as e:
        with pytest.raises(type(e)):
            _with_grads(fn, inputs, DEV)
        return
    got = _with_grads(fn, inputs, DEV)
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
        assert a.stride() == b.stride()


def test_layer_norm_of_mixed_dtypes_and_a_strided_input():
    """A bfloat16 input with float32 weights (the CPU function handles the mix itself), and an input
    that is not contiguous (made contiguous inside the launch)."""
    g = torch.Generator().manual_seed(5)
    x, w, b = torch.randn(4, 6, 10, generator=g), torch.randn(10, generator=g), torch.randn(10, generator=g)
    fn = lambda x, w, b: F.layer_norm(x, (10,), w, b)  # noqa: E731
    for inputs in [(x.bfloat16(), w, b), (x.transpose(0, 1), w, b)]:
        for a, e in zip(_with_grads(fn, inputs, DEV), _with_grads(fn, inputs, "cpu")):
            torch.testing.assert_close(a, e, rtol=0, atol=0)


def test_embeddings_and_index_select_equal_the_cpus():
    g = torch.Generator().manual_seed(6)
    weight = torch.randn(11, 7, generator=g)
    for idx in [torch.tensor([[1, 3, 3, 10], [0, 0, 2, 5]]), torch.tensor([4, 4, 4], dtype=torch.int32)]:
        for kwargs in [{}, {"padding_idx": 3}, {"scale_grad_by_freq": True}]:
            fn = lambda w, i=idx, kw=kwargs: F.embedding(i.to(w.device), w, **kw)  # noqa: E731
            for a, e in zip(_with_grads(fn, [weight], DEV), _with_grads(fn, [weight], "cpu")):
                torch.testing.assert_close(a, e, rtol=0, atol=0)
    for dim, idx in [(0, torch.tensor([10, 0, 3])), (1, torch.tensor([6, 6])), (1, torch.tensor([], dtype=torch.long))]:
        _same_outcome(lambda w, i: torch.index_select(w, dim, i), (weight, idx), (weight.to(DEV), idx.to(DEV)))
    _same_outcome(lambda w, i: torch.index_select(w, 0, i), (weight, torch.tensor([11])),  # out of range
                  (weight.to(DEV), torch.tensor([11]).to(DEV)))


@pytest.mark.parametrize("name", ["layer_norm", "softmax", "sdpa"])
def test_a_launched_cpu_function_is_one_launch(name):
    fn, shapes = NATIVE[name]
    g = torch.Generator().manual_seed(7)
    inputs = [torch.randn(*s, generator=g).to(DEV) for s in shapes(torch.float32)]
    fn(*inputs)
    assert _device_work(lambda: fn(*inputs)) == ["neuronLaunchKernel"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64], ids=str)
def test_cat_equals_the_cpus(dtype):
    """cat runs as a launched structured kernel (its copies through copy_stub's device kernel): small
    and large results (the CPU's serial kernel and its copies), strided and channels-last inputs,
    legacy empty tensors, conjugate views; several dtypes promote on the host-view path."""
    g = torch.Generator().manual_seed(8)
    make = lambda *s: (torch.randn(*s, generator=g, dtype=torch.complex64) if dtype.is_complex  # noqa: E731
                       else torch.randn(*s, generator=g) * 3).to(dtype)
    a, b, big = make(4, 6), make(3, 6), make(300, 200)
    cases = [
        ((a, b), 0), ((a, a.t().contiguous().t()), 1), ((a[:, ::2], b[:, ::2]), 0), ((big, big), 0), ((big, big), 1),
        ((a, torch.empty(0, dtype=dtype), b), 0), ((a.conj() if dtype.is_complex else a, b), 0),
        ((make(2, 3, 4, 5).to(memory_format=torch.channels_last), make(2, 3, 4, 5).to(memory_format=torch.channels_last)), 1),
        ((a, b.to(torch.complex128 if dtype.is_complex else torch.float64)), 0),  # promotes
        ((a, make(4, 5)), 0),  # sizes that do not match: refused
    ]
    for tensors, dim in cases:
        _same_outcome(lambda *ts: torch.cat(ts, dim), tensors, tuple(t.to(DEV) for t in tensors))


def test_cat_is_one_launch():
    a = torch.randn(4, 6, device=DEV)
    torch.cat([a, a])
    assert _device_work(lambda: torch.cat([a, a, a], 1)) == ["neuronLaunchKernel"]
