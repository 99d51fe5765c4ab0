"""The newer NKI's tensor views (``nl.NkiTensor``'s methods) on tiles and HBM tensors.

AWS's API reference (aws-neuron-sdk 81ce03a, ``nki/api/nki/language``, class ``NkiTensor``) gives every NKI
tensor view methods that share its storage: ``slice``, ``select``, ``permute``, ``broadcast``, ``expand_dim``,
``squeeze_dim``, ``reshape_dim``, ``flatten_dims``, ``rearrange``, ``view``/``reinterpret_cast`` (another dtype
over the same bytes) and ``ap`` (an explicit access pattern ``[[stride, count], ...]`` over the storage, as
``torch.as_strided``), with ``get_pattern``, ``strides``, ``offset``, ``is_contiguous``, ``is_indirect``.

Here a view of a tile is the tile with the flat positions of its elements (``TileView(tile, ("flat",
positions))``, as ``tile.reshape`` makes): each method is the same PyTorch view operation applied to the
positions, so reads and writes through it reach the tile's elements and what was written is tracked as
for any view. A view of an HBM tensor is a PyTorch view of its tensor (``as_strided`` for ``ap``). Another
dtype over a tile (``view(dtype)``) shares its memory and its claim on SBUF; what was written is carried
between the two (a wider element counts as written when all of its bytes were).

``select`` with a [1, 1] tile as the index and ``vector_select`` (per-partition rows of an HBM tensor) are
``ap`` with a ``scalar_offset`` / ``vector_offset``. Not here: ``indirect`` (Trn3's tensor indirection), a
``NotImplementedError``.
"""

from __future__ import annotations

import abc
import math
from typing import List, Tuple

import torch

from . import _core
from ._core import HbmTensor, HbmView, Tile, TileView, as_dtype, fail, hbm_parts, psum, read, sbuf

__all__ = ["NKIObject", "NkiTensor"]

_TILE = (Tile, TileView)
_HBM = (HbmTensor, HbmView)


class NKIObject:
    """``nl.NKIObject``: the base of NKI's configuration objects; keyword arguments become attributes."""

    def __init__(self, **kwargs) -> None:
        for k, v in kwargs.items():
            setattr(self, k, v)


class NkiTensor(NKIObject, metaclass=abc.ABCMeta):
    """``nl.NkiTensor``: every NKI tensor (a tile in SBUF/PSUM, a tensor in HBM, or a view of one) is one
    (``isinstance(t, nl.NkiTensor)``). ``nl.NkiTensor(shape, dtype, storage=None, buffer=nl.sbuf)`` makes a
    new one as ``nl.ndarray`` does, or, in HBM with a torch tensor as ``storage``, one over that memory."""

    def __new__(cls, shape, dtype, storage=None, buffer=sbuf, name: str = ""):
        from . import language as nl

        if storage is None:
            return nl.ndarray(shape, dtype, buffer=buffer)
        if isinstance(storage, torch.Tensor) and not getattr(buffer, "on_chip", True):
            return HbmTensor(storage.view(as_dtype(dtype)).view(tuple(shape)))
        fail(TypeError, "nl.NkiTensor: storage is None (a new tensor) or, in HBM, a torch tensor; got "
                        f"{type(storage).__name__} in {buffer!r}")


for _cls in (Tile, TileView, HbmTensor, HbmView):
    NkiTensor.register(_cls)


# ---- tiles: views are flat positions into the tile's data ----------------------------------------------

def _positions(x) -> torch.Tensor:
    data = x.tile.data
    return _core._get(torch.arange(data.numel(), device=data.device).reshape(data.shape), x.index)


def _tile_view(x, positions: torch.Tensor) -> TileView:
    return TileView(x.tile, ("flat", positions))


def _dim(x, dim: int, what: str, partition_ok: bool = False, extra: int = 0) -> int:
    n = len(x.shape) + extra
    if isinstance(dim, bool) or not isinstance(dim, int) or not -n <= dim < n:
        fail(ValueError, f"{what}: dim {dim!r} is out of range for a tensor of {len(x.shape)} dimensions")
    dim %= n
    if dim == 0 and not partition_ok and isinstance(x, _TILE):
        fail(ValueError, f"{what}: dim 0 of an on-chip tensor is its partition dimension, which it cannot change")
    return dim


