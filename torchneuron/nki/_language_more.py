"""The rest of ``nki.language``'s public names (imported into :mod:`torchneuron.nki.language`).

Each is one vectorized operation over a tile, charged to the engine AWS's documentation names, with
the meaning AWS's API reference gives it (aws-neuron-sdk, ``nki/api/nki.language.rst`` and the
neuronxcc 2.x ``general/nki/api/nki.language.rst``).
"""

from __future__ import annotations

import builtins
import math

import torch

from . import _cost
from . import _dtypes
from . import _hardware as hw
from . import language as nl
from ._core import (HbmTensor, HbmView, IndexExpr, Tile, TileView, both, defined, fail, hbm_parts, instruction,
                    read, run, sbuf, write)

_TILE = (Tile, TileView)

__all__ = [
    "fp32", "bfp16", "finfo", "nc", "spmd_dim", "program_ndim", "rand", "random_seed", "dropout", "static_cast",
    "abs_max", "abs_min", "arctan", "tan", "ceil", "floor", "trunc", "sign", "fmod", "mod", "silu_dx", "gelu_dx",
    "gelu_apprx_tanh", "gelu_apprx_sigmoid", "gelu_apprx_sigmoid_dx", "mish", "softplus", "erf_dx",
    "logical_and", "logical_or", "logical_xor", "logical_not", "bitwise_and", "bitwise_or", "bitwise_xor", "invert",
    "left_shift", "right_shift", "all", "var", "softmax", "rms_norm", "broadcast_to", "expand_dims",
    "gather_flattened", "atomic_rmw", "shared_constant", "shared_identity_matrix", "dynamic_range", "fori_loop",
    "while_loop", "no_reorder", "is_psum", "is_sbuf", "is_hbm", "is_on_chip", "prelu", "bypass", "average",
    "float8_e4m3fn", "float8_e8m0fnu", "NUMPY_OPS", "numpy_op",
]


class _Constants:
    def __init__(self, name: str, low: float, high: float):
        self._name, self.min, self.max = name, low, high

    def __repr__(self) -> str:
        return f"nl.{self._name}(min={self.min}, max={self.max})"


#: ``nl.fp32.min``: the most negative finite float32 (bit pattern 0xff7fffff), as AWS's range_select takes it.
fp32 = _Constants("fp32", torch.finfo(torch.float32).min, torch.finfo(torch.float32).max)
#: ``nl.bfp16.min``: the most negative finite bfloat16 (0xff7f; AWS documents 0xff80, which is -inf).
bfp16 = _Constants("bfp16", torch.finfo(torch.bfloat16).min, torch.finfo(torch.bfloat16).max)

float8_e4m3fn = _dtypes.make("float8_e4m3fn", torch.float8_e4m3fn, "float8_e4m3fn")
float8_e8m0fnu = _dtypes.make("float8_e8m0fnu", getattr(torch, "float8_e8m0fnu", None))


def finfo(dtype):
    """Machine limits of a float dtype (``torch.finfo``: ``.min``, ``.max``, ``.eps``, ``.tiny``)."""
    return torch.finfo(nl._dtype(dtype))


# ---- SPMD ------------------------------------------------------------------------------------------

class _GridDim(int):
    """A launch-grid dimension made of sub-dimensions (``nl.spmd_dim``, ``nl.nc``): here their product, each
    program one of them (there is one emulated NeuronCore: no program runs on another core)."""


