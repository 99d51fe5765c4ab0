"""The rest of ``nki.isa``'s public names (imported into :mod:`torchneuron.nki.isa`).

Each instruction has the meaning AWS's API reference gives it (aws-neuron-sdk ``general/nki/api/nki.isa.rst``
of neuronxcc 2.x and ``nki/api/nki.isa.rst`` of the newer NKI), checks the limits it documents, and is
charged to the engine it names: VectorE for the ALU instructions, GpSimd for the gathers and the random
numbers, the DMA queues for the DMAs.
"""

from __future__ import annotations

import enum
import math

import torch

from . import _cost
from . import _exp
from . import _hardware as hw
from . import isa
from . import _language_more as _lm
from . import language as nl
from ._core import (HbmTensor, HbmView, IndexExpr, Tile, TileView, _get, both, defined, fail, hbm_parts, instruction,
                    psum, read, run, sbuf, write)
from ._core import values as _tile_values
from .isa import _deliver, _required, _torch_op

_TILE = (Tile, TileView)

__all__ = [
    "engine", "dma_engine", "reduce_cmd", "dge_mode", "oob_mode", "matmul_perf_mode", "nc_version",
    "get_nc_version", "get_nc_sub_version", "tensor_engine", "vector_engine", "scalar_engine", "gpsimd_engine",
    "unknown_engine", "fp32", "max8", "nc_find_index8", "nc_match_replace8", "nc_stream_shuffle", "select_reduce",
    "range_select", "tensor_scalar_reduce", "activation", "activation_reduce", "dropout", "bn_stats", "bn_aggr",
    "local_gather", "reciprocal", "exponential", "sequence_bounds", "tensor_copy_predicated", "tensor_copy_dynamic_src",
    "tensor_copy_dynamic_dst", "tensor_partition_reduce", "tensor_tensor_scan", "scalar_tensor_tensor",
    "tensor_scalar_cumulative", "dma_transpose", "set_rng_seed", "rand2", "rng", "rand_get_state",
    "rand_set_state", "topk", "nonzero_with_count", "NkiValidationError",
]


class engine(enum.IntEnum):
    """The NeuronCore's engines (``engine=`` of the instructions that can run on several)."""

    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    vector = 5
    sync = 6  # the newer NKI's name of the queue-only engine


class dma_engine(enum.IntEnum):
    """A DMA's queue (the newer NKI)."""

    unknown = 0
    sync = 1
    gpsimd = 2
    act = 3


class reduce_cmd(enum.IntEnum):
    """The VectorE accumulator's command (select_reduce, range_select, activation's reduce)."""

    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4  # the newer NKI: load imm1 into the accumulator, then accumulate


class dge_mode(enum.IntEnum):
    """Descriptor generation of a DMA: where the DMA's descriptors are made (no effect on values)."""

    none = 0
    swdge = 1
    hwdge = 2
    unknown = 3


class oob_mode(enum.IntEnum):
    """An indirect DMA's out-of-bounds index: an error, or the element skipped."""

    error = 0
    skip = 1


class matmul_perf_mode(enum.IntEnum):
    """nc_matmul's performance modes (the newer NKI): no effect on values here."""

    none = 0
    double_row = 1
    double_row_gen3 = 1


class nc_version(enum.IntEnum):
    """NeuronCore generations: gen2 (trn1/inf2), gen3 (trn2), gen4 (trn3)."""

    gen2 = 2
    gen3 = 3
    gen4 = 4


tensor_engine, vector_engine, scalar_engine, gpsimd_engine, unknown_engine = (
    engine.tensor, engine.vector, engine.scalar, engine.gpsimd, engine.unknown)
fp32 = _lm.fp32


class NkiValidationError(ValueError):
    """An instruction's arguments break a documented limit."""


def get_nc_version() -> nc_version:
    """The target's NeuronCore generation (NEURON_PLATFORM_TARGET_OVERRIDE; trn2 by default)."""
    return {"trn1": nc_version.gen2, "trn2": nc_version.gen3, "trn3": nc_version.gen4}.get(hw.current().name,
                                                                                         nc_version.gen3)


def get_nc_sub_version() -> int:
    return 0


# ---- helpers -------------------------------------------------------------------------------------------

