"""``nki.isa`` (``nisa``): the NeuronCore's instructions, on the emulated device.

Both of NKI's calling styles work: the current one names the destination tile first
(``nisa.tensor_tensor(dst=c, data1=a, data2=b, op=nl.add)``), the earlier one returns a new tile
(``c = nisa.tensor_tensor(a, b, op=nl.add)``).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from . import _cost
from . import _hardware as hw  # noqa: F401
from . import _language_more as _lm
from . import language as nl
from ._calling import _TILE, _deliver, _required, _split_dst, _take  # noqa: F401  (the calling forms)
from ._core import (HbmTensor, HbmView, Tile, TileView, _fake, both, defined, fail, instruction, psum, read, run, sbuf,
                    write)
from ._tensor_engine import nc_matmul, nc_transpose  # noqa: F401  (TensorE's instructions, also nl.matmul's)

__all__ = ["nc_matmul", "nc_transpose", "activation", "tensor_tensor", "tensor_scalar", "tensor_reduce",
           "tensor_copy", "iota", "dma_copy", "memset", "affine_select"]

def _torch_op(op, what: str):
    if isinstance(op, _TILE):
        fail(TypeError, f"{what}: a tile {op!r} where an op (nl.add ...) goes; the output tile goes first "
                        f"({what}(dst, ...)) or as dst=")
    op = _lm.numpy_op(op) or op  # np.add and the like: the nl function of that name
    fn = getattr(op, "torch_fn", None)
    if fn is None:
        if callable(op) and getattr(op, "__module__", "").startswith("torch"):
            return op
        fail(NotImplementedError, f"{what}: op {getattr(op, '__name__', op)!r} is not supported here")
    return fn


def _per_partition_operand(o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A per-partition operand ([P] from ``t[:, 0]``, or [P, 1]) aligned on the partition axis of ``x``."""
    if 0 < o.dim() < x.dim() and o.shape[0] == x.shape[0]:
        return o.reshape(tuple(o.shape) + (1,) * (x.dim() - o.dim()))
    if 0 < x.dim() < o.dim() and o.shape[0] == x.shape[0] and o[0].numel() == 1:
        # a [P, 1] operand of a [P] tile (``t[:, i]``): the same per-partition value, not an outer product
        return o.reshape((o.shape[0],) + (1,) * (x.dim() - 1))
    return o


@instruction
def activation(*args, **kwargs):
    """ScalarE: op(data * scale + bias), bias a [P, 1] tile (or a scalar), scale a scalar or [P, 1] tile."""
    dst, rest = _split_dst(args, kwargs, [("op", "other"), ("data", "tile"), ("bias", "any"), ("scale", "any")],
                           "activation")
    op, data, bias, scale = _take(rest, kwargs, ["op", "data", "bias", "scale"])
    _required("activation", op=op, data=data)
    scale, dtype = 1.0 if scale is None else scale, kwargs.pop("dtype", None)
    if kwargs.get("reduce_op") is not None or kwargs.get("reduce_res") is not None:
        fail(NotImplementedError, "activation: reduce_op/reduce_res (the activation's reduction) is not supported "
                                  "here; reduce the result with nisa.tensor_reduce")
    fn = _torch_op(op, "activation")
    x = read(data, "activation").float()
    s = read(scale, "activation (scale)")
    # A scale of exactly 1.0 before a bias is skipped (x * 1.0 is x): one pass less, in the replayed graph too.
    y = x if bias is not None and not isinstance(s, torch.Tensor) and s == 1.0 else \
        x * (_per_partition_operand(s.float(), x) if isinstance(s, torch.Tensor) else s)
    if bias is not None:
        b = read(bias, "activation (bias)")
        y = y + (_per_partition_operand(b.float(), x) if isinstance(b, torch.Tensor) else b)
    y = fn(y)
    _cost.charge_scalar("activation", x.shape)
    valid = both(tuple(x.shape), defined(data), defined(bias), defined(scale))
    return _deliver(dst, y, "activation", dtype if dtype is not None else (data.dtype if dst is None else None),
                    valid=valid, mask=kwargs.pop("mask", None))