def _apply(x, what: str, op):
    """``op`` (a PyTorch view operation) applied to a tile's positions or an HBM tensor's tensor."""
    if isinstance(x, _TILE):
        return _tile_view(x, op(_positions(x)))
    tensor, index = hbm_parts(x)
    base = tensor if index is Ellipsis else tensor[index]
    try:
        return HbmTensor(op(base))
    except RuntimeError as e:
        fail(ValueError, f"{what}: the tensor's layout does not allow this view ({e})")


def permute(self, dims):
    dims = tuple(int(d) for d in dims)
    if sorted(dims) != list(range(len(self.shape))):
        fail(ValueError, f"permute: {dims} is not a permutation of the {len(self.shape)} dimensions")
    if isinstance(self, _TILE) and dims[0] != 0:
        fail(ValueError, f"permute: an on-chip tensor keeps its partition dimension first (dims[0] == 0), got {dims}")
    return _apply(self, "permute", lambda t: t.permute(dims))


def broadcast(self, dim: int, size: int):
    dim = _dim(self, dim, "broadcast")
    if self.shape[dim] != 1:
        fail(ValueError, f"broadcast: dimension {dim} has size {self.shape[dim]}; only a size-1 dimension broadcasts")
    shape = list(self.shape)
    shape[dim] = int(size)
    return _apply(self, "broadcast", lambda t: t.expand(shape))


def expand_dim(self, dim: int):
    dim = _dim(self, dim, "expand_dim", extra=1)
    return _apply(self, "expand_dim", lambda t: t.unsqueeze(dim))


def squeeze_dim(self, dim: int):
    dim = _dim(self, dim, "squeeze_dim")
    if self.shape[dim] != 1:
        fail(ValueError, f"squeeze_dim: dimension {dim} has size {self.shape[dim]}, not 1")
    return _apply(self, "squeeze_dim", lambda t: t.squeeze(dim))


def reshape_dim(self, dim: int, shape):
    shape = [int(s) for s in shape]
    trivial = len(shape) == 1 or all(s == 1 for s in shape[1:])
    dim = _dim(self, dim, "reshape_dim", partition_ok=trivial)
    n = self.shape[dim]
    if shape.count(-1) > 1:
        fail(ValueError, f"reshape_dim: at most one size is -1, got {shape}")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if known == 0 or n % known:
            fail(ValueError, f"reshape_dim: dimension {dim} of size {n} does not split into {shape}")
        shape[shape.index(-1)] = n // known
    if math.prod(shape) != n:
        fail(ValueError, f"reshape_dim: dimension {dim} of size {n} does not split into {shape}")
    new = tuple(self.shape[:dim]) + tuple(shape) + tuple(self.shape[dim + 1:])
    return _apply(self, "reshape_dim", lambda t: t.view(new) if isinstance(self, _HBM) else t.reshape(new))


def flatten_dims(self, start_dim: int, end_dim: int):
    start = _dim(self, start_dim, "flatten_dims")
    end = _dim(self, end_dim, "flatten_dims", partition_ok=True)
    if end < start:
        fail(ValueError, f"flatten_dims: end_dim {end_dim} is before start_dim {start_dim}")
    if not _contiguous_dims(self, start, end):
        fail(ValueError, f"flatten_dims: dimensions {start}..{end} are not contiguous in memory")
    return _apply(self, "flatten_dims", lambda t: t.flatten(start, end))


def reshape_view(self, shape):
    """``t.reshape(shape)``: the same elements under another shape (an on-chip tensor keeps its partitions)."""
    return _core._reshape(self, shape) if isinstance(self, _TILE) else \
        _apply(self, "reshape", lambda t: t.view(tuple(int(s) for s in shape)))


def slice_(self, dim: int, start: int, end: int, step: int = 1):
    dim = _dim(self, dim, "slice", partition_ok=True)
    n = self.shape[dim]
    if not (0 <= start < end <= n) or step < 1:
        fail(ValueError, f"slice: needs 0 <= start < end <= {n} and step >= 1, got start={start}, end={end}, "
                         f"step={step}")
    return _apply(self, "slice", lambda t: t[(slice(None),) * dim + (slice(start, end, step),)])