def _per_partition(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(x.shape[0], -1)


def _mask_tensor(mask, shape, device):
    if mask is None:
        return None
    m = mask.tensor if isinstance(mask, IndexExpr) else mask
    return torch.as_tensor(m, device=device).to(torch.bool).expand(shape)


def _accumulate(reduce_res, values: torch.Tensor, cmd, op_fn, what: str) -> None:
    """The VectorE accumulator: reduce ``values`` [P, N] along the free axis with ``op_fn`` into
    ``reduce_res`` [P, 1], restarting (reset_reduce, idle) or continuing (reduce) the run's register."""
    r = run()
    reg = r.accumulator
    red = op_fn(values.float(), 1, keepdim=True)
    cmd = reduce_cmd(int(cmd)) if cmd is not None else reduce_cmd.idle
    if cmd == reduce_cmd.reduce and reg is not None and reg.shape == red.shape:
        red = op_fn(torch.cat([reg, red], 1), 1, keepdim=True)
    if cmd == reduce_cmd.reset:
        red = torch.full_like(red, float("-inf"))
    r.accumulator = red
    if reduce_res is not None:
        write(reduce_res, red, what)


def _reduce_fn(op, what: str):
    f = _lm.numpy_op(op) or op
    table = {nl.maximum: torch.amax, nl.minimum: torch.amin, nl.add: torch.sum, nl.max: torch.amax,
             nl.min: torch.amin, nl.sum: torch.sum}
    if f in table:
        return table[f]
    if f is nl.multiply:
        return lambda t, d, keepdim=False: torch.prod(t, d, keepdim=keepdim)
    fail(NotImplementedError, f"{what}: reduce_op {getattr(op, '__name__', op)!r} (np.max, np.add, np.min)")


def _vector(name, shape, inputs, dtype, engine_name="VectorE"):
    _cost.charge_vector(name, shape, inputs, dtype, engine_name)


# ---- top 8, find, match-replace ----------------------------------------------------------------------

@instruction
def max8(*, src, mask=None, dtype=None, dst=None, **kwargs):
    """The 8 largest values of each partition, descending, as a [P, 8] tile (VectorE)."""
    x = _per_partition(read(src, "max8").float())
    if not 8 <= x.shape[1] <= 16384:
        fail(ValueError, f"max8 reads 8 to 16384 elements per partition, got {x.shape[1]}")
    m = _mask_tensor(mask, read(src, "max8").shape, x.device)
    if m is not None:
        x = torch.where(_per_partition(m), x, torch.tensor(float("-inf"), device=x.device))
    values = torch.topk(x, 8, dim=1).values
    _vector("max8", x.shape, 1, src.dtype)
    return _deliver(dst, values, "max8", nl._dtype(dtype) if dtype is not None else src.dtype)


def _find8(data: torch.Tensor, vals: torch.Tensor, replace=None):
    """Per partition, the index of the first occurrence of each of the 8 values; each match used once
    (AWS's reference marks a found element before looking for the next value)."""
    flat = data.clone()
    idx = torch.zeros(vals.shape, dtype=torch.int64, device=data.device)
    used = torch.zeros(flat.shape, dtype=torch.bool, device=data.device)
    for j in range(vals.shape[1]):
        hit = (flat == vals[:, j:j + 1]) & ~used
        first = torch.where(hit.any(1), hit.float().argmax(1), torch.zeros((), dtype=torch.int64, device=data.device))
        idx[:, j] = first
        rows = torch.arange(flat.shape[0], device=data.device)
        used[rows[hit.any(1)], first[hit.any(1)]] = True
    out = None
    if replace is not None:
        out = torch.where(used, torch.as_tensor(float(replace), device=data.device), data)
    return idx, out


@instruction
def nc_find_index8(*, data, vals, mask=None, dtype=None, dst=None, **kwargs):
    """Per partition, the index of the first occurrence in ``data`` of each of the 8 ``vals`` (uint32)."""
    d = read(data, "nc_find_index8")
    x = _per_partition(d.float())
    m = _mask_tensor(mask, d.shape, d.device)
    if m is not None:
        x = torch.where(_per_partition(m), x, torch.tensor(float("nan"), device=x.device))
    v = _per_partition(read(vals, "nc_find_index8 (vals)").float())
    if v.shape[1] != 8:
        fail(ValueError, f"nc_find_index8: vals holds 8 values per partition, got {v.shape[1]}")
    idx, _ = _find8(x, v)
    _vector("nc_find_index8", x.shape, 1, d.dtype)
    return _deliver(dst, idx, "nc_find_index8", nl._dtype(dtype) if dtype is not None else torch.uint32)


@instruction
def nc_match_replace8(*, data, vals, imm, dst_idx=None, mask=None, dtype=None, dst=None, **kwargs):
    """``data`` with the first occurrence of each of the 8 ``vals`` (per partition) replaced by ``imm``;
    their indices into ``dst_idx`` when given."""
    d = read(data, "nc_match_replace8")
    x = _per_partition(d.float())
    m = _mask_tensor(mask, d.shape, d.device)
    search = x if m is None else torch.where(_per_partition(m), x, torch.tensor(float("nan"), device=x.device))
    v = _per_partition(read(vals, "nc_match_replace8 (vals)").float())
    if v.shape[1] != 8:
        fail(ValueError, f"nc_match_replace8: vals holds 8 values per partition, got {v.shape[1]}")
    idx, replaced = _find8(search, v, replace=imm)
    replaced = torch.where(torch.isnan(search) & ~torch.isnan(x), x, replaced)
    if dst_idx is not None:
        write(dst_idx, idx.reshape(tuple(_get(dst_idx.tile.data, dst_idx.index).shape)), "nc_match_replace8")
    _vector("nc_match_replace8", x.shape, 1, d.dtype)
    return _deliver(dst, replaced.reshape(d.shape), "nc_match_replace8",
                    nl._dtype(dtype) if dtype is not None else data.dtype, valid=defined(data))


# ---- cross-partition movement ----------------------------------------------------------------------

@instruction
def nc_stream_shuffle(src, dst, shuffle_mask, *, dtype=None, mask=None, **kwargs):
    """Within each quadrant of 32 partitions, dst partition i takes src partition shuffle_mask[i] (255:
    left as it was); the same mask in every quadrant (VectorE)."""
    x = read(src, "nc_stream_shuffle")
    target = _tile_values(dst.tile, dst.index)
    if len(shuffle_mask) != 32:
        fail(ValueError, f"nc_stream_shuffle: shuffle_mask has 32 entries, got {len(shuffle_mask)}")
    if x[0].numel() != target[0].numel():
        fail(ValueError, f"nc_stream_shuffle: src has {x[0].numel()} elements per partition, dst {target[0].numel()}")
    xs = _per_partition(x)
    out = _per_partition(target.clone())
    n_dst = out.shape[0]
    for q in range(0, max(n_dst, 1), 32):
        for i, s in enumerate(shuffle_mask):
            s = int(s.tensor.reshape(-1)[0]) if isinstance(s, IndexExpr) else int(s)
            if s == 255 or q + i >= n_dst:
                continue
            src_p = q + s if xs.shape[0] > q + s else s  # a src of fewer partitions: its quadrant
            if src_p >= xs.shape[0]:
                fail(ValueError, f"nc_stream_shuffle: shuffle_mask[{i}] = {s} reads partition {src_p} of a src on "
                                 f"{xs.shape[0]} partitions")
            out[q + i] = xs[src_p].to(out.dtype)
    _vector("nc_stream_shuffle", x.shape, 1, x.dtype)
    write(dst, out.reshape(target.shape), "nc_stream_shuffle", mask)
    return dst


# ---- select and reduce ------------------------------------------------------------------------------

@instruction
def select_reduce(*, dst, predicate, on_true, on_false, reduce_res=None, reduce_cmd=reduce_cmd.idle,
                  reduce_op=None, reverse_pred=False, mask=None, dtype=None, **kwargs):
    """dst = where(predicate, on_true, on_false); the max of each partition into ``reduce_res``."""
    p = read(predicate, "select_reduce (predicate)")
    t = read(on_true, "select_reduce (on_true)").float()
    f = read(on_false, "select_reduce (on_false)")
    f = f.float() if isinstance(f, torch.Tensor) else torch.tensor(float(f), device=t.device)
    if p.shape != t.shape:
        fail(ValueError, f"select_reduce: predicate {tuple(p.shape)} and on_true {tuple(t.shape)} differ")
    cond = p != 0
    if reverse_pred:
        cond = ~cond
    if f.dim() and f.dim() < t.dim():
        f = f.reshape(tuple(f.shape) + (1,) * (t.dim() - f.dim()))
    y = torch.where(cond, t, f)
    _deliver(dst, y, "select_reduce", mask=mask, valid=both(tuple(t.shape), defined(predicate), defined(on_true)))
    if reduce_res is not None or int(reduce_cmd) != 0:
        _accumulate(reduce_res, _per_partition(y), reduce_cmd, _reduce_fn(reduce_op or nl.maximum, "select_reduce"),
                    "select_reduce")
    _vector("select_reduce", t.shape, 2, on_true.dtype)
    return dst


@instruction
def range_select(*, on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd=reduce_cmd.idle, reduce_res=None,
                 reduce_op=None, range_start=0, on_false_value=None, mask=None, dtype=None, dst=None, **kwargs):
    """Elements whose free index + range_start passes comp_op0(., bound0) and comp_op1(., bound1) kept,
    the others on_false_value (fp32.min); the max of each partition into ``reduce_res`` (VectorE)."""
    x = read(on_true_tile, "range_select").float()
    flat = _per_partition(x)
    idx = (range_start + torch.arange(flat.shape[1], device=x.device, dtype=torch.float32))[None, :]
    b0 = read(bound0, "range_select (bound0)")
    b1 = read(bound1, "range_select (bound1)")
    b0 = b0.float().reshape(-1, 1) if isinstance(b0, torch.Tensor) else float(b0)
    b1 = b1.float().reshape(-1, 1) if isinstance(b1, torch.Tensor) else float(b1)
    keep = _torch_op(comp_op0, "range_select")(idx, b0).bool() & _torch_op(comp_op1, "range_select")(idx, b1).bool()
    false_value = _lm.fp32.min if on_false_value is None else float(on_false_value)
    y = torch.where(keep, flat, torch.tensor(false_value, device=x.device))
    if reduce_res is not None or int(reduce_cmd) != 0:
        _accumulate(reduce_res, y, reduce_cmd, _reduce_fn(reduce_op or nl.maximum, "range_select"), "range_select")
    _vector("range_select", x.shape, 1, on_true_tile.dtype)
    return _deliver(dst, y.reshape(x.shape), "range_select",
                    nl._dtype(dtype) if dtype is not None else (on_true_tile.dtype if dst is None else None),
                    mask=mask, valid=defined(on_true_tile))


@instruction
def tensor_scalar_reduce(*, data, op0, operand0, reduce_op, reduce_res, reverse0=False, dtype=None, mask=None,
                         dst=None, **kwargs):
    """op0(data, operand0) (operand0 a scalar or a [P, 1] tile), and its reduction with ``reduce_op`` along the
    free axes of each partition into ``reduce_res`` [P, 1] (VectorE)."""
    x = read(data, "tensor_scalar_reduce").float()
    o = read(operand0, "tensor_scalar_reduce (operand0)")
    o = o.float() if isinstance(o, torch.Tensor) else torch.tensor(float(o), device=x.device)
    if o.dim() and o.dim() < x.dim():
        o = o.reshape(tuple(o.shape) + (1,) * (x.dim() - o.dim()))
    fn = _torch_op(op0, "tensor_scalar_reduce")
    y = fn(o, x) if reverse0 else fn(x, o)
    red = _reduce_fn(reduce_op, "tensor_scalar_reduce")(_per_partition(y), 1, keepdim=True)
    write(reduce_res, red, "tensor_scalar_reduce")
    _vector("tensor_scalar_reduce", x.shape, 1, data.dtype)
    return _deliver(dst, y, "tensor_scalar_reduce",
                    nl._dtype(dtype) if dtype is not None else (data.dtype if dst is None else None),
                    mask=mask, valid=defined(data))


_activation = isa.activation


@instruction
def activation(*args, **kwargs):
    """ScalarE: op(data * scale + bias); with ``reduce_op``/``reduce_res`` also the result's reduction
    along the free axes of each partition into ``reduce_res`` (nl.add / np.add: a sum)."""
    reduce_op, reduce_res = kwargs.pop("reduce_op", None), kwargs.pop("reduce_res", None)
    cmd = kwargs.pop("reduce_cmd", None)
    out = _activation(*args, **kwargs)
    if reduce_res is not None:
        y = _per_partition(read(out, "activation").float())
        if cmd is not None and int(cmd) != 0:
            _accumulate(reduce_res, y, cmd, _reduce_fn(reduce_op or nl.add, "activation"), "activation")
        else:
            write(reduce_res, _reduce_fn(reduce_op or nl.add, "activation")(y, 1, keepdim=True), "activation")
        _vector("activation_reduce", y.shape, 1, torch.float32)
    return out


@instruction
def activation_reduce(*args, reduce_op=None, reduce_res=None, **kwargs):
    """activation(...) whose result is also reduced along the free axes of each partition into ``reduce_res``."""
    _required("activation_reduce", reduce_op=reduce_op, reduce_res=reduce_res)
    return activation(*args, reduce_op=reduce_op, reduce_res=reduce_res, **kwargs)


# ---- random numbers ------------------------------------------------------------------------------

@instruction
def dropout(*args, **kwargs):
    """Each element of ``data`` zeroed with probability ``prob`` (a scalar or a [P, 1] tile), else kept
    unscaled (VectorE)."""
    dst, rest = isa._split_dst(args, kwargs, [("data", "tile"), ("prob", "any")], "dropout")
    data, prob = isa._take(rest, kwargs, ["data", "prob"])
    _required("dropout", data=data, prob=prob)
    x = read(data, "dropout")
    p = read(prob, "dropout (prob)")
    p = p.float().reshape(-1, *([1] * (x.dim() - 1))) if isinstance(p, torch.Tensor) else float(p)
    keep = _lm.uniform(x.shape, x.device) >= p
    y = torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device))
    _vector("dropout", x.shape, 1, x.dtype)
    return _deliver(dst, y, "dropout", kwargs.pop("dtype", None) or (data.dtype if dst is None else None),
                    mask=kwargs.pop("mask", None), valid=defined(data))