def nc(n: int) -> _GridDim:
    """``nl.nc(n)``: a grid dimension spread over ``n`` NeuronCores; here a dimension of ``n`` programs."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        fail(ValueError, f"nl.nc takes a positive int, got {n!r}")
    return _GridDim(n)


def spmd_dim(*sizes) -> _GridDim:
    """``kernel[nl.spmd_dim(nl.nc(2), 2), 2]``: a grid dimension of ``prod(sizes)`` programs (program_id along
    it counts 0 .. prod(sizes) - 1, the first sub-dimension outermost)."""
    if not sizes:
        fail(TypeError, "nl.spmd_dim takes the sizes of its sub-dimensions")
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            fail(ValueError, f"nl.spmd_dim: sizes are positive ints, got {s!r}")
    return _GridDim(math.prod(int(s) for s in sizes))


def program_ndim() -> int:
    """The number of dimensions of the launch grid (0 when launched without one)."""
    return len(run().grid)


def _num_programs(axes=None) -> int:
    """``nl.num_programs(axes=None)``: the programs along ``axes`` (an int or a tuple), all of them when None."""
    grid = run().grid or (1,)
    if axes is None:
        return math.prod(grid)
    for a in ((axes,) if isinstance(axes, int) else tuple(axes)):
        if not 0 <= a < len(grid):
            fail(ValueError, f"nl.num_programs({axes}): the kernel was launched with a grid of {len(run().grid)} "
                             f"axes")
    return grid[axes] if isinstance(axes, int) else math.prod(grid[a] for a in axes)


# ---- random numbers ---------------------------------------------------------------------------------

def _generator() -> torch.Generator:
    """The kernel run's random number generator: seeded by nl.random_seed / nisa.set_rng_seed, else from
    torch's global generator (so ``torch.manual_seed`` makes a kernel's random numbers reproducible)."""
    r = run()
    g = r.generator
    if g is None:
        g = torch.Generator().manual_seed(int(torch.randint(0, 2**62, (1,)).item()))
        r.generator = g
        # Each interpreted call draws a new seed from torch's generator; a replayed graph would repeat one.
        r.not_replayable = "it draws random numbers with no nl.random_seed (a replay would repeat them)"
    return g


def uniform(shape, device) -> torch.Tensor:
    from ._core import _fake

    if any(_fake(t) for t in (torch.empty(0, device=device),)):
        return torch.empty(shape, device=device)
    return torch.rand(tuple(shape), generator=_generator()).to(device)


@instruction
def rand(shape, dtype=torch.float32, **kwargs) -> Tile:
    """A new tile of uniform random values in [0, 1) (GpSimd)."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    out = Tile(shape, nl._dtype(dtype), sbuf)
    write(out, uniform(out.shape, out.data.device), "nl.rand")
    _cost.charge_vector("rand", out.shape, 0, out.dtype, "GpSimd")
    return out


def random_seed(seed, *, mask=None, **kwargs) -> None:
    """Seed the kernel's random number generator (a 32-bit int, or a tile holding one): the same seed gives
    the same numbers from nl.rand / nl.dropout / nisa.dropout."""
    if isinstance(seed, _TILE):
        seed = read(seed, "nl.random_seed").reshape(-1)[0].item()
    run().generator = torch.Generator().manual_seed(int(seed) & 0xFFFFFFFF)


@instruction
def dropout(x, rate, *, dtype=None, mask=None, **kwargs) -> Tile:
    """Each element of ``x`` zeroed with probability ``rate`` (a scalar or a one-element tile), else kept
    (unscaled, as AWS documents it)."""
    data = read(x, "nl.dropout")
    p = read(rate, "nl.dropout (rate)")
    p = p.float().reshape(-1)[0] if isinstance(p, torch.Tensor) else float(p)
    keep = uniform(data.shape, data.device) >= p
    out = Tile(data.shape, nl._result_dtype(dtype, x), sbuf)
    write(out, torch.where(keep, data, torch.zeros((), dtype=data.dtype, device=data.device)), "nl.dropout", mask,
          valid=defined(x))
    _cost.charge_vector("dropout", data.shape, 1, out.dtype)
    return out


def static_cast(input_data, dtype):
    """A copy of a tile in ``dtype`` (a cast, as nl.copy with dtype); on the host, a NumPy array cast to
    ``dtype`` (bfloat16: an ``ml_dtypes.bfloat16`` array), as AWS's samples prepare their inputs."""
    if type(input_data).__module__ == "numpy":
        import numpy as np

        from ._numpy import numpy_of

        t = _dtypes.to_torch(np.asarray(input_data)).to(nl._dtype(dtype))
        return numpy_of(t, "nl.static_cast")
    return nl.copy(input_data, dtype=dtype)


# ---- element-wise math -----------------------------------------------------------------------------

def _gelu_tanh(x):
    return torch.nn.functional.gelu(x, approximate="tanh")