def select(self, dim: int, index):
    if isinstance(index, _TILE):  # dynamic: the index is a [1, 1] tile, read when the instruction runs
        dim = _dim(self, dim, "select")
        pattern = [p for d, p in enumerate(get_pattern(self)) if d != dim]
        return ap(self, pattern, scalar_offset=index, indirect_dim=dim)
    if not isinstance(index, int) or isinstance(index, bool):
        fail(TypeError, f"select: the index is an int or a [1, 1] tile of one, got {type(index).__name__}")
    dim = _dim(self, dim, "select", partition_ok=True)
    n = self.shape[dim]
    if not 0 <= index < n:
        fail(ValueError, f"select: index {index} is out of range for dimension {dim} of size {n}")
    if dim == 0 and isinstance(self, _TILE):  # the partition dimension stays (a size-1 slice)
        return _apply(self, "select", lambda t: t.narrow(0, index, 1))
    return _apply(self, "select", lambda t: t.select(dim, index))


def vector_select(self, dim: int, vector_offset):
    """Partition ``p`` of the result is row ``vector_offset[p]`` of this HBM tensor (a gather along dim 0)."""
    if dim != 0:
        fail(ValueError, f"vector_select: dim is 0, got {dim}")
    if not isinstance(self, _HBM):
        fail(ValueError, "vector_select: only tensors in HBM take per-partition offsets")
    if not isinstance(vector_offset, _TILE):
        fail(TypeError, f"vector_select: vector_offset is an SBUF tile [P, 1], got {type(vector_offset).__name__}")
    pattern = get_pattern(self)
    return ap(self, [[pattern[0][0], vector_offset.shape[0]]] + pattern[1:], vector_offset=vector_offset, indirect_dim=0)


def rearrange(self, src_pattern, dst_pattern, fixed_sizes=None):
    """einops-style: split the groups of ``src_pattern``, reorder to ``dst_pattern``, merge its groups."""
    fixed = dict(fixed_sizes or {})
    src = [p if isinstance(p, (tuple, list)) else (p,) for p in src_pattern]
    if len(src) != len(self.shape):
        fail(ValueError, f"rearrange: src_pattern {src_pattern} has {len(src)} dimensions, the tensor "
                         f"{len(self.shape)}")
    sizes, names = {}, []
    for group, n in zip(src, self.shape):
        unknown = [g for g in group if g not in fixed]
        known = math.prod(fixed[g] for g in group if g in fixed)
        if len(unknown) > 1 or (not unknown and known != n) or (unknown and (known == 0 or n % known)):
            fail(ValueError, f"rearrange: group {group} does not split a dimension of size {n} "
                             f"(fixed_sizes {fixed})")
        for g in group:
            sizes[g] = fixed[g] if g in fixed else n // known
            names.append(g)
    dst = [p if isinstance(p, (tuple, list)) else (p,) for p in dst_pattern]
    order = [g for group in dst for g in group]
    if sorted(order) != sorted(names):
        fail(ValueError, f"rearrange: {dst_pattern} names other dimensions than {src_pattern}")
    split = tuple(sizes[g] for g in names)
    perm = tuple(names.index(g) for g in order)
    merged = tuple(math.prod(sizes[g] for g in group) for group in dst)
    if isinstance(self, _TILE) and (perm[0] != 0 or merged[0] != self.shape[0]):
        fail(ValueError, f"rearrange: an on-chip tensor keeps its partition dimension first ({dst_pattern})")
    if isinstance(self, _TILE):
        return _tile_view(self, _positions(self).reshape(split).permute(perm).reshape(merged))
    return _apply(self, "rearrange", lambda t: t.view(split).permute(perm).view(merged))


# ---- access patterns ----------------------------------------------------------------------------------