def set_rng_seed(seed=None, *args, **kwargs) -> None:
    """Seed the random number generator (a scalar or a tile holding one)."""
    if seed is None:
        seed = kwargs.get("src", kwargs.get("seeds"))
    _lm.random_seed(seed)


@instruction
def rand2(*args, **kwargs):
    """Uniform random values in [min, max) (default [0, 1)) into ``dst`` (GpSimd)."""
    dst = kwargs.pop("dst", args[0] if args else None)
    lo, hi = float(kwargs.pop("min", 0.0)), float(kwargs.pop("max", 1.0))
    if dst is None:
        fail(TypeError, "rand2: missing the argument 'dst'")
    shape = tuple(_get(dst.tile.data, dst.index).shape)
    write(dst, lo + (hi - lo) * _lm.uniform(shape, dst.tile.data.device), "rand2")
    _vector("rand2", shape, 0, dst.dtype, "GpSimd")
    return dst


@instruction
def rng(*args, **kwargs):
    """Random 32-bit integers into ``dst`` (GpSimd)."""
    dst = kwargs.pop("dst", args[0] if args else None)
    if dst is None:
        fail(TypeError, "rng: missing the argument 'dst'")
    shape = tuple(_get(dst.tile.data, dst.index).shape)
    values = torch.randint(0, 2**31 - 1, shape, generator=_lm._generator())
    write(dst, values.to(dst.tile.data.device), "rng")
    _vector("rng", shape, 0, dst.dtype, "GpSimd")
    return dst