@instruction
def tensor_tensor(*args, **kwargs):
    """VectorE: op(data1, data2) elementwise over two tiles of one shape."""
    dst, rest = _split_dst(args, kwargs, [("data1", "tile"), ("data2", "tile"), ("op", "other")], "tensor_tensor")
    data1, data2, op = _take(rest, kwargs, ["data1", "data2", "op"])
    _required("tensor_tensor", data1=data1, data2=data2, op=op)
    a, b = read(data1, "tensor_tensor"), read(data2, "tensor_tensor")
    if a.shape != b.shape:
        fail(ValueError, f"tensor_tensor: tiles of shapes {tuple(a.shape)} and {tuple(b.shape)}; they must match")
    y = _torch_op(op, "tensor_tensor")(a.float(), b.float())
    _cost.charge_vector("tensor_tensor", a.shape, 2, a.dtype)
    return _deliver(dst, y, "tensor_tensor", kwargs.pop("dtype", None) or (data1.dtype if dst is None else None),
                    valid=both(tuple(a.shape), defined(data1), defined(data2)), mask=kwargs.pop("mask", None))


@instruction
def tensor_scalar(*args, **kwargs):
    """VectorE: op1(op0(data, operand0), operand1), each operand a scalar or a [P, 1] tile."""
    dst, rest = _split_dst(args, kwargs, [("data", "tile"), ("op0", "other"), ("operand0", "any"),
                                         ("reverse0", "other"), ("op1", "other"), ("operand1", "any"),
                                         ("reverse1", "other")], "tensor_scalar")
    data, op0, operand0, reverse0, op1, operand1, reverse1 = _take(
        rest, kwargs, ["data", "op0", "operand0", "reverse0", "op1", "operand1", "reverse1"])
    _required("tensor_scalar", data=data, op0=op0, operand0=operand0)
    x = read(data, "tensor_scalar").float()

    def apply(v, op, operand, reverse):
        o = read(operand, "tensor_scalar (operand)")
        o = _per_partition_operand(o.float(), v) if isinstance(o, torch.Tensor) else o
        fn = _torch_op(op, "tensor_scalar")
        return fn(torch.as_tensor(o, device=v.device), v) if reverse else fn(v, o)

    y = apply(x, op0, operand0, bool(reverse0))
    masks = [defined(data), defined(operand0)]
    if op1 is not None:
        _required("tensor_scalar", operand1=operand1)
        masks.append(defined(operand1))
        y = apply(y, op1, operand1, bool(reverse1))
    _cost.charge_vector("tensor_scalar", x.shape, 1, data.dtype)
    return _deliver(dst, y, "tensor_scalar", kwargs.pop("dtype", None) or (data.dtype if dst is None else None),
                    valid=both(tuple(x.shape), *masks), mask=kwargs.pop("mask", None))


@instruction
def tensor_reduce(*args, **kwargs):
    """VectorE: reduce ``data`` with ``op`` (nl.add, nl.maximum, nl.minimum, nl.multiply) along free axes."""
    dst, rest = _split_dst(args, kwargs, [("op", "other"), ("data", "tile"), ("axis", "other"), ("negate", "other"),
                                         ("keepdims", "other")], "tensor_reduce")
    op, data, axis, negate, keepdims = _take(rest, kwargs, ["op", "data", "axis", "negate", "keepdims"])
    _required("tensor_reduce", op=op, data=data, axis=axis)
    fn = nl.REDUCE_OPS.get(_lm.numpy_op(op) or op)
    if fn is None:
        fail(NotImplementedError, f"tensor_reduce: op {getattr(op, '__name__', op)!r} (use nl.add, nl.maximum, "
                                  f"nl.minimum or nl.multiply)")
    keepdims, negate = bool(keepdims), bool(negate)
    mask = kwargs.pop("mask", None)
    out = fn(data, axis, keepdims=keepdims, mask=mask)
    y = read(out, "tensor_reduce")
    if negate:
        y = -y
    valid, active = defined(out), None
    if mask is not None:  # the outputs with no masked-in input are left as they were
        from ._core import IndexExpr

        x = read(data, "tensor_reduce")
        active = torch.as_tensor(mask.tensor if isinstance(mask, IndexExpr) else mask, device=x.device).expand(x.shape)
        for a in sorted(((axis,) if isinstance(axis, int) else tuple(axis)), key=lambda a: a % x.dim(), reverse=True):
            active = active.any(a % x.dim(), keepdim=keepdims)
        if valid is not None:
            valid = valid | ~active
        if not _fake(active) and bool(active.all()):
            active = None
    return _deliver(dst, y, "tensor_reduce", kwargs.pop("dtype", None) or (data.dtype if dst is None else None),
                    mask=active, valid=valid)