def _tile_pattern(x) -> Tuple[int, List[int]]:
    """(offset, strides) of a tile view in elements of its tile's row-major storage (ValueError: not affine)."""
    pos = _positions(x)
    shape = tuple(pos.shape)
    if pos.numel() == 0:
        return 0, [0] * len(shape)
    offset = int(pos.reshape(-1)[0])
    strides = []
    for d, n in enumerate(shape):
        if n > 1:
            strides.append(int(pos[(0,) * d + (1,) + (0,) * (len(shape) - d - 1)]) - offset)
        else:
            strides.append(math.prod(shape[d + 1:]))
    expect = torch.full(shape, offset, dtype=pos.dtype, device=pos.device)
    for d, (n, s) in enumerate(zip(shape, strides)):
        expect = expect + (torch.arange(n, device=pos.device) * s).reshape((1,) * d + (n,) + (1,) * (len(shape) - d - 1))
    if not torch.equal(expect, pos):
        fail(ValueError, "get_pattern: this view is not a strided access pattern (an index expression or gather)")
    return offset, strides


def get_pattern(self) -> List[List[int]]:
    if isinstance(self, _TILE):
        _, strides = _tile_pattern(self)
    else:
        strides = list(_hbm_tensor(self).stride())
    return [[s, n] for s, n in zip(strides, self.shape)]


def _hbm_tensor(x) -> torch.Tensor:
    tensor, index = hbm_parts(x)
    return tensor if index is Ellipsis else tensor[index]


def strides(self) -> Tuple[int, ...]:
    return tuple(s for s, _ in get_pattern(self))


def offset(self) -> int:
    return _tile_pattern(self)[0] if isinstance(self, _TILE) else _hbm_tensor(self).storage_offset()


def _contiguous_dims(x, start: int, end: int) -> bool:
    pattern = get_pattern(x)
    for d in range(start, end):
        if x.shape[d + 1] != 1 and pattern[d][0] != pattern[d + 1][0] * x.shape[d + 1]:
            if x.shape[d] != 1:
                return False
    return True


def is_contiguous(self) -> bool:
    """Row-major over its free dimensions (an on-chip tensor's partitions are independent memories)."""
    first = 1 if isinstance(self, _TILE) else 0
    pattern = get_pattern(self)
    expected = 1
    for d in range(len(self.shape) - 1, first - 1, -1):
        if self.shape[d] != 1 and pattern[d][0] != expected:
            return False
        expected *= self.shape[d]
    return True


def is_indirect(self) -> bool:
    """Whether the view addresses its storage through indices read at run time."""
    if isinstance(self, _TILE):
        return bool(getattr(self, "_indirect", False))
    return isinstance(self, HbmView) and any(isinstance(i, torch.Tensor) for i in
                                             (self.index if isinstance(self.index, tuple) else (self.index,)))


def _pattern(pattern) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    try:
        pairs = [(int(s), int(n)) for s, n in pattern]
    except (TypeError, ValueError):
        fail(TypeError, f"ap: pattern is a list of [stride, count] pairs, got {pattern!r}")
    if not pairs or any(n < 1 for _, n in pairs):
        fail(ValueError, f"ap: a pattern has at least one [stride, count] pair, each count >= 1, got {pattern!r}")
    return tuple(s for s, _ in pairs), tuple(n for _, n in pairs)


def _offsets(values: torch.Tensor, shape, axis_partition: bool) -> torch.Tensor:
    v = values.to(torch.int64)
    if axis_partition:  # one offset per partition, aligned on the first axis
        return v.reshape((v.shape[0],) + (1,) * (len(shape) - 1))
    return v.reshape(())


