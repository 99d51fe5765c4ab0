"""``nki.language`` (``nl``): NKI's tile-level language on the emulated NeuronCore.

Names and meanings follow AWS's public NKI documentation; a kernel written for Trainium runs with
its imports changed to ``import torchneuron.nki.language as nl``. Each call is one vectorized
operation over a whole tile of device memory, checked against the chip's limits, and charged to the
engine that would run it (VectorE for arithmetic and reductions, ScalarE for transcendentals,
TensorE for matmuls and transposes, the DMA queues for loads and stores).
"""

from __future__ import annotations

import builtins
import math
from typing import Optional

import torch

from . import _cost
from . import _dtypes
from . import _exp
from . import _hardware as hw
from . import _tensor_engine
from ._core import (TILE_OPS, Buffer, HbmTensor, HbmView, IndexExpr, ParDim, Tile, TileView, _fake, _set, as_dtype, both, defined, fail,
                    hbm, hbm_parts, instruction, masked_gather, masked_scatter, private_hbm, psum, read, require_defined, run, sbuf,
                    shared_hbm, write)

__all__ = [
    "sbuf", "psum", "hbm", "shared_hbm", "private_hbm", "tile_size", "ndarray", "zeros", "ones", "full", "load",
    "store", "copy", "arange", "mgrid", "affine_range", "sequential_range", "static_range", "program_id",
    "num_programs", "matmul", "transpose", "add", "subtract", "multiply", "divide", "maximum", "minimum", "power",
    "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu", "silu", "abs", "negative", "reciprocal",
    "square", "sin", "cos", "erf", "equal", "not_equal", "greater", "greater_equal", "less", "less_equal",
    "sum", "max", "min", "mean", "prod", "where", "load_transpose2d", "par_dim", "ds", "empty_like", "zeros_like", "device_print",
    "float32", "bfloat16", "float16", "tfloat32", "float8_e4m3", "float8_e5m2", "int8", "int16", "int32",
    "uint8", "uint16", "uint32", "bool_", "DType",
]

# nl's dtypes: each its torch dtype for the kernel and a NumPy dtype for the host (_dtypes.DType).
DType = _dtypes.DType
float32, bfloat16, float16 = (_dtypes.make(n, t) for n, t in (("float32", torch.float32), ("bfloat16", torch.bfloat16),
                                                              ("float16", torch.float16)))
tfloat32 = _dtypes.make("tfloat32", torch.float32)  # computed as float32 here
# float8_e4m3: AWS's is IEEE-style (infinities, up to 240), computed here as PyTorch's e4m3 (fn: up to 448).
float8_e4m3 = _dtypes.make("float8_e4m3", torch.float8_e4m3fn, "float8_e4m3")
float8_e5m2 = _dtypes.make("float8_e5m2", torch.float8_e5m2)
int8, int16, int32, uint8, bool_ = (_dtypes.make(n, t) for n, t in (("int8", torch.int8), ("int16", torch.int16),
                                                                   ("int32", torch.int32), ("uint8", torch.uint8),
                                                                   ("bool_", torch.bool)))
uint16, uint32 = _dtypes.make("uint16", torch.uint16), _dtypes.make("uint32", torch.uint32)


class tile_size:
    """The hardware's tile limits (``nl.tile_size``)."""

    pmax = hw.PMAX
    gemm_stationary_fmax = hw.GEMM_STATIONARY_FMAX
    gemm_moving_fmax = hw.GEMM_MOVING_FMAX
    psum_fmax = hw.PSUM_BANK_BYTES // 4
    psum_bank_fmax = hw.PSUM_BANK_BYTES // 4
    bn_stats_fmax = 512  # AWS's nki.isa.bn_stats: at most 512 elements per partition


# ---- memory ---------------------------------------------------------------------------------------