def rand_get_state(*args, **kwargs):
    """The generator's state into ``dst`` (a tile of uint32 words)."""
    dst = kwargs.pop("dst", args[0] if args else None)
    state = _lm._generator().get_state()
    words = torch.frombuffer(bytearray(state.numpy().tobytes()), dtype=torch.int32)
    shape = tuple(_get(dst.tile.data, dst.index).shape)
    n = math.prod(shape)
    w = torch.zeros(n, dtype=torch.int32)
    w[:min(n, words.numel())] = words[:n]
    write(dst, w.reshape(shape).to(dst.tile.data.device), "rand_get_state")
    return dst


def rand_set_state(*args, **kwargs):
    """Seed the generator from the words of ``src`` (a state got from rand_get_state, or any words)."""
    src = kwargs.pop("src_seeds", kwargs.pop("src", args[0] if args else None))
    w = read(src, "rand_set_state").reshape(-1).to(torch.int64).cpu()
    _lm.random_seed(int(w.sum().item()) & 0xFFFFFFFF)


# ---- statistics, gathers, misc ---------------------------------------------------------------------

@instruction
def bn_stats(*args, **kwargs):
    """Per partition (count, mean, variance * count) of the even and of the odd elements: [P, 6] (VectorE,
    in float32; at most 512 elements per partition, nl.tile_size.bn_stats_fmax)."""
    dst, rest = isa._split_dst(args, kwargs, [("data", "tile")], "bn_stats")
    (data,) = isa._take(rest, kwargs, ["data"])
    x = _per_partition(read(data, "bn_stats").float())
    if x.shape[1] > 512:
        fail(ValueError, f"bn_stats reads at most 512 elements per partition (nl.tile_size.bn_stats_fmax), got "
                         f"{x.shape[1]}")
    parts = []
    for half in (x[:, 0::2], x[:, 1::2]):
        n = half.shape[1]
        mean = half.mean(1) if n else torch.zeros(x.shape[0], device=x.device)
        m2 = ((half - mean[:, None]) ** 2).sum(1) if n else torch.zeros(x.shape[0], device=x.device)
        parts += [torch.full((x.shape[0],), float(n), device=x.device), mean, m2]
    _vector("bn_stats", x.shape, 1, data.dtype)
    return _deliver(dst, torch.stack(parts, 1), "bn_stats",
                    kwargs.pop("dtype", None) or (data.dtype if dst is None else None), mask=kwargs.pop("mask", None))


@instruction
def bn_aggr(*args, **kwargs):
    """Per partition (mean, variance) of the elements bn_stats summarized as (count, mean, variance*count)
    triples: [P, 2] (VectorE)."""
    dst, rest = isa._split_dst(args, kwargs, [("data", "tile")], "bn_aggr")
    (data,) = isa._take(rest, kwargs, ["data"])
    x = _per_partition(read(data, "bn_aggr").float())
    if x.shape[1] % 3:
        fail(ValueError, f"bn_aggr reads (count, mean, variance*count) triples, got {x.shape[1]} elements per "
                         f"partition")
    t = x.reshape(x.shape[0], -1, 3)
    count, mean, m2 = t[..., 0], t[..., 1], t[..., 2]
    total = count.sum(1).clamp(min=1)
    mu = (count * mean).sum(1) / total
    var = (m2 + count * (mean - mu[:, None]) ** 2).sum(1) / total
    _vector("bn_aggr", x.shape, 1, data.dtype)
    return _deliver(dst, torch.stack([mu, var], 1), "bn_aggr",
                    kwargs.pop("dtype", None) or (data.dtype if dst is None else None), mask=kwargs.pop("mask", None))