def _gelu_dx(x):
    cdf = 0.5 * (1 + torch.erf(x / math.sqrt(2)))
    return cdf + x * torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _silu_dx(x):
    s = torch.sigmoid(x)
    return s * (1 + x * (1 - s))


def _gelu_sigmoid(x):
    return x * torch.sigmoid(1.702 * x)


def _gelu_sigmoid_dx(x):
    s = torch.sigmoid(1.702 * x)
    return s + 1.702 * x * s * (1 - s)


arctan = nl._unary(torch.atan, "arctan", True)
tan = nl._unary(torch.tan, "tan", True)
ceil = nl._unary(torch.ceil, "ceil", False)
floor = nl._unary(torch.floor, "floor", False)
trunc = nl._unary(torch.trunc, "trunc", False)
sign = nl._unary(torch.sign, "sign", False)
silu_dx = nl._unary(_silu_dx, "silu_dx", True)
gelu_dx = nl._unary(_gelu_dx, "gelu_dx", True)
gelu_apprx_tanh = nl._unary(_gelu_tanh, "gelu_apprx_tanh", True)
gelu_apprx_sigmoid = nl._unary(_gelu_sigmoid, "gelu_apprx_sigmoid", True)
gelu_apprx_sigmoid_dx = nl._unary(_gelu_sigmoid_dx, "gelu_apprx_sigmoid_dx", True)
mish = nl._unary(torch.nn.functional.mish, "mish", True)
softplus = nl._unary(torch.nn.functional.softplus, "softplus", True)
erf_dx = nl._unary(lambda x: 2 / math.sqrt(math.pi) * torch.exp(-x * x), "erf_dx", True)
abs_max = nl._binary(lambda a, b: torch.maximum(torch.as_tensor(a).abs(), torch.as_tensor(b, device=torch.as_tensor(a).device).abs()), "abs_max")
abs_min = nl._binary(lambda a, b: torch.minimum(torch.as_tensor(a).abs(), torch.as_tensor(b, device=torch.as_tensor(a).device).abs()), "abs_min")
fmod = nl._binary(torch.fmod, "fmod")
mod = nl._binary(torch.remainder, "mod")


def _as_bool(fn):
    return lambda a, b: fn(torch.as_tensor(a).bool(), torch.as_tensor(b, device=torch.as_tensor(a).device).bool())


def _int(fn):
    def f(a, b):
        a = torch.as_tensor(a)
        b = torch.as_tensor(b, device=a.device)
        ia = a if not a.is_floating_point() else a.to(torch.int64)
        ib = b if not b.is_floating_point() else b.to(torch.int64)
        return fn(ia, ib)
    return f


logical_and = nl._binary(_as_bool(torch.logical_and), "logical_and")
logical_or = nl._binary(_as_bool(torch.logical_or), "logical_or")
logical_xor = nl._binary(_as_bool(torch.logical_xor), "logical_xor")
logical_not = nl._unary(lambda x: torch.logical_not(x.bool()), "logical_not", False)
bitwise_and = nl._binary(_int(torch.bitwise_and), "bitwise_and")
bitwise_or = nl._binary(_int(torch.bitwise_or), "bitwise_or")
bitwise_xor = nl._binary(_int(torch.bitwise_xor), "bitwise_xor")
left_shift = nl._binary(_int(torch.bitwise_left_shift), "left_shift")
right_shift = nl._binary(_int(torch.bitwise_right_shift), "right_shift")
invert = nl._unary(lambda x: torch.bitwise_not(x if not x.is_floating_point() else x.to(torch.int64)), "invert",
                   False)
# Operator constants of nki.isa's activation (the newer NKI): prelu (x if x > 0 else alpha * x, alpha 0.01
# here as leaky relu's default; AWS gives no alpha) and bypass (the identity).
bypass = nl._unary(lambda x: x, "bypass", True)
prelu = nl._unary(lambda x: torch.nn.functional.leaky_relu(x, 0.01), "prelu", True)

# ---- reductions and normalizations ---------------------------------------------------------------------

all = nl._reduction(lambda t, a, k: _all(t, a, k), "all", lambda dt: 1)  # noqa: A001 (nl's name)
var = nl._reduction(lambda t, a, k: torch.var(t.float(), a, unbiased=False, keepdim=k), "var", lambda dt: 0)
average = nl.mean  # the newer NKI's name of the mean as an op constant