def ap(self, pattern, offset=None, scalar_offset=None, vector_offset=None, indirect_dim: int = 0, dtype=None):
    """An explicit access pattern over the tensor's storage: element ``[i0, i1, ...]`` of the result is storage
    element ``base + offset + sum(i_k * stride_k)`` (``base``: this view's own offset), as ``torch.as_strided``;
    ``scalar_offset`` (a [1, 1] tile) or ``vector_offset`` (a [P, 1] tile, one per partition) add their value
    times this tensor's stride along ``indirect_dim``, read when the instruction runs (a ``vector_offset`` along
    dimension 0 is each partition's row: it takes the place of the pattern's first stride, as a gather);
    ``dtype`` reinterprets the storage first."""
    strides_, counts = _pattern(pattern)
    x = self
    if dtype is not None and as_dtype(dtype) != x.dtype:
        x = view(x, dtype)
    extra = 0 if offset is None else int(offset)
    if scalar_offset is not None and vector_offset is not None:
        fail(ValueError, "ap: scalar_offset or vector_offset, not both")
    dyn = scalar_offset if scalar_offset is not None else vector_offset
    if dyn is not None:
        if not isinstance(dyn, _TILE):
            fail(TypeError, f"ap: {'scalar' if scalar_offset is not None else 'vector'}_offset is an on-chip tile "
                            f"of indices, got {type(dyn).__name__}")
        own = strides(x)
        d = _dim(x, indirect_dim, "ap (indirect_dim)", partition_ok=True)
        scale = own[d]
        if vector_offset is not None and d == 0:  # each partition's own row: its offset replaces the first stride
            strides_ = (0,) + strides_[1:]
    if isinstance(x, _TILE):
        base, _ = _tile_pattern(x) if x.index is not Ellipsis else (0, None)
        start = base + extra
        pos = torch.full(counts, start, dtype=torch.int64, device=x.tile.data.device)
        for k, (s, n) in enumerate(zip(strides_, counts)):
            pos = pos + (torch.arange(n, device=pos.device) * s).reshape((1,) * k + (n,) + (1,) * (len(counts) - k - 1))
        total = x.tile.data.numel()
        lo = start + sum((n - 1) * st for st, n in zip(strides_, counts) if st < 0)
        hi = start + sum((n - 1) * st for st, n in zip(strides_, counts) if st > 0)
        if lo < 0 or hi >= total:
            fail(IndexError, f"ap: the pattern {list(map(list, zip(strides_, counts)))} with offset {start} addresses "
                             f"elements outside the tile's {total}")
        if dyn is not None:
            if vector_offset is not None and vector_offset.shape[0] != counts[0]:
                fail(ValueError, f"ap: vector_offset has {vector_offset.shape[0]} partitions, the pattern {counts[0]}")
            pos = pos + _offsets(read(dyn, "ap (offset)"), counts, vector_offset is not None) * scale
        out = _tile_view(x, pos)
        if dyn is not None:
            out._indirect = True
        if len(counts) and x.tile.buffer in (sbuf, psum) and counts[0] > 128:
            fail(ValueError, f"ap: an on-chip pattern's first [stride, count] is its partitions (at most 128), "
                             f"got {counts[0]}")
        return out
    t = _hbm_tensor(x)
    start = t.storage_offset() + extra
    room = t.untyped_storage().nbytes() // t.element_size()
    last = start + sum((n - 1) * s for s, n in zip(strides_, counts) if s > 0)
    first = start + sum((n - 1) * s for s, n in zip(strides_, counts) if s < 0)
    if first < 0 or last >= room:
        fail(IndexError, f"ap: the pattern {list(map(list, zip(strides_, counts)))} with offset {start} addresses "
                         f"elements outside the tensor's memory")
    if dyn is None:
        return HbmTensor(torch.as_strided(t, counts, strides_, start))
    flat = torch.as_strided(t, (room,), (1,), 0)
    pos = torch.full(counts, start, dtype=torch.int64, device=t.device)
    for k, (s, n) in enumerate(zip(strides_, counts)):
        pos = pos + (torch.arange(n, device=t.device) * s).reshape((1,) * k + (n,) + (1,) * (len(counts) - k - 1))
    pos = pos + _offsets(read(dyn, "ap (offset)"), counts, vector_offset is not None) * scale
    return HbmView(HbmTensor(flat), (pos,))


# ---- another dtype over the same bytes -------------------------------------------------------------------