def ndarray(shape, dtype, buffer: Buffer = sbuf, name: str = "", **kwargs):
    """An uninitialized tensor: a tile in ``nl.sbuf``/``nl.psum``, or device memory in HBM."""
    packed = _dtypes.packed_of(dtype)  # an x4 type (MX matmuls): int32 words, the tile remembers which fp8
    dtype = _dtype(dtype)
    if isinstance(shape, int):
        shape = (shape,)
    if isinstance(buffer, Buffer) and not buffer.on_chip:
        shape = tuple(int(s) for s in shape)
        r = run()
        if buffer is shared_hbm and r.grid:  # a grid's programs share what they allocate there, in order
            slot = r.shared_slot
            r.shared_slot += 1
            if slot < len(r.shared_hbm):
                return r.shared_hbm[slot]
            r.shared_hbm.append(HbmTensor(torch.empty(tuple(shape), dtype=dtype, device=r.device)))
            return r.shared_hbm[slot]
        return HbmTensor(torch.empty(tuple(shape), dtype=dtype, device=r.device))
    t = Tile(shape, dtype, buffer)
    if packed is not None:
        t.packed = packed
    return t


@instruction
def full(shape, fill_value, dtype, buffer: Buffer = sbuf, name: str = "", **kwargs):
    t = ndarray(shape, dtype, buffer)
    if isinstance(t, HbmTensor):
        t.tensor.fill_(fill_value)
        return t
    write(t, torch.full(t.shape, fill_value, dtype=t.dtype, device=t.data.device), "nl.full")
    _cost.charge_vector("memset", t.shape, 0, t.dtype, "GpSimd")
    return t


@instruction
def zeros(shape, dtype, buffer: Buffer = sbuf, name: str = "", **kwargs):
    return full(shape, 0, dtype, buffer)


@instruction
def ones(shape, dtype, buffer: Buffer = sbuf, name: str = "", **kwargs):
    return full(shape, 1, dtype, buffer)


def device_print(prefix: str, x, *, mask=None, **kwargs) -> None:
    """The values of a tile or an HBM tensor, written to the log ``torchneuron.nki.device_print`` at INFO
    (as AWS's simulator prints them; library code here logs instead of printing)."""
    import logging

    log = logging.getLogger("torchneuron.nki.device_print")
    if isinstance(x, (HbmTensor, HbmView)):
        tensor, index = hbm_parts(x)
        data = tensor if index is Ellipsis else tensor[index]
    else:
        data = read(x, "nl.device_print")
    if isinstance(data, torch.Tensor) and (_fake(data) or not log.isEnabledFor(logging.INFO)):
        return
    if isinstance(data, torch.Tensor) and mask is not None:
        m = torch.as_tensor(mask.tensor if isinstance(mask, IndexExpr) else mask, device=data.device)
        data = data[m.expand(data.shape)]
    values = data.cpu().tolist() if isinstance(data, torch.Tensor) else data
    log.info("%s %s", prefix, values)


def _like(x, what: str):
    if isinstance(x, (Tile, TileView, HbmTensor, HbmView)):
        return x
    fail(TypeError, f"nl.{what} takes a tile or a tensor in HBM, got {type(x).__name__}")


def empty_like(x, dtype=None, buffer: Optional[Buffer] = None, name: str = ""):
    """An uninitialized tensor of ``x``'s shape, of ``dtype`` and in ``buffer`` (default: ``x``'s)."""
    x = _like(x, "empty_like")
    if buffer is None:
        buffer = x.buffer if isinstance(x, (Tile, TileView)) else shared_hbm
    return ndarray(x.shape, dtype if dtype is not None else x.dtype, buffer)


@instruction
def zeros_like(x, dtype=None, buffer: Optional[Buffer] = None, name: str = ""):
    """Zeros of ``x``'s shape, of ``dtype`` and in ``buffer`` (default: ``x``'s)."""
    x = _like(x, "zeros_like")
    if buffer is None:
        buffer = x.buffer if isinstance(x, (Tile, TileView)) else shared_hbm
    return full(x.shape, 0, dtype if dtype is not None else x.dtype, buffer)


@instruction
def load(src, mask=None, dtype=None, **kwargs) -> Tile:
    """HBM -> a new SBUF tile (a DMA)."""
    tensor, index = hbm_parts(src)
    values = masked_gather(tensor, index, mask)
    if values.dim() == 0:
        values = values.reshape(1, 1)
    out = Tile(values.shape, _dtype(dtype) if dtype is not None else values.dtype, sbuf)
    write(out, values, "nl.load", mask)
    _cost.charge_dma("load", values.numel() * values.element_size())
    return out


