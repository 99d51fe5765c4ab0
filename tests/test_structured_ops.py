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