def _all(t, axes, keepdim):
    t = t.bool()
    for a in sorted(axes, reverse=True):
        t = torch.all(t, a, keepdim=keepdim)
    return t


@instruction
def softmax(x, axis, *, dtype=None, compute_dtype=None, mask=None, **kwargs) -> Tile:
    """exp(x - max) / sum(exp(x - max)) along free ``axis`` (ScalarE for the exponentials, VectorE the rest)."""
    data = read(x, "nl.softmax").float()
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    if 0 in tuple(a % data.dim() for a in axes):
        fail(ValueError, "nl.softmax runs along free axes; axis 0 is the partition axis")
    out = Tile(data.shape, nl._result_dtype(dtype, x), sbuf)
    write(out, torch.softmax(data, dim=axes[0]) if len(axes) == 1 else
          (lambda e: e / e.sum(axes, keepdim=True))(torch.exp(data - data.amax(axes, keepdim=True))),
          "nl.softmax", mask, valid=defined(x))
    _cost.charge_scalar("softmax", data.shape)
    _cost.charge_vector("softmax", data.shape, 2, out.dtype)
    return out


@instruction
def rms_norm(x, w, axis, n, epsilon=1e-6, *, dtype=None, compute_dtype=None, mask=None, **kwargs) -> Tile:
    """x / sqrt(mean(x**2 over ``n`` elements of ``axis``) + epsilon) * w."""
    data = read(x, "nl.rms_norm").float()
    weight = read(w, "nl.rms_norm (w)")
    weight = weight.float() if isinstance(weight, torch.Tensor) else weight
    ms = (data * data).sum(axis, keepdim=True) / n
    out = Tile(data.shape, nl._result_dtype(dtype, x), sbuf)
    write(out, data * torch.rsqrt(ms + epsilon) * weight, "nl.rms_norm", mask,
          valid=both(tuple(data.shape), defined(x), defined(w)))
    _cost.charge_vector("rms_norm", data.shape, 2, out.dtype)
    _cost.charge_scalar("rms_norm", data.shape)
    return out


@instruction
def loop_reduce_into(x, op, loop_indices, *, dtype=None, mask=None, **kwargs):
    """``acc[...] = nl.loop_reduce(x, op=np.add, loop_indices=(i,))``: the accumulator is also the
    instruction's other input, ``acc[...] = op(acc[...], x)`` (AWS's definition: "the destination tile is
    also the rhs input to op"), computed when the result is assigned into it. ``nl.loop_reduce``
    (_isa_newer) calls this for that form; ``b = nl.loop_reduce(a, ...)`` it does itself."""
    fn = numpy_op(op) or op
    torch_fn = getattr(fn, "torch_fn", None)
    if torch_fn is None:
        fail(NotImplementedError, f"nl.loop_reduce: op {getattr(op, '__name__', op)!r} (use np.add, np.maximum, "
                                  f"np.minimum or np.multiply, or their nl functions)")
    data = read(x, "nl.loop_reduce")
    out = Tile(data.shape, nl._result_dtype(dtype, x), sbuf)
    write(out, data, "nl.loop_reduce", valid=defined(x))
    out._loop_reduce = (torch_fn, mask)  # taken by the assignment into the accumulator (_core.assign)
    _cost.charge_vector("loop_reduce", data.shape, 2, out.dtype)
    return out


# ---- tensor manipulation -----------------------------------------------------------------------------

def broadcast_to(src, *, shape, **kwargs):
    """``src`` repeated along its axes of size 1 (partitions included) to ``shape``, as a new SBUF tile."""
    if not isinstance(src, _TILE):
        fail(TypeError, f"nl.broadcast_to takes a tile, got {type(src).__name__}")
    if isinstance(src, Tile):
        return src.broadcast_to(shape)
    data = read(src, "nl.broadcast_to")
    out = Tile(tuple(data.shape), src.dtype, sbuf)
    write(out, data, "nl.broadcast_to", valid=defined(src))
    return out.broadcast_to(shape)