@instruction
def store(dst, value, mask=None, **kwargs) -> None:
    """An SBUF tile -> HBM (a DMA)."""
    tensor, index = hbm_parts(dst)
    # A PSUM tile is stored as an SBUF one is (a DMA from PSUM: AWS's simulator and the chip's DMA take both).
    data = read(value, "nl.store")
    where = None
    if mask is not None and isinstance(value, (Tile, TileView)):
        where = torch.as_tensor(mask.tensor if isinstance(mask, IndexExpr) else mask, device=data.device)
    require_defined(value, "nl.store", where)
    if mask is not None:
        masked_scatter(tensor, index, mask, torch.as_tensor(data, device=tensor.device).to(tensor.dtype))
        _cost.charge_dma("store", data.numel() * data.element_size())
        return
    target = tensor if index is Ellipsis else tensor[index]
    data = torch.as_tensor(data, device=tensor.device).to(tensor.dtype)
    if data.shape != target.shape:
        try:
            data = data.expand(target.shape) if data.dim() <= target.dim() else data.reshape(target.shape)
        except RuntimeError:
            if data.numel() != target.numel() or data.shape[0] != target.shape[0]:  # same partitions, same elements
                fail(ValueError, f"nl.store: a tile of shape {tuple(data.shape)} does not fit {tuple(target.shape)}")
            data = data.reshape(target.shape)
    if index is Ellipsis:
        tensor.copy_(data)
    else:
        _set(tensor, index, data)
    _cost.charge_dma("store", data.numel() * data.element_size())


@instruction
def load_transpose2d(src, mask=None, dtype=None, **kwargs) -> Tile:
    """HBM [F, P] -> a new SBUF tile [P, F]: a load that transposes a 2-D block (a DMA)."""
    tensor, index = hbm_parts(src)
    values = tensor if index is Ellipsis else tensor[index]
    if values.dim() != 2:
        fail(ValueError, f"nl.load_transpose2d loads a 2-D block, got shape {tuple(values.shape)}")
    values = values.t()
    out = Tile(values.shape, _dtype(dtype) if dtype is not None else values.dtype, sbuf)
    write(out, values, "nl.load_transpose2d", mask)
    _cost.charge_dma("load_transpose2d", values.numel() * values.element_size())
    return out


@instruction
def copy(x, dtype=None, mask=None, **kwargs) -> Tile:
    """A copy of a tile (in SBUF), optionally cast: how PSUM results come back to SBUF."""
    data = read(x, "nl.copy")
    out = Tile(data.shape, _dtype(dtype) if dtype is not None else x.dtype, sbuf)
    write(out, data, "nl.copy", mask, valid=defined(x))
    _cost.charge_vector("copy", data.shape, 1, out.dtype)
    return out


# ---- indices and loops ----------------------------------------------------------------------------

def arange(*args) -> IndexExpr:
    r = _maybe_run()
    return IndexExpr(torch.arange(*args, device=r.device if r else "cpu"))


class _Grid(tuple):
    """``nl.mgrid[...]``'s index expressions, one per axis; also named as NKI names them: ``.p`` (the
    partition axis), ``.x``, ``.y``, ``.z`` (the free axes)."""

    def _axis(self, i: int, name: str):
        if i >= len(self):
            raise AttributeError(f"nl.mgrid of {len(self)} axes has no .{name}")
        return self[i]

    p = property(lambda self: self._axis(0, "p"))
    x = property(lambda self: self._axis(1, "x"))
    y = property(lambda self: self._axis(2, "y"))
    z = property(lambda self: self._axis(3, "z"))


class _MGrid:
    def __getitem__(self, slices):
        if not isinstance(slices, tuple):
            slices = (slices,)
        r = _maybe_run()
        ranges = [torch.arange(s.start or 0, s.stop, s.step or 1, device=r.device if r else "cpu") for s in slices]
        return _Grid(IndexExpr(t) for t in torch.meshgrid(*ranges, indexing="ij"))