@instruction
def tensor_copy(*args, **kwargs):
    """A copy between on-chip tiles (PSUM -> SBUF, or a cast)."""
    dst, rest = _split_dst(args, kwargs, [("src", "tile")], "tensor_copy")
    (src,) = _take(rest, kwargs, ["src"])
    x = read(src, "tensor_copy")
    _cost.charge_vector("tensor_copy", x.shape, 1, x.dtype)
    return _deliver(dst, x, "tensor_copy", kwargs.pop("dtype", None) or (src.dtype if dst is None else None),
                    valid=defined(src), mask=kwargs.pop("mask", None))


@instruction
def memset(*args, **kwargs):
    if "shape" in kwargs or (args and isinstance(args[0], (tuple, list))):  # the earlier form: a new tile
        if "shape" in kwargs:
            shape, rest = kwargs.pop("shape"), list(args)
        else:
            shape, rest = args[0], list(args[1:])
        value, dtype = _take(rest, kwargs, ["value", "dtype"])
        if value is None or dtype is None:
            fail(ValueError, "memset(shape=, value=, dtype=) needs a value and a dtype")
        dst = Tile(shape, dtype, kwargs.pop("buffer", sbuf))
        write(dst, torch.tensor(value, device=dst.tile.data.device), "memset")
        _cost.charge_vector("memset", dst.shape, 0, dst.dtype, "GpSimd")
        return dst
    dst, rest = _split_dst(args, kwargs, [("value", "other")], "memset")
    (value,) = _take(rest, kwargs, ["value"])
    if dst is None:
        fail(ValueError, "memset needs dst= (or, in the earlier form, shape=, value=, dtype=)")
    write(dst, torch.tensor(value, device=dst.tile.data.device), "memset")
    _cost.charge_vector("memset", dst.shape, 0, dst.dtype, "GpSimd")
    return dst


@instruction
def iota(*args, **kwargs):
    """GpSimd: a tile holding the values of an index expression (``nl.arange(n)[None, :]`` ...)."""
    dst, rest = _split_dst(args, kwargs, [("expr", "other"), ("dtype", "other")], "iota")
    if dst is not None and ("pattern" in kwargs or (rest and isinstance(rest[0], (list, tuple)))):
        return _iota_pattern(dst, rest, kwargs)
    expr, dtype = _take(rest, kwargs, ["expr", "dtype"])
    _required("iota", expr=expr)
    from ._core import IndexExpr

    values = expr.tensor if isinstance(expr, IndexExpr) else torch.as_tensor(expr)
    if values.dim() == 1:
        values = values[None, :]
    _cost.charge_vector("iota", values.shape, 0, dtype or torch.int32, "GpSimd")
    return _deliver(dst, values.to(run().device), "iota", dtype or torch.int32)


def _iota_pattern(dst, rest, kwargs):
    """NKI 0.6's ``iota(dst, pattern, offset, channel_multiplier=0)``: at partition p and free position
    (j_0, j_1, ...) the value offset + p * channel_multiplier + sum(step_i * j_i), pattern [[step_i, num_i], ...]."""
    pattern, offset, multiplier = _take(rest, kwargs, ["pattern", "offset", "channel_multiplier"])
    _required("iota", pattern=pattern, offset=offset)
    if not isinstance(dst, _TILE):
        fail(TypeError, f"iota: dst must be an SBUF tile, got {type(dst).__name__}")
    if dst.buffer is not sbuf:
        fail(ValueError, "iota writes its result to an SBUF tile")
    from ._core import _get

    shape = tuple(_get(dst.tile.data, dst.index).shape)
    device = run().device
    values = torch.full((shape[0],) + (1,) * len(pattern), int(offset), dtype=torch.int64, device=device)
    values = values + torch.arange(shape[0], device=device).reshape((-1,) + (1,) * len(pattern)) * int(multiplier or 0)
    for axis, (step, num) in enumerate(pattern):
        view = [1] * (len(pattern) + 1)
        view[axis + 1] = int(num)
        values = values + torch.arange(int(num), device=device).reshape(view) * int(step)
    values = values.reshape(shape[0], -1)
    per_partition = 1
    for n in shape[1:]:
        per_partition *= n
    if values.shape[1] != per_partition:
        fail(ValueError, f"iota: the pattern {pattern} makes {values.shape[1]} values per partition, dst of shape "
                         f"{shape} has {per_partition}")
    values = values.to(torch.int32).reshape(shape)  # 32-bit integer math, cast to dst's dtype on the write
    _cost.charge_vector("iota", shape, 0, dst.dtype, "GpSimd")
    write(dst, values, "iota")
    return dst