@instruction
def local_gather(src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, *, mask=None, dst=None, **kwargs):
    """GpSimd: each group of 16 partitions gathers, per partition, ``num_elem_per_idx`` contiguous elements at
    each of its indices (the group's ``index`` flattened partition-first, the first ``num_valid_indices`` of
    them; offsets in elements of the partition's flattened free axes): [P, num_valid * num_elem_per_idx]."""
    src = read(src_buffer, "local_gather")
    idx = read(index, "local_gather (index)")
    P = src.shape[0]
    if P != idx.shape[0] or P % 16:
        fail(ValueError, f"local_gather: src_buffer and index on the same multiple of 16 partitions, got {P} and "
                         f"{idx.shape[0]}")
    if num_elem_per_idx not in (1, 2, 4, 8, 16, 32):
        fail(ValueError, f"local_gather: num_elem_per_idx is 1, 2, 4, 8, 16 or 32, got {num_elem_per_idx}")
    flat = _per_partition(src)
    idx2 = _per_partition(idx).to(torch.int64)
    per_core = idx2.shape[1] * 16
    nvalid = per_core if num_valid_indices is None else int(num_valid_indices)
    if nvalid > per_core:
        fail(ValueError, f"local_gather: num_valid_indices {nvalid} > the {per_core} indices of 16 partitions")
    out = torch.empty((P, nvalid * num_elem_per_idx), dtype=src.dtype, device=src.device)
    offs = torch.arange(num_elem_per_idx, device=src.device)
    for g in range(0, P, 16):
        ids = idx2[g:g + 16].t().reshape(-1)[:nvalid]  # partition first (Fortran order)
        pos = (ids[:, None] + offs[None, :]).reshape(-1)
        if bool((pos >= flat.shape[1]).any()) or bool((pos < 0).any()):
            fail(IndexError, f"local_gather: an index outside the {flat.shape[1]} elements of a partition")
        out[g:g + 16] = flat[g:g + 16][:, pos]
    _vector("local_gather", out.shape, 1, src.dtype, "GpSimd")
    return _deliver(dst, out, "local_gather", src_buffer.dtype, mask=mask)


@instruction
def reciprocal(*args, **kwargs):
    """1 / data (VectorE)."""
    dst, rest = isa._split_dst(args, kwargs, [("data", "tile")], "reciprocal")
    (data,) = isa._take(rest, kwargs, ["data"])
    x = read(data, "reciprocal").float()
    _vector("reciprocal", x.shape, 1, data.dtype)
    return _deliver(dst, torch.reciprocal(x), "reciprocal",
                    kwargs.pop("dtype", None) or (data.dtype if dst is None else None),
                    mask=kwargs.pop("mask", None), valid=defined(data))


@instruction
def exponential(*args, **kwargs):
    """exp(data - max_value) (the newer NKI's ScalarE exponential; max_value a scalar or a [P, 1] tile)."""
    dst, rest = isa._split_dst(args, kwargs, [("data", "tile")], "exponential")
    (data,) = isa._take(rest, kwargs, ["data"])
    x = read(data, "exponential").float()
    mv = kwargs.pop("max_value", 0.0)
    mv = read(mv, "exponential (max_value)")
    mv = mv.float().reshape(-1, *([1] * (x.dim() - 1))) if isinstance(mv, torch.Tensor) else float(mv)
    y = _exp.exp(x - mv)
    reduce_res = kwargs.pop("reduce_res", None)
    if reduce_res is not None:
        write(reduce_res, _per_partition(y).sum(1, keepdim=True), "exponential")
    _cost.charge_scalar("exponential", x.shape)
    return _deliver(dst, y, "exponential", kwargs.pop("dtype", None) or (data.dtype if dst is None else None),
                    mask=kwargs.pop("mask", None), valid=defined(data))


@instruction
def sequence_bounds(*, segment_ids, dtype=None, dst=None, **kwargs):
    """Per element of ``segment_ids`` [1, N], the [start, end) of its segment: [1, 2, N]; padding (id 0) gets
    start N and end -1 (GpSimd)."""
    s = read(segment_ids, "sequence_bounds")
    if s.shape[0] != 1:
        fail(ValueError, f"sequence_bounds: segment_ids on one partition, got {s.shape[0]}")
    seq = s.reshape(-1).float().cpu()
    n = seq.numel()
    lo = torch.zeros(n)
    hi = torch.zeros(n)
    for i in range(n):
        if seq[i] == 0:
            lo[i] = n
        elif i > 0 and seq[i] == seq[i - 1]:
            lo[i] = lo[i - 1]
        else:
            lo[i] = i
    for i in range(n - 1, -1, -1):
        if seq[i] == 0:
            hi[i] = -1
        elif i < n - 1 and seq[i] == seq[i + 1]:
            hi[i] = hi[i + 1]
        else:
            hi[i] = i + 1
    out = torch.stack([lo, hi])[None].to(s.device)
    _vector("sequence_bounds", s.shape, 1, s.dtype, "GpSimd")
    return _deliver(dst, out, "sequence_bounds", nl._dtype(dtype) if dtype is not None else segment_ids.dtype)


@instruction
def tensor_copy_predicated(*, src, dst, predicate, reverse_pred=False, mask=None, dtype=None, **kwargs):
    """dst = src where predicate (nonzero) holds (not, with reverse_pred); elsewhere dst is left (VectorE)."""
    p = read(predicate, "tensor_copy_predicated (predicate)")
    s = read(src, "tensor_copy_predicated")
    target = _tile_values(dst.tile, dst.index)
    cond = (p != 0).reshape(target.shape) if p.numel() == target.numel() else (p != 0)
    if reverse_pred:
        cond = ~cond
    sv = s.reshape(target.shape) if isinstance(s, torch.Tensor) and s.numel() == target.numel() else s
    y = torch.where(cond, torch.as_tensor(sv, device=target.device).to(target.dtype), target)
    _vector("tensor_copy_predicated", target.shape, 2, dst.dtype)
    write(dst, y, "tensor_copy_predicated", mask)
    return dst


@instruction
def tensor_copy_dynamic_src(src, *, mask=None, dtype=None, engine=None, dst=None, **kwargs):
    """A copy of ``src`` indexed at an offset read from a tile when the instruction runs (VectorE)."""
    return isa.tensor_copy(src, dst=dst, mask=mask, dtype=dtype) if dst is not None else \
        isa.tensor_copy(src, mask=mask, dtype=dtype)


@instruction
def tensor_copy_dynamic_dst(*, dst, src, mask=None, dtype=None, engine=None, **kwargs):
    """A copy into ``dst`` indexed at an offset read from a tile when the instruction runs (VectorE)."""
    return isa.tensor_copy(dst=dst, src=src, mask=mask)