mgrid = _MGrid()


def affine_range(*args, **kwargs):
    return range(*args)


def sequential_range(*args, **kwargs):
    return range(*args)


def static_range(*args, **kwargs):
    return range(*args)


def program_id(axis: int) -> int:
    r = run()
    if not 0 <= axis < builtins.max(1, len(r.grid)):
        fail(ValueError, f"nl.program_id({axis}): the kernel was launched with a grid of {len(r.grid)} axes")
    return r.program[axis] if r.program else 0


def num_programs(axis: int = 0) -> int:
    r = run()
    return r.grid[axis] if r.grid else 1


def _maybe_run():
    from ._core import _RUN

    return _RUN.get()


def _dtype(d):
    return as_dtype(d)


def par_dim(size) -> ParDim:
    """Marks ``size`` as the partition dimension of a tile shape: ``nl.ndarray((nl.par_dim(128), 512), ...)``
    is the same tile as ``(128, 512)``; axes before it are block axes, each block a tile of its own."""
    if isinstance(size, bool) or not isinstance(size, int):
        fail(TypeError, f"nl.par_dim takes an int axis size, got {type(size).__name__}")
    if not 0 < size <= hw.PMAX:
        fail(ValueError, f"nl.par_dim({size}): a partition dimension holds 1 to {hw.PMAX} partitions")
    return ParDim(size)


def ds(start, size) -> slice:
    """The dynamic slice ``start:start + size`` of one axis: ``t[nl.ds(i * 128, 128), :]``."""
    for what, v in (("start", start), ("size", size)):
        if isinstance(v, bool) or not isinstance(v, (int, torch.SymInt)):
            fail(TypeError, f"nl.ds: {what} is an int, got {type(v).__name__}")
    if start < 0 or size < 1:
        fail(ValueError, f"nl.ds({start}, {size}): a slice starts at 0 or later and holds at least one element")
    return slice(start, start + size)


# ---- arithmetic -----------------------------------------------------------------------------------

def _result_dtype(dtype, *xs):
    if dtype is not None:
        return _dtype(dtype)
    for x in xs:
        if isinstance(x, (Tile, TileView)):
            return x.dtype
    return torch.float32


def _unary(fn, name: str, scalar_engine: bool):
    def op(x, dtype=None, mask=None, **kwargs):
        data = read(x, f"nl.{name}")
        out = Tile(data.shape, _result_dtype(dtype, x), sbuf)
        write(out, fn(data.float() if data.is_floating_point() else data), f"nl.{name}", mask, valid=defined(x))
        (_cost.charge_scalar(name, data.shape) if scalar_engine else _cost.charge_vector(name, data.shape, 1, out.dtype))
        return out
    op = instruction(op, name)
    op.__name__, op.torch_fn = name, fn
    return op


def _binary(fn, name: str):
    def op(x, y, dtype=None, mask=None, **kwargs):
        a, b = read(x, f"nl.{name}"), read(y, f"nl.{name}")
        ta, tb = isinstance(a, torch.Tensor), isinstance(b, torch.Tensor)
        if ta and tb and a.dim() != b.dim():  # NKI aligns tiles on the partition axis: pad the free axes
            a = a.reshape(tuple(a.shape) + (1,) * (b.dim() - a.dim())) if a.dim() < b.dim() else a
            b = b.reshape(tuple(b.shape) + (1,) * (a.dim() - b.dim())) if b.dim() < a.dim() else b
        if ta and tb:
            try:
                shape = torch.broadcast_shapes(a.shape, b.shape)
            except RuntimeError:
                fail(ValueError, f"nl.{name}: tiles of shapes {tuple(a.shape)} and {tuple(b.shape)} do not broadcast")
            if a.shape[0] != b.shape[0] and 1 not in (a.shape[0], b.shape[0]):
                fail(ValueError, f"nl.{name}: tiles on {a.shape[0]} and {b.shape[0]} partitions")
        else:
            shape = (a if ta else b).shape if (ta or tb) else (1, 1)
        out = Tile(shape, _result_dtype(dtype, x, y), sbuf)
        fa = a.float() if ta and a.is_floating_point() else a
        fb = b.float() if tb and b.is_floating_point() else b
        write(out, fn(torch.as_tensor(fa, device=out.data.device), fb), f"nl.{name}", mask,
              valid=both(tuple(shape), defined(x), defined(y)))
        _cost.charge_vector(name, shape, int(ta) + int(tb), out.dtype)
        return out
    op = instruction(op, name)
    op.__name__, op.torch_fn = name, fn  # torch_fn: what nisa's op= arguments compute
    return op