def expand_dims(data, axis):
    """The tile's elements under a shape with a new axis of size 1 at ``axis`` (a view)."""
    shape = list(data.shape)
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    for a in sorted(a % (len(shape) + len(axes)) for a in axes):
        if a == 0:
            fail(ValueError, "nl.expand_dims: a new axis 0 would change the partition axis")
        shape.insert(a, 1)
    return data.reshape(tuple(shape))


@instruction
def gather_flattened(data, indices, *, mask=None, dtype=None, **kwargs) -> Tile:
    """Per partition, the elements of ``data`` (its free axes flattened) at ``indices`` (uint32, one
    partition per row of data): out[p, ...] = data[p].flatten()[indices[p, ...]] (GpSimd)."""
    d = read(data, "nl.gather_flattened")
    idx = read(indices, "nl.gather_flattened (indices)")
    flat = d.reshape(d.shape[0], -1)
    i = idx.reshape(idx.shape[0], -1).to(torch.int64)
    if i.shape[0] != flat.shape[0]:
        fail(ValueError, f"nl.gather_flattened: data on {flat.shape[0]} partitions, indices on {i.shape[0]}")
    if bool(((i < 0) | (i >= flat.shape[1])).any()):
        fail(IndexError, f"nl.gather_flattened: an index outside 0..{flat.shape[1] - 1}")
    out = Tile(tuple(idx.shape), nl._result_dtype(dtype, data), sbuf)
    write(out, torch.gather(flat, 1, i).reshape(idx.shape), "nl.gather_flattened", mask)
    _cost.charge_vector("gather_flattened", idx.shape, 1, out.dtype, "GpSimd")
    return out


@instruction
def atomic_rmw(dst, value, op, *, mask=None, **kwargs) -> None:
    """``dst = op(dst, value)`` in HBM, element by element in order, so that repeated (indirect) indices
    accumulate every value (a DMA read-modify-write)."""
    tensor, index = hbm_parts(dst)
    fn = getattr(numpy_op(op) or op, "torch_fn", None)
    if fn is None:
        fail(NotImplementedError, f"nl.atomic_rmw: op {getattr(op, '__name__', op)!r} (AWS supports np.add)")
    from ._core import _broadcast_index

    idx, shape = _broadcast_index(tensor, index)
    v = read(value, "nl.atomic_rmw")
    v = torch.as_tensor(v, device=tensor.device).to(tensor.dtype).expand(shape)
    if mask is not None:
        m = torch.as_tensor(mask.tensor if isinstance(mask, IndexExpr) else mask, device=tensor.device).expand(shape)
        idx, v = tuple(i[m] for i in idx), v[m]
    if fn in (torch.add,):
        tensor.index_put_(idx, v, accumulate=True)
    else:
        flat_idx = [i.reshape(-1) for i in idx]
        for k, val in enumerate(v.reshape(-1)):
            pos = tuple(i[k] for i in flat_idx)
            tensor[pos] = fn(tensor[pos], val)
    _cost.charge_dma("atomic_rmw", 2 * v.numel() * v.element_size())


def shared_constant(constant, dtype=None, **kwargs) -> HbmTensor:
    """A tensor in HBM holding ``constant`` (an array-like), made on the host before the kernel runs."""
    t = torch.as_tensor(constant.tensor if isinstance(constant, HbmTensor) else constant)
    if dtype is not None:
        t = t.to(nl._dtype(dtype))
    return HbmTensor(t.to(run().device))


def shared_identity_matrix(n, dtype=torch.uint8, **kwargs) -> HbmTensor:
    """An ``n`` x ``n`` identity matrix in HBM."""
    return HbmTensor(torch.eye(int(n), dtype=nl._dtype(dtype), device=run().device))


# ---- control flow -------------------------------------------------------------------------------------

def dynamic_range(*args, **kwargs):
    """A loop whose trip count is known when it runs (here every loop is: a range)."""
    return range(*(int(read(a, "nl.dynamic_range").reshape(-1)[0].item()) if isinstance(a, _TILE) else a
                   for a in args))


def fori_loop(lower, upper, body, init_val):
    """``for i in range(lower, upper): val = body(i, val)``; returns ``val``."""
    val = init_val
    for i in range(int(lower), int(upper)):
        val = body(i, val)
    return val