_PARTITION_REDUCE = {"add": torch.sum, "maximum": torch.amax, "minimum": torch.amin, "max": torch.amax,
                     "amax": torch.amax, "min": torch.amin, "amin": torch.amin}


@instruction
def tensor_partition_reduce(*args, **kwargs):
    """The reduction across partitions with ``op`` (add, maximum, bitwise_or, bitwise_and): [1, ...] (GpSimd)."""
    dst, rest = isa._split_dst(args, kwargs, [("op", "other"), ("data", "tile")], "tensor_partition_reduce")
    op, data = isa._take(rest, kwargs, ["op", "data"])
    _required("tensor_partition_reduce", op=op, data=data)
    x = read(data, "tensor_partition_reduce")
    name = getattr(_lm.numpy_op(op) or op, "__name__", "")
    if name in ("bitwise_or", "bitwise_and"):
        v = x.to(torch.int64)
        y = v[0]
        for i in range(1, v.shape[0]):
            y = (torch.bitwise_or if name == "bitwise_or" else torch.bitwise_and)(y, v[i])
        y = y[None]
    elif name in _PARTITION_REDUCE:
        y = _PARTITION_REDUCE[name](x.float(), 0, keepdim=True)
    else:
        fail(NotImplementedError, f"tensor_partition_reduce: op {name!r} (add, maximum, minimum, bitwise_or, "
                                  f"bitwise_and)")
    _vector("tensor_partition_reduce", x.shape, 1, data.dtype, "GpSimd")
    return _deliver(dst, y, "tensor_partition_reduce", kwargs.pop("dtype", None) or (data.dtype if dst is None else None),
                    mask=kwargs.pop("mask", None))


@instruction
def tensor_tensor_scan(*args, **kwargs):
    """Per partition: r[0] = op1(op0(data0[0], initial), data1[0]), r[i] = op1(op0(data0[i], r[i-1]), data1[i])
    along the flattened free axes, in float32 (VectorE)."""
    dst, rest = isa._split_dst(args, kwargs, [("data0", "tile"), ("data1", "tile"), ("initial", "any"),
                                             ("op0", "other"), ("op1", "other"), ("reverse0", "other"),
                                             ("reverse1", "other")], "tensor_tensor_scan")
    data0, data1, initial, op0, op1, reverse0, reverse1 = isa._take(
        rest, kwargs, ["data0", "data1", "initial", "op0", "op1", "reverse0", "reverse1"])
    _required("tensor_tensor_scan", data0=data0, data1=data1, initial=initial, op0=op0, op1=op1)
    a, b = read(data0, "tensor_tensor_scan"), read(data1, "tensor_tensor_scan")
    if a.shape != b.shape:
        fail(ValueError, f"tensor_tensor_scan: data0 {tuple(a.shape)} and data1 {tuple(b.shape)} differ")
    x0, x1 = _per_partition(a.float()), _per_partition(b.float())
    init = read(initial, "tensor_tensor_scan (initial)")
    prev = init.float().reshape(-1) if isinstance(init, torch.Tensor) else torch.full((x0.shape[0],), float(init),
                                                                                      device=x0.device)
    f0, f1 = _torch_op(op0, "tensor_tensor_scan"), _torch_op(op1, "tensor_tensor_scan")
    cols = []
    for i in range(x0.shape[1]):
        t = f0(prev, x0[:, i]) if reverse0 else f0(x0[:, i], prev)
        t = f1(x1[:, i], t) if reverse1 else f1(t, x1[:, i])
        prev = t.float()
        cols.append(prev)
    y = torch.stack(cols, 1).reshape(a.shape)
    _vector("tensor_tensor_scan", a.shape, 2, data0.dtype)
    return _deliver(dst, y, "tensor_tensor_scan", kwargs.pop("dtype", None) or (data0.dtype if dst is None else None),
                    mask=kwargs.pop("mask", None), valid=both(tuple(a.shape), defined(data0), defined(data1)))


@instruction
def scalar_tensor_tensor(*args, **kwargs):
    """op1(op0(data, operand0), operand1): operand0 a scalar or [P, 1] tile, operand1 a tile (VectorE)."""
    dst = kwargs.pop("dst", args[0] if args else None)
    data, op0, operand0, op1, operand1 = (kwargs.pop(k, None) for k in ("data", "op0", "operand0", "op1", "operand1"))
    reverse0, reverse1 = bool(kwargs.pop("reverse0", False)), bool(kwargs.pop("reverse1", False))
    _required("scalar_tensor_tensor", data=data, op0=op0, operand0=operand0, op1=op1, operand1=operand1)
    x = read(data, "scalar_tensor_tensor").float()
    o0 = read(operand0, "scalar_tensor_tensor (operand0)")
    o0 = o0.float().reshape(-1, *([1] * (x.dim() - 1))) if isinstance(o0, torch.Tensor) else float(o0)
    o1 = read(operand1, "scalar_tensor_tensor (operand1)").float()
    f0, f1 = _torch_op(op0, "scalar_tensor_tensor"), _torch_op(op1, "scalar_tensor_tensor")
    t = f0(torch.as_tensor(o0, device=x.device), x) if reverse0 else f0(x, o0)
    y = f1(o1, t) if reverse1 else f1(t, o1)
    _vector("scalar_tensor_tensor", x.shape, 2, data.dtype)
    return _deliver(dst, y, "scalar_tensor_tensor",
                    kwargs.pop("dtype", None) or (data.dtype if dst is None else None), mask=kwargs.pop("mask", None),
                    valid=both(tuple(x.shape), defined(data), defined(operand0), defined(operand1)))


_IDENTITY = {"add": 0.0, "subtract": 0.0, "multiply": 1.0, "maximum": float("-inf"), "minimum": float("inf")}