add = _binary(torch.add, "add")
subtract = _binary(torch.sub, "subtract")
multiply = _binary(torch.mul, "multiply")
divide = _binary(torch.div, "divide")
maximum = _binary(torch.maximum, "maximum")
minimum = _binary(torch.minimum, "minimum")
power = _binary(torch.pow, "power")
equal = _binary(torch.eq, "equal")
not_equal = _binary(torch.ne, "not_equal")
greater = _binary(torch.gt, "greater")
greater_equal = _binary(torch.ge, "greater_equal")
less = _binary(torch.lt, "less")
less_equal = _binary(torch.le, "less_equal")
exp = _unary(_exp.exp, "exp", True)  # Inductor's vectorized exp, as the replay computes it (_exp)
log = _unary(torch.log, "log", True)
sqrt = _unary(torch.sqrt, "sqrt", True)
rsqrt = _unary(torch.rsqrt, "rsqrt", True)
tanh = _unary(torch.tanh, "tanh", True)
sigmoid = _unary(torch.sigmoid, "sigmoid", True)
relu = _unary(torch.relu, "relu", True)
gelu = _unary(torch.nn.functional.gelu, "gelu", True)
silu = _unary(torch.nn.functional.silu, "silu", True)
sin = _unary(torch.sin, "sin", True)
cos = _unary(torch.cos, "cos", True)
erf = _unary(torch.erf, "erf", True)
abs = _unary(torch.abs, "abs", False)  # noqa: A001 (nl's name)
negative = _unary(torch.neg, "negative", False)
reciprocal = _unary(torch.reciprocal, "reciprocal", False)
square = _unary(torch.square, "square", False)

@instruction
def where(condition, x, y, dtype=None, mask=None, **kwargs) -> Tile:
    """x where ``condition`` (a tile or an index expression) holds, else y (tiles or scalars)."""
    c = condition.tensor if isinstance(condition, IndexExpr) else read(condition, "nl.where")
    a, b = read(x, "nl.where"), read(y, "nl.where")
    tensors = [t for t in (c, a, b) if isinstance(t, torch.Tensor)]
    device = run().device
    try:
        shape = torch.broadcast_shapes(*(t.shape for t in tensors))
    except RuntimeError:
        fail(ValueError, "nl.where: the condition and the values do not broadcast: "
                         + ", ".join(str(tuple(t.shape)) for t in tensors))
    out = Tile(shape if len(shape) > 1 else (1, 1), _result_dtype(dtype, x, y), sbuf)
    cond = torch.as_tensor(c, device=device).to(torch.bool)
    fa = a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else torch.as_tensor(a, device=device)
    fb = b.float() if isinstance(b, torch.Tensor) and b.is_floating_point() else torch.as_tensor(b, device=device)
    write(out, torch.where(cond, fa, fb), "nl.where", mask,
          valid=both(tuple(out.shape), defined(condition), defined(x), defined(y)))
    _cost.charge_vector("where", out.shape, len(tensors), out.dtype)
    return out


# ---- reductions -----------------------------------------------------------------------------------

def _lowest(dtype):
    return float("-inf") if dtype.is_floating_point else torch.iinfo(_dtype(dtype)).min


def _highest(dtype):
    return float("inf") if dtype.is_floating_point else torch.iinfo(_dtype(dtype)).max


# Unsigned integers PyTorch's CPU reductions lack (amin/amax/sum of uint16, uint32): reduced exactly in int64,
# which holds every value, and written back in the tile's dtype.
_WIDER = {torch.uint16: torch.int64, torch.uint32: torch.int64}