class _Reinterpreted(Tile):
    """A tile's memory read as another dtype: the same data and claim on SBUF/PSUM; what was written is
    carried to and from the tile it views (``_pull``/``_push``, called by _core's read and write)."""

    def __init__(self, base: Tile, dtype: torch.dtype):  # no Tile.__init__: nothing new is allocated
        old, new = base.data.element_size(), torch.empty((), dtype=dtype).element_size()
        if base.shape[-1] * old % new:
            fail(ValueError, f"view: the last dimension ({base.shape[-1]} x {base.dtype}) is not a whole number of "
                             f"{dtype} elements")
        self.shape = tuple(base.shape[:-1]) + (base.shape[-1] * old // new,)
        self.dtype, self.buffer, self.base = dtype, base.buffer, base
        self.data = base.data.view(dtype)
        self._run, self._alloc = base._run, base._alloc
        self.complete, self.mask = False, None
        self._ratio = (old, new)
        self._pull()

    def _convert(self, mask: torch.Tensor, to_view: bool) -> torch.Tensor:
        old, new = self._ratio if to_view else self._ratio[::-1]
        if old == new:
            return mask.clone()
        if old > new:  # each element is several of the other's: repeat
            return mask.repeat_interleave(old // new, dim=-1)
        k = new // old  # several elements make one of the other's: written when all of them are
        return mask.reshape(tuple(mask.shape[:-1]) + (mask.shape[-1] // k, k)).all(-1)

    def _pull(self) -> None:
        b = self.base
        if isinstance(b, _Reinterpreted):
            b._pull()
        self.complete = b.complete
        self.mask = None if (b.complete or b.mask is None) else self._convert(b.mask, True)

    def _push(self) -> None:
        b = self.base
        if self.complete:
            b.complete, b.mask = True, None
        elif self.mask is not None:
            m = self._convert(self.mask, False)
            b.complete, b.mask = (True, None) if bool(m.all()) else (False, m)
        if isinstance(b, _Reinterpreted):
            b._push()

    def __repr__(self) -> str:
        return f"{self.base!r}.view({self.dtype})"


def view(self, dtype):
    """The same bytes as ``dtype``; the last dimension scales by the ratio of the element sizes."""
    dtype = as_dtype(dtype, "view")
    if isinstance(self, _TILE):
        if isinstance(self, TileView):
            if self.tile.data.element_size() != torch.empty((), dtype=dtype).element_size():
                fail(NotImplementedError, "view: another element size over a part of a tile; view the whole tile "
                                          "(t.view(dtype)[...]) instead")
            return TileView(_Reinterpreted(self.tile, dtype), self.index)
        return _Reinterpreted(self, dtype)
    t = _hbm_tensor(self)
    try:
        return HbmTensor(t.view(dtype))
    except RuntimeError as e:
        fail(ValueError, f"view: {t.dtype} as {dtype}: {e}")


# ---- onto the classes ---------------------------------------------------------------------------------

_METHODS = {"permute": permute, "broadcast": broadcast, "expand_dim": expand_dim, "squeeze_dim": squeeze_dim,
            "reshape_dim": reshape_dim, "flatten_dims": flatten_dims, "slice": slice_, "select": select,
            "rearrange": rearrange, "get_pattern": get_pattern, "is_contiguous": is_contiguous,
            "is_indirect": is_indirect, "ap": ap, "view": view, "reinterpret_cast": view,
            "vector_select": vector_select}


def _not_here(name: str, why: str):
    def method(self, *args, **kwargs):
        fail(NotImplementedError, f"{name}: {why}")
    method.__name__ = name
    return method


for _cls in (Tile, TileView, HbmTensor, HbmView):
    for _name, _fn in _METHODS.items():
        setattr(_cls, _name, _fn)
    _cls.strides = property(strides)
    _cls.offset = property(offset)
    _cls.ndim = property(lambda self: len(self.shape))
    _cls.size = property(lambda self: math.prod(self.shape))
    _cls.indirect = _not_here("indirect", "Trn3's tensor indirection is not supported here")
del _cls, _name, _fn


class _Regions(abc.ABCMeta):
    def __iter__(cls):
        return iter((cls.sbuf, cls.psum, cls.private_hbm, cls.shared_hbm))


class MemoryRegion(metaclass=_Regions):
    """``nl.MemoryRegion``: the memories a tensor lives in; its members are nl's buffers
    (``nl.MemoryRegion.sbuf is nl.sbuf``, and every buffer is a ``MemoryRegion``)."""

    sbuf, psum, private_hbm, shared_hbm = _core.sbuf, _core.psum, _core.private_hbm, _core.shared_hbm


MemoryRegion.register(_core.Buffer)

# ---- into nl (as _language_more does: the package imports this module after nl) ----------------------------
from . import language as _nl  # noqa: E402

for _name in ("NKIObject", "NkiTensor", "MemoryRegion"):
    setattr(_nl, _name, globals()[_name])
_nl.__all__ += ["NKIObject", "NkiTensor", "MemoryRegion"]
__all__ += ["MemoryRegion"]
del _name