@instruction
def tensor_scalar_cumulative(*args, **kwargs):
    """The newer NKI's scan with a scalar op (VectorE): per partition, ``reg = op1(op0(src[i], imm0), reg)``
    (``op0(imm0, src[i])`` with reverse0), ``dst[i] = reg``, along the flattened free axes. ``reg`` starts
    at op1's identity (reduce_cmd=reset_reduce, the default), at ``imm1`` (load_reduce), or where the
    accumulator was left (reduce)."""
    dst = kwargs.pop("dst", args[0] if args else None)
    src = kwargs.pop("src", args[1] if len(args) > 1 else None)
    op0, op1 = kwargs.pop("op0", args[2] if len(args) > 2 else None), kwargs.pop("op1", args[3] if len(args) > 3 else None)
    imm0 = kwargs.pop("imm0", args[4] if len(args) > 4 else None)
    imm1 = kwargs.pop("imm1", args[5] if len(args) > 5 else None)
    cmd = reduce_cmd(int(kwargs.pop("reduce_cmd", reduce_cmd.reset_reduce)))
    reverse0 = bool(kwargs.pop("reverse0", False))
    _required("tensor_scalar_cumulative", src=src, op0=op0, op1=op1, imm0=imm0)
    shape = tuple(read(src, "tensor_scalar_cumulative").shape)
    x = _per_partition(read(src, "tensor_scalar_cumulative").float())
    o0 = read(imm0, "tensor_scalar_cumulative (imm0)")
    o0 = o0.float().reshape(-1, 1) if isinstance(o0, torch.Tensor) else torch.tensor(float(o0), device=x.device)
    f0 = _torch_op(op0, "tensor_scalar_cumulative")
    t = f0(o0, x) if reverse0 else f0(x, o0)
    f1 = _torch_op(op1, "tensor_scalar_cumulative")
    r = run()
    if cmd == reduce_cmd.load_reduce:
        _required("tensor_scalar_cumulative", imm1=imm1)
        v = read(imm1, "tensor_scalar_cumulative (imm1)")
        reg = v.float().reshape(-1) if isinstance(v, torch.Tensor) else torch.full((x.shape[0],), float(v),
                                                                                   device=x.device)
    elif cmd == reduce_cmd.reduce and r.accumulator is not None:
        reg = r.accumulator.reshape(-1)
    else:
        name = getattr(_lm.numpy_op(op1) or op1, "__name__", "")
        if name not in _IDENTITY:
            fail(NotImplementedError, f"tensor_scalar_cumulative: op1 {name!r} (add, subtract, multiply, maximum, "
                                      f"minimum)")
        reg = torch.full((x.shape[0],), _IDENTITY[name], device=x.device)
    reg = reg.expand(x.shape[0]).clone()
    cols = []
    for i in range(t.shape[1]):
        reg = f1(t[:, i], reg).float()
        cols.append(reg)
    r.accumulator = reg.reshape(-1, 1)
    y = torch.stack(cols, 1).reshape(shape)
    _vector("tensor_scalar_cumulative", x.shape, 1, src.dtype)
    return _deliver(dst, y, "tensor_scalar_cumulative", None if dst is not None else src.dtype)


@instruction
def dma_transpose(*args, **kwargs):
    """A transposing DMA from HBM or SBUF into a new SBUF tile: 2-D [1, 0], 3-D [2, 1, 0], 4-D [3, 1, 2, 0]
    (or ``axes``)."""
    dst = kwargs.pop("dst", None)
    src = kwargs.pop("src", None)
    rest = list(args)
    if src is None and dst is None and len(rest) >= 2 and isinstance(rest[0], _TILE) and \
            isinstance(rest[1], (Tile, TileView, HbmTensor, HbmView)):
        dst, src = rest[0], rest[1]
    elif src is None and rest:
        src = rest[0]
    axes = kwargs.pop("axes", None)
    if isinstance(src, (HbmTensor, HbmView)):
        tensor, index = hbm_parts(src)
        x = tensor if index is Ellipsis else tensor[index]
    else:
        x = read(src, "dma_transpose")
    if axes is None:
        axes = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}.get(x.dim())
        if axes is None:
            fail(ValueError, f"dma_transpose: a 2-, 3- or 4-D source, got {x.dim()}-D")
    y = x.permute(*axes)
    _cost.charge_dma("dma_transpose", y.numel() * y.element_size())
    return _deliver(dst, y.contiguous(), "dma_transpose",
                    nl._dtype(kwargs.pop("dtype")) if kwargs.get("dtype") is not None else
                    (src.dtype if dst is None else None))


@instruction
def topk(*args, **kwargs):
    """The newer NKI's top-k: the ``k`` largest values of each partition, descending, into ``dst``."""
    dst = kwargs.pop("dst", args[0] if args else None)
    src = kwargs.pop("src", kwargs.pop("data", args[1] if len(args) > 1 else None))
    k = int(kwargs.pop("k", args[2] if len(args) > 2 else 8))
    x = _per_partition(read(src, "topk").float())
    vals = torch.topk(x, k, dim=1)
    idx_dst = kwargs.pop("dst_idx", kwargs.pop("indices", None))
    if idx_dst is not None:
        write(idx_dst, vals.indices.reshape(tuple(_get(idx_dst.tile.data, idx_dst.index).shape)), "topk")
    _vector("topk", x.shape, 1, src.dtype)
    return _deliver(dst, vals.values, "topk", None if dst is not None else src.dtype)


@instruction
def nonzero_with_count(*args, **kwargs):
    """The newer NKI's compaction: per partition, the indices of the nonzero elements of ``src`` first (in order),
    padded with ``padding_val`` (-1), and their count in the last column: [P, N + 1]."""
    dst = kwargs.pop("dst", args[0] if args else None)
    src = kwargs.pop("src", args[1] if len(args) > 1 else None)
    pad = kwargs.pop("padding_val", -1)
    x = _per_partition(read(src, "nonzero_with_count"))
    P, N = x.shape
    out = torch.full((P, N + 1), float(pad), device=x.device)
    for p in range(P):
        nz = torch.nonzero(x[p] != 0).reshape(-1)
        out[p, :nz.numel()] = nz.float()
        out[p, N] = nz.numel()
    _vector("nonzero_with_count", x.shape, 1, src.dtype, "GpSimd")
    return _deliver(dst, out, "nonzero_with_count", None if dst is not None else torch.int32)