def _reduction(fn, name: str, identity):
    def op(x, axis, dtype=None, keepdims=False, mask=None, **kwargs):
        data = read(x, f"nl.{name}")
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        axes = tuple(a % data.dim() for a in axes)
        if 0 in axes:
            fail(ValueError, f"nl.{name}: reductions run along free axes; axis 0 is the partition axis (reduce "
                             f"across partitions with nc_matmul against a ones vector, or transpose first)")
        values = data.float() if data.is_floating_point() else data.to(_WIDER.get(data.dtype, data.dtype))
        d = defined(x)
        active = None
        if mask is not None:  # NKI: the mask selects the input elements the reduction runs over
            m = mask.tensor if isinstance(mask, IndexExpr) else mask
            m = torch.as_tensor(m, device=values.device)
            if m.dtype != torch.bool:
                fail(TypeError, f"nl.{name}: mask= is a predicate of the indices (such as i_f < n), got a "
                                f"{m.dtype} tensor")
            try:
                m = m.expand(values.shape)
            except RuntimeError:
                fail(ValueError, f"nl.{name}: a mask of shape {tuple(m.shape)} does not cover the input tile of "
                                 f"shape {tuple(values.shape)}; masks of reductions are written on the input's "
                                 f"indices (its partition and free aranges)")
            values = torch.where(m, values, torch.as_tensor(identity(values.dtype), dtype=values.dtype,
                                                            device=values.device))
            d = None if d is None else (d | ~m)
            active = m
            for a in sorted(axes, reverse=True):
                active = active.any(a, keepdim=keepdims)
        if mask is not None and name == "mean":
            count = m.sum(axes, keepdim=keepdims).clamp(min=1)
            result = torch.sum(values, axes, keepdim=keepdims) / count
        else:
            result = fn(values, axes, keepdims)
        out = Tile(result.shape if result.dim() else (1, 1), _result_dtype(dtype, x), sbuf)
        if d is not None:
            for a in sorted(axes, reverse=True):
                d = d.all(a, keepdim=keepdims)
        if active is not None and not _fake(active) and bool(active.all()):
            active = None
        write(out, result, f"nl.{name}", active, valid=d)
        _cost.charge_vector(name, data.shape, 1, out.dtype)
        return out
    op = instruction(op, name)
    op.__name__ = name
    return op


sum = _reduction(lambda t, a, k: torch.sum(t, a, keepdim=k), "sum", lambda dt: 0)  # noqa: A001
max = _reduction(lambda t, a, k: torch.amax(t, a, keepdim=k), "max", _lowest)  # noqa: A001
min = _reduction(lambda t, a, k: torch.amin(t, a, keepdim=k), "min", _highest)  # noqa: A001
mean = _reduction(lambda t, a, k: torch.mean(t, a, keepdim=k), "mean", lambda dt: 0)
prod = _reduction(lambda t, a, k: _prod(t, a, k), "prod", lambda dt: 1)
REDUCE_OPS = {add: sum, maximum: max, minimum: min, multiply: prod}


def _prod(t, axes, keepdim):
    for a in sorted(axes, reverse=True):
        t = torch.prod(t, a, keepdim=keepdim)
    return t


# ---- the tensor engine ----------------------------------------------------------------------------

@instruction
def matmul(x, y, transpose_x: bool = False, mask=None, **kwargs) -> Tile:
    """x @ y into a new PSUM tile (float32). With ``transpose_x``, ``x`` is already [K, M] (the
    stationary operand, contraction on partitions); else it is [M, K] and TensorE transposes it first."""
    if not transpose_x:
        x = _tensor_engine.nc_transpose(x)
    return _tensor_engine.nc_matmul(x, y)


@instruction
def transpose(x, dtype=None, mask=None, **kwargs) -> Tile:
    """The 2-D transpose of a tile (through TensorE, into PSUM)."""
    return _tensor_engine.nc_transpose(x)


# The tile methods that are nl's instructions (the tile class lives below nl, in _core).
TILE_OPS.update(add=add, subtract=subtract, multiply=multiply, divide=divide, negative=negative)