@instruction
def dma_copy(*args, **kwargs):
    """A DMA: HBM -> SBUF, SBUF -> HBM, or between on-chip tiles."""
    if "dst" in kwargs:
        dst, rest = _split_dst(args, kwargs, [("src", "tile")], "dma_copy")
    else:
        dst, rest = (args[0] if args else None), list(args[1:])
    (src,) = _take(rest, kwargs, ["src"])
    if dst is None:
        fail(ValueError, "dma_copy needs dst= and src=")
    if isinstance(dst, (HbmTensor, HbmView)):
        nl.store(dst, src)
        return dst
    if isinstance(src, (HbmTensor, HbmView)):
        from ._core import hbm_parts

        tensor, index = hbm_parts(src)
        values = tensor if index is Ellipsis else tensor[index]
        write(dst, values, "dma_copy", kwargs.pop("mask", None))
        _cost.charge_dma("dma_copy", values.numel() * values.element_size())
        return dst
    x = read(src, "dma_copy")
    write(dst, x, "dma_copy", valid=defined(src))
    _cost.charge_dma("dma_copy", x.numel() * x.element_size())
    return dst


@instruction
def affine_select(*args, **kwargs):
    """GpSimd: ``on_true_tile`` where an affine predicate of the positions holds, else ``on_false_value``
    (the causal mask of attention). Both of NKI's forms:

    - ``affine_select(pred, on_true_tile, on_false_value)``, ``pred`` an index expression such as
      ``i_q - i_k >= 0`` built from ``nl.arange``;
    - ``affine_select(dst=, pattern=[[step, num], ...], offset=, channel_multiplier=, on_true_tile=,
      on_false_value=, cmp_op=nl.equal)``: the predicate is ``cmp_op(offset + p * channel_multiplier
      + sum(step_i * j_i), 0)`` at partition ``p`` and free position ``(j_0, j_1, ...)``.
    """
    from ._core import IndexExpr

    if "pattern" in kwargs or (len(args) >= 2 and isinstance(args[1], (list, tuple))):
        dst, rest = (kwargs.pop("dst"), list(args)) if "dst" in kwargs else (args[0], list(args[1:]))
        pattern, offset, multiplier, on_true, on_false = _take(
            rest, kwargs, ["pattern", "offset", "channel_multiplier", "on_true_tile", "on_false_value"])
        cmp_op = kwargs.pop("cmp_op", nl.equal)
        x = read(on_true, "affine_select")
        value = torch.full((x.shape[0],) + (1,) * len(pattern), float(offset or 0), device=x.device)
        value = value + torch.arange(x.shape[0], device=x.device).reshape(value.shape[:1] + (1,) * len(pattern)) * multiplier
        for axis, (step, num) in enumerate(pattern):
            shape = [1] * (len(pattern) + 1)
            shape[axis + 1] = int(num)
            value = value + torch.arange(int(num), device=x.device).reshape(shape) * step
        value = value.reshape(x.shape[0], -1)
        if value.shape[1] != x[0].numel():
            fail(ValueError, f"affine_select: the pattern covers {value.shape[1]} elements per partition, the tile "
                             f"{tuple(x.shape)} has {x[0].numel()}")
        pred = _torch_op(cmp_op, "affine_select")(value, 0).reshape(x.shape)
    else:
        dst, rest = _split_dst(args, kwargs, [("pred", "other"), ("on_true_tile", "tile"), ("on_false_value", "other")],
                               "affine_select")
        pred, on_true, on_false = _take(rest, kwargs, ["pred", "on_true_tile", "on_false_value"])
        x = read(on_true, "affine_select")
        pred = pred.tensor if isinstance(pred, IndexExpr) else torch.as_tensor(pred, device=x.device)
        try:
            pred = pred.to(x.device).expand(x.shape)
        except RuntimeError:
            fail(ValueError, f"affine_select: a predicate of shape {tuple(pred.shape)} for a tile of shape "
                             f"{tuple(x.shape)}")
    if isinstance(on_false, (Tile, TileView)):
        fail(TypeError, "affine_select: on_false_value is a scalar (use nl.where to choose between two tiles)")
    y = torch.where(pred, x, torch.as_tensor(on_false, dtype=x.dtype, device=x.device))
    _cost.charge_vector("affine_select", x.shape, 1, x.dtype, "GpSimd")
    dtype = kwargs.pop("dtype", None)
    return _deliver(dst, y, "affine_select", dtype or (on_true.dtype if dst is None else None),
                    mask=kwargs.pop("mask", None), valid=defined(on_true))


# The rest of nki.isa's public names are in _isa_more, which imports this module and adds its names to it
# (the package imports it): see _isa_more's end.