# ---- DMA: indirect indices out of bounds, read-modify-write, HBM to HBM ------------------------------------

_dma_copy = isa.dma_copy
__all__ += ["dma_copy"]


def _hbm_index(x):
    """(tensor, index tensors broadcast together, which are in bounds) of an HBM tensor or view."""
    from ._core import _broadcast_index

    tensor, index = hbm_parts(x)
    idx, shape = _broadcast_index(tensor, index)
    ok = torch.ones(shape, dtype=torch.bool, device=tensor.device)
    from ._core import _fake

    if _fake(tensor):  # shapes only: no data-dependent bounds checks
        return tensor, idx, ok
    for d, i in enumerate(idx):
        ok &= (i >= 0) & (i < tensor.shape[d])
    clamped = tuple(i.clamp(0, tensor.shape[d] - 1) for d, i in enumerate(idx))
    if not bool(ok.all()):  # the first element out of bounds, as a flat index (AWS's simulator's message)
        flat = sum(i * st for i, st in zip(idx, tensor.stride()))
        _OOB.append(f"index {int(flat[~ok].reshape(-1)[0])} is out of bounds for axis 0 with size {tensor.numel()}")
    return tensor, clamped, ok


_OOB: list = []


def _oob_error(what: str):
    """IndexError with the message AWS's simulator gives (NumPy's, for the flattened tensor)."""
    message = _OOB[-1] if _OOB else f"{what}: an index out of bounds"
    _OOB.clear()
    raise IndexError(message)


@instruction
def dma_copy(*args, **kwargs):
    """A DMA between HBM and on-chip tiles (or HBM and HBM). An indirect index (a tile of indices) out of
    bounds raises IndexError with ``oob_mode=nisa.oob_mode.error`` (the default) and is skipped with
    ``oob_mode.skip``; ``dst_rmw_op`` (np.add) makes a store to HBM a read-modify-write."""
    oob = kwargs.pop("oob_mode", oob_mode.error)
    rmw = kwargs.pop("dst_rmw_op", None)
    kwargs.pop("dge_mode", None)
    kwargs.pop("engine", None)
    if "dst" in kwargs or "src" in kwargs:
        dst, src = kwargs.pop("dst", args[0] if args else None), kwargs.pop("src", args[1] if len(args) > 1 else None)
    else:
        dst, src = (list(args) + [None, None])[:2]
    mask = kwargs.pop("mask", None)
    hbm = (HbmTensor, HbmView)

    def direct(x):  # an HBM side indexed by slices and ints only (no tile of indices)
        return not isinstance(x, HbmView) or not any(isinstance(i, torch.Tensor) for i in
                                                     (x.index if isinstance(x.index, tuple) else (x.index,)))
    plain = rmw is None and int(oob) == int(oob_mode.error) and not (isinstance(dst, hbm) and isinstance(src, hbm))
    if not isinstance(dst, hbm) and not isinstance(src, hbm) or plain and direct(dst) and direct(src) and (
            mask is None):
        return _dma_copy(dst=dst, src=src, **({"mask": mask} if mask is not None else {}))
    _OOB.clear()
    if isinstance(src, hbm):
        tensor, idx, ok = _hbm_index(src)
        if not bool(ok.all()) and int(oob) == int(oob_mode.error):
            _oob_error("dma_copy (src)")
        values = tensor[idx]
        _cost.charge_dma("dma_copy", values.numel() * values.element_size())
        if isinstance(dst, hbm):  # HBM -> HBM
            dt, didx, dok = _hbm_index(dst)
            dt[tuple(i[dok] for i in didx)] = values.expand(dok.shape)[dok].to(dt.dtype)
            return dst
        target = tuple(_get(dst.tile.data, dst.index).shape)
        if values.shape != target and values.numel() == math.prod(target):
            values, ok = values.reshape(target), ok.reshape(target)
        elif values.shape != target and mask is not None and values.dim() == len(target) and \
                all(v <= t for v, t in zip(values.shape, target)):
            # a masked copy whose source slice runs past the tensor's end: the part outside is masked off
            pad = [p for v, t in reversed(list(zip(values.shape, target))) for p in (0, t - v)]
            values = torch.nn.functional.pad(values, pad)
            ok = torch.nn.functional.pad(ok, pad) & _mask_tensor(mask, target, values.device)
            mask = None
        if mask is not None:
            ok = ok & _mask_tensor(mask, target, values.device)
        write(dst, values, "dma_copy", None if bool(ok.all()) else ok)
        return dst
    # on-chip -> HBM
    _OOB.clear()
    tensor, idx, ok = _hbm_index(dst)
    if not bool(ok.all()) and int(oob) == int(oob_mode.error):
        _oob_error("dma_copy (dst)")
    data = read(src, "dma_copy")
    data = torch.as_tensor(data, device=tensor.device).to(tensor.dtype)
    if data.shape != ok.shape:
        data = data.reshape(ok.shape) if data.numel() == ok.numel() else data.expand(ok.shape)
    if mask is not None:
        ok = ok & _mask_tensor(mask, ok.shape, ok.device)
    sel = tuple(i[ok] for i in idx)
    if rmw is not None:
        fn = _torch_op(rmw, "dma_copy (dst_rmw_op)")
        if fn is torch.add:
            tensor.index_put_(sel, data[ok], accumulate=True)
        else:
            for k, v in enumerate(data[ok]):
                pos = tuple(i[k] for i in sel)
                tensor[pos] = fn(tensor[pos], v)
    else:
        tensor[sel] = data[ok]
    _cost.charge_dma("dma_copy", data.numel() * data.element_size())
    return dst


# ---- into nisa ----------------------------------------------------------------------------------------
# Kernels find these names in nisa (``nisa.max8``). This module is built on nisa's instructions, so nisa
# does not import it (no import circle, tests/test_layout.py): it adds its names to nisa here, replacing
# nisa's activation and dma_copy by the ones above (which call them); the package imports it after nisa.

for _name in __all__:
    setattr(isa, _name, globals()[_name])
isa.__all__ += [n for n in __all__ if n not in isa.__all__]
del _name