def while_loop(cond_fun, body_fun, init_val):
    """``while cond_fun(val): val = body_fun(val)``; returns ``val`` (a tile condition: its first element)."""
    val = init_val
    while True:
        c = cond_fun(val)
        if isinstance(c, _TILE):
            c = bool(read(c, "nl.while_loop").reshape(-1)[0].item())
        if not c:
            return val
        val = body_fun(val)


def no_reorder():
    """A block the compiler must not reorder: here instructions always run in program order."""
    import contextlib

    return contextlib.nullcontext()


# ---- memory queries ----------------------------------------------------------------------------------

def _buffer_of(x):
    if isinstance(x, (HbmTensor, HbmView)):
        return nl.hbm
    if isinstance(x, _TILE):
        return x.buffer
    return x  # a buffer itself


def is_psum(x) -> bool:
    return _buffer_of(x) is nl.psum


def is_sbuf(x) -> bool:
    return _buffer_of(x) is nl.sbuf


def is_hbm(x) -> bool:
    b = _buffer_of(x)
    return b in (nl.hbm, nl.shared_hbm, nl.private_hbm)


def is_on_chip(x) -> bool:
    return is_psum(x) or is_sbuf(x)


# ---- NumPy ufuncs as op= (AWS's kernels pass np.add, np.maximum ... to nisa instructions) ---------------

NUMPY_OPS = {
    "add": nl.add, "subtract": nl.subtract, "multiply": nl.multiply, "divide": nl.divide,
    "true_divide": nl.divide, "maximum": nl.maximum, "minimum": nl.minimum, "power": nl.power,
    "equal": nl.equal, "not_equal": nl.not_equal, "greater": nl.greater, "greater_equal": nl.greater_equal,
    "less": nl.less, "less_equal": nl.less_equal, "exp": nl.exp, "log": nl.log, "sqrt": nl.sqrt,
    "tanh": nl.tanh, "sin": nl.sin, "cos": nl.cos, "tan": tan, "arctan": arctan, "abs": nl.abs,
    "absolute": nl.abs, "negative": nl.negative, "reciprocal": nl.reciprocal, "square": nl.square,
    "sign": sign, "ceil": ceil, "floor": floor, "trunc": trunc, "fmod": fmod, "mod": mod, "remainder": mod,
    "logical_and": logical_and, "logical_or": logical_or, "logical_xor": logical_xor,
    "logical_not": logical_not, "bitwise_and": bitwise_and, "bitwise_or": bitwise_or, "bitwise_xor": bitwise_xor,
    "invert": invert, "bitwise_not": invert, "left_shift": left_shift, "right_shift": right_shift,
    "amax": nl.maximum, "max": nl.maximum, "amin": nl.minimum, "min": nl.minimum, "sum": nl.add, "prod": nl.multiply,
}


def numpy_op(op):
    """The nl function a NumPy ufunc (np.add) or reduction (np.max, np.amax, np.sum), or an nl reduction
    (nl.max) used as an ALU op, names; else None."""
    if isinstance(op, _TILE):
        return None
    as_op = {nl.max: nl.maximum, nl.min: nl.minimum, nl.sum: nl.add, nl.prod: nl.multiply}
    if callable(op) and op in as_op:  # a reduction named where an ALU op goes (op1=nl.max): its element-wise op
        return as_op[op]
    mod_name = type(op).__module__ if type(op).__name__ == "ufunc" else getattr(op, "__module__", "") or ""
    if not mod_name.startswith("numpy"):
        return None
    return NUMPY_OPS.get(getattr(op, "__name__", ""))


# ---- into nl ------------------------------------------------------------------------------------------
# Kernels find these names in nl (``nl.rand``). This module is built on nl's functions, so nl does not
# import it (no import circle, tests/test_layout.py): it adds its names to nl here, as nl adds its tile
# methods to _core.TILE_OPS; the package (torchneuron/nki/__init__.py) imports it right after nl.

for _name in __all__:
    setattr(nl, _name, globals()[_name])
nl.num_programs = _num_programs  # num_programs(axes=None) takes the place of nl's num_programs()
nl.__all__ += [n for n in __all__ if n not in nl.__all__]
del _name
