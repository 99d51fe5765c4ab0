"""Tiles and HBM tensors: what every NKI instruction works on.

A tile lives in SBUF or PSUM: a tensor of device memory whose first axis is the partition axis
(at most 128), with a mask of the elements written so far (reading one never written is an
error, as it is garbage on silicon). Each tile records its live interval in the kernel's run
(:mod:`._run`), which checks the target generation's SBUF and PSUM capacity by liveness
(:mod:`._limits`) when the program ends.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from . import _hardware as hw
from . import _cost, _dtypes, _memory
from ._run import _RUN, Instruction, KernelRun, _fake, annotate, fail, instruction, kernel_line, run  # noqa: F401

class Buffer:
    """A memory of the NeuronCore: ``nl.sbuf``, ``nl.psum``, ``nl.hbm``/``nl.shared_hbm``/``nl.private_hbm``."""

    def __init__(self, name: str, on_chip: bool):
        self.name, self.on_chip = name, on_chip

    def __repr__(self) -> str:
        return f"nl.{self.name}"


sbuf = Buffer("sbuf", True)
psum = Buffer("psum", True)
hbm = Buffer("hbm", False)
shared_hbm = Buffer("shared_hbm", False)
private_hbm = Buffer("private_hbm", False)



# ---- tiles ----------------------------------------------------------------------------------------

_ITEMSIZE: Dict[torch.dtype, int] = {}


def _itemsize(dtype: torch.dtype) -> int:
    size = _ITEMSIZE.get(dtype)
    if size is None:
        dtype = as_dtype(dtype)
        size = _ITEMSIZE[dtype] = torch.empty((), dtype=dtype).element_size()
    return size


# The tile methods that are nl's instructions (arithmetic, +=, broadcast_to): nl, above this module,
# fills this table when it is imported.
TILE_OPS: Dict[str, Callable] = {}


def touch(t: "Tile") -> None:
    """``t`` is used now (read or written): it holds its SBUF/PSUM space at least until this tick."""
    t._alloc.last = t._run.clock


class ParDim(int):
    """``nl.par_dim(n)``: an axis size marked as the partition dimension of a tile's shape."""

    def __repr__(self) -> str:
        return f"par_dim({int(self)})"


def par_axis(shape) -> int:
    """The partition axis of a tile shape: the one marked with ``nl.par_dim``, else the first."""
    marked = [i for i, s in enumerate(shape) if isinstance(s, ParDim)]
    if len(marked) > 1:
        fail(ValueError, f"a tile shape marks one partition dimension (nl.par_dim), got {len(marked)} in "
                         f"{tuple(shape)}")
    return marked[0] if marked else 0


def as_dtype(d, what: str = "dtype") -> torch.dtype:
    """An nl dtype (:class:`._dtypes.DType`, a torch dtype), or the same given as a torch dtype, a NumPy dtype or
    scalar type (``np.float32``, ml_dtypes' ``bfloat16``) or its name (``"bfloat16"``, the newer NKI's)."""
    if isinstance(d, torch.dtype):
        return d
    if isinstance(d, _dtypes.DType):
        return d.torch
    if d is bool:
        return torch.bool
    if isinstance(d, str) and d in _dtypes._BY_NAME:
        return _dtypes._BY_NAME[d].torch
    try:
        import numpy as np

        nd = np.dtype(d) if (isinstance(d, np.dtype) or (isinstance(d, type) and issubclass(d, np.generic))) else None
    except TypeError:
        nd = None
    if nd is not None:
        try:
            return _dtypes.to_torch(np.empty(0, dtype=nd)).dtype
        except TypeError:
            pass
        fail(TypeError, f"{what}: NumPy dtype {nd} has no NKI counterpart")
    fail(TypeError, f"{what}: expected an nl dtype (nl.float32, nl.bfloat16, ...) or a NumPy dtype (np.float32, "
                    f"...), got {d!r}")


class Tile:
    """A tile of SBUF or PSUM: ``data`` (device memory, partition axis first) and what was written.

    A shape may mark its partition axis with ``nl.par_dim``; axes before it are block axes (a block
    of tiles, each with the partition axis)."""

    # Its bytes in the buffer's memory when a direct allocator placed it (_memory.Placed), else None.
    place = None
    # For the result of an instruction run under a mask: where the mask was off (see write and assign).
    unexecuted: Optional[torch.Tensor] = None

    def __init__(self, shape, dtype: torch.dtype, buffer: Buffer, data: Optional[torch.Tensor] = None):
        r = run()
        dtype = as_dtype(dtype)
        placement = None
        if isinstance(buffer, _memory.Placement):
            placement, buffer = buffer, buffer.buffer
        if isinstance(shape, (int, torch.SymInt)):
            shape = (shape,)
        pa = par_axis(tuple(shape))
        shape = tuple(int(s) for s in shape)
        if not shape:
            fail(ValueError, "a tile needs at least one axis (the partition axis)")
        if any(s < 0 for s in shape):
            fail(ValueError, f"a tile's shape has no negative sizes, got {shape}")
        if shape[pa] > hw.PMAX:
            which = "its first" if pa == 0 else f"axis {pa}, marked nl.par_dim"
            fail(ValueError, f"a tile's partition axis ({which}) holds at most {hw.PMAX} partitions; "
                             f"got shape {shape} in {buffer!r}")
        if buffer is psum and _itemsize(dtype) > 4:
            fail(TypeError, f"a PSUM tile holds elements of 4 bytes at most (float32, int32, 16-bit and 8-bit "
                            f"types), not {dtype}")
        per_partition = math.prod(shape[:pa] + shape[pa + 1:]) * _itemsize(dtype)
        if buffer is psum:
            banks = math.ceil(per_partition / hw.PSUM_BANK_BYTES)
        elif buffer is sbuf:
            banks = 0
        else:
            fail(ValueError, f"a tile lives in nl.sbuf or nl.psum, not {buffer!r}")
        self.shape, self.dtype, self.buffer = shape, dtype, buffer
        if placement is not None and data is None:  # placed at its addresses: checked there, not by liveness
            self.place = _memory.place(placement, shape, dtype, pa)
            data, per_partition, banks = self.place.data, 0, 0
        self.data = torch.empty(shape, dtype=dtype, device=r.device) if data is None else data
        # What was written: every element (``complete``), else the elements of ``mask`` (None: nothing yet).
        # Whole-tile writes, the common case, never touch a mask.
        self.complete = False
        self.mask: Optional[torch.Tensor] = None
        # Its claim on SBUF/PSUM: from now to its last use (_limits checks the capacity when the program ends).
        self._run, self._alloc = r, r.allocate(buffer.name, shape, dtype, per_partition, banks)

    # A tile is its own whole view.
    @property
    def tile(self) -> "Tile":
        return self

    @property
    def index(self):
        return Ellipsis

    def __getitem__(self, index) -> "TileView":
        return TileView(self, _compose(Ellipsis, index, self.data))

    def __setitem__(self, index, value) -> None:
        idx = _compose(Ellipsis, index, self.data)
        assign(TileView(self, Ellipsis if idx == (Ellipsis,) else idx), value)

    @instruction
    def broadcast_to(self, shape) -> "Tile":
        """This tile repeated along axes of size 1 (partitions included), as a new SBUF tile."""
        data = read(self, "broadcast_to")
        try:
            expanded = data.expand(tuple(shape))
        except RuntimeError:
            fail(ValueError, f"broadcast_to: a tile of shape {self.shape} cannot broadcast to {tuple(shape)}")
        out = Tile(shape, self.dtype, sbuf)
        d = defined(self)
        write(out, expanded, "broadcast_to", valid=None if d is None else d.expand(tuple(shape)))
        _cost.charge_vector("broadcast_to", out.shape, 1, out.dtype)
        return out

    def reshape(self, shape) -> "TileView":
        """The same elements, in row-major order, under another shape with the same partitions (a view:
        writes through it write this tile)."""
        return _reshape(self, shape)

    def __repr__(self) -> str:
        return f"Tile({list(self.shape)}, {self.dtype}, {self.buffer!r})"

    # Arithmetic on tiles is nl's (VectorE/ScalarE instructions).
    def __add__(self, o): return IndexExpr(read(self, "+") + o.tensor) if isinstance(o, IndexExpr) else TILE_OPS["add"](self, o)
    def __radd__(self, o): return IndexExpr(o.tensor + read(self, "+")) if isinstance(o, IndexExpr) else TILE_OPS["add"](o, self)
    def __sub__(self, o): return TILE_OPS["subtract"](self, o)
    def __rsub__(self, o): return TILE_OPS["subtract"](o, self)
    def __mul__(self, o): return TILE_OPS["multiply"](self, o)
    def __rmul__(self, o): return TILE_OPS["multiply"](o, self)
    def __truediv__(self, o): return TILE_OPS["divide"](self, o)
    def __rtruediv__(self, o): return TILE_OPS["divide"](o, self)
    def __neg__(self): return TILE_OPS["negative"](self)

    def __iadd__(self, o):
        """``acc += x``: in place (a PSUM accumulator takes a matmul's result as the matmul writing into it)."""
        accumulate(self, o)
        return self


class TileView:
    """``tile[index]``: a part of a tile to read or write."""

    def __init__(self, tile: Tile, index):
        self.tile, self.index = tile, index

    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(_get(self.tile.data, self.index).shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.tile.dtype

    @property
    def buffer(self) -> Buffer:
        return self.tile.buffer

    def __getitem__(self, index):
        return TileView(self.tile, _compose(self.index, index, self.tile.data))

    def reshape(self, shape) -> "TileView":
        return _reshape(self, shape)

    def __setitem__(self, index, value) -> None:
        assign(TileView(self.tile, _compose(self.index, index, self.tile.data)), value)

    __add__, __radd__, __sub__, __rsub__ = Tile.__add__, Tile.__radd__, Tile.__sub__, Tile.__rsub__
    __mul__, __rmul__, __truediv__, __rtruediv__, __neg__ = (Tile.__mul__, Tile.__rmul__, Tile.__truediv__,
                                                              Tile.__rtruediv__, Tile.__neg__)

    def __iadd__(self, o):
        accumulate(self, o)
        self._accumulated = True  # `t[i] += x` assigns this view back to itself: nothing left to do
        return self


def tensor_engine_writes(dst, value, accumulating: bool = False) -> None:
    """Raise unless TensorE may write its result ``value`` (a PSUM tile it made) into the PSUM tile (view)
    ``dst`` of dst's dtype. AWS (aws-neuron-sdk@81ce03a, nki/guides/architecture/): TensorE writes float32
    into PSUM (trainium_inferentia2_arch.rst: "The PSUM accumulation is always done in FP32"); from
    NeuronCore-v3 (trn2) its transpose mode writes a float16/bfloat16 transpose in the input's dtype
    (trainium2_arch.rst, "FP16/BF16 PSUM output for FP16/BF16 transpose"); from NeuronCore-v4 (trn3) a
    matmul writes, and accumulates into, bfloat16 too (trainium3_arch.rst, "BF16 Matmul Results in PSUM")."""
    dtype = dst.tile.dtype
    made = getattr(value, "_tensor_engine", None)  # (transpose mode, the input's dtype)
    if made is None or dtype in (torch.float32, torch.int32):
        return
    gen = run().gen.name
    transposed, source = made
    if transposed and not accumulating and gen != "trn1" and dtype == source and \
            dtype in (torch.float16, torch.bfloat16):
        return
    if gen == "trn3" and dtype == torch.bfloat16:
        return
    fail(TypeError, f"TensorE writes float32 into PSUM, not {dtype} (the PSUM tile written here): a float16/"
                    f"bfloat16 PSUM tile takes a transpose (is_transpose=True) of its own dtype from trn2 on, "
                    f"and a bfloat16 one any matmul result on trn3")


def _fresh_psum(x) -> bool:
    """Whether ``x`` is a whole PSUM tile written and never read: a matmul's result, about to be taken
    into an accumulator."""
    return isinstance(x, Tile) and x.buffer is psum and x._alloc.reads == 0


def assign(view, value) -> None:
    """``tile[index] = value``: a copy into the tile (a PSUM result assigned into a PSUM tile is the
    matmul writing there: it takes no space of its own, :mod:`._limits`)."""
    if getattr(value, "_accumulated", False) and value.tile is view.tile:
        return
    r = run()
    r.clock += 1
    reduce = getattr(value, "_loop_reduce", None)
    if reduce is not None:  # nl.loop_reduce: the accumulator is the op's other input
        fn, mask = reduce
        a, b = read(view, "nl.loop_reduce"), read(value, "nl.loop_reduce")
        fa, fb = (a.float(), b.float()) if a.is_floating_point() else (a, b)
        if fb.dim() != fa.dim() and fb.numel() == fa.numel():
            fb = fb.reshape(fa.shape)
        write(view, fn(fa, fb), "nl.loop_reduce", mask, valid=both(tuple(a.shape), defined(view), defined(value)))
        r.clock += 1
        return
    unexecuted = getattr(value, "unexecuted", None) if isinstance(value, Tile) and value._alloc.reads == 0 else None
    if unexecuted is not None:  # a masked instruction's result: it writes where its mask holds, nowhere else
        if bool(unexecuted.all()):
            r.clock += 1
            return
        target = _get(view.tile.data, view.index).shape
        keep = ~unexecuted
        if keep.shape != target and keep.numel() == math.prod(target):
            keep = keep.reshape(target)
        write(view, read(value, "tile assignment"), "tile assignment", keep, valid=defined(value))
        r.clock += 1
        return
    fold = view.buffer is psum and _fresh_psum(value)
    if fold:
        tensor_engine_writes(view, value)
    elif view.tile.place is not None and isinstance(value, Tile) and value.place is None and value._alloc.reads == 0:
        fold = True  # an instruction's result assigned into a placed tile: it wrote there, taking no space
    write(view, read(value, "tile assignment"), "tile assignment", valid=defined(value))
    if fold:
        value._alloc.folded = r.clock
    r.clock += 1


def accumulate(dst, value) -> None:
    """``dst += value`` in place: VectorE's add, or, for a PSUM result added into a PSUM tile, the
    matmul accumulating there (TensorE's work, already charged; no space of its own)."""
    r = run()
    r.clock += 1
    fold = dst.buffer is psum and _fresh_psum(value)
    if fold:
        tensor_engine_writes(dst, value, accumulating=True)
        if not written_anywhere(dst):
            # The first matmul into a PSUM region writes it; the next ones accumulate (AWS,
            # aws-neuron-sdk@81ce03a nki/guides/architecture/trainium_inferentia2_arch.rst: "the first write
            # to a PSUM bank overwrites, and subsequent writes accumulate").
            write(dst, read(value, "+="), "+=", valid=defined(value))
            value._alloc.folded = r.clock
            r.clock += 1
            return
    a, b = read(dst, "+="), read(value, "+=")
    fa = a.float() if a.is_floating_point() else a
    fb = b.float() if isinstance(b, torch.Tensor) and b.is_floating_point() else b
    if isinstance(fb, torch.Tensor) and fb.dim() < fa.dim():  # tiles align on the partition axis
        fb = fb.reshape(tuple(fb.shape) + (1,) * (fa.dim() - fb.dim()))
    d = defined(dst)
    shape = tuple(a.shape)
    write(dst, fa + (fb if isinstance(fb, torch.Tensor) else torch.as_tensor(fb, device=a.device)), "+=",
          valid=both(shape, d, defined(value)))
    if fold:
        value._alloc.folded = r.clock
    else:
        _cost.charge_vector("add", shape, 1 + int(isinstance(b, torch.Tensor)), dst.dtype)
    r.clock += 1


def _reshape(x, shape) -> "TileView":
    shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
    current = tuple(x.shape)
    if math.prod(shape) != math.prod(current) or not shape or shape[0] != current[0]:
        fail(ValueError, f"reshape: a tile of shape {current} reshapes to a shape with the same partitions "
                         f"({current[0]}) and elements ({math.prod(current)}), got {shape}")
    data = x.tile.data
    positions = _positions(data, x.index)
    return TileView(x.tile, ("flat", positions.reshape(shape)))


def _index(index):
    if not isinstance(index, tuple):
        index = (index,)
    out = []
    for i in index:
        if isinstance(i, IndexExpr):
            i = i.tensor
        elif isinstance(i, (Tile, TileView)):  # an indirect index: the values of a tile, read when it runs
            i = values(i.tile, i.index).to(torch.int64)
        out.append(i)
    return tuple(out)


def _axes_taken(index) -> Optional[int]:
    """How many axes an index tuple consumes (None when it holds an Ellipsis: then it fits any tile)."""
    n = 0
    for i in index:
        if i is Ellipsis:
            return None
        if i is None:
            continue
        n += i.dim() if isinstance(i, torch.Tensor) and i.dtype == torch.bool else 1
    return n


def _positions(data: torch.Tensor, index) -> torch.Tensor:
    """The row-major flat positions in ``data`` of the elements of ``data[index]``, computed in the size of
    the view (not of the tile: a view of a view of a large block tile costs its own size)."""
    if isinstance(index, tuple) and index and isinstance(index[0], str):
        return index[1]  # already flat positions
    basic = index is Ellipsis or all(i is None or i is Ellipsis or isinstance(i, (int, slice)) for i in
                                     (index if isinstance(index, tuple) else (index,)))
    if not basic or _fake(data):
        return _get(torch.arange(data.numel(), device=data.device).reshape(data.shape), index)
    offset, sizes, strides = _basic_view(tuple(data.shape), index)
    positions = torch.full((), offset, dtype=torch.int64, device=data.device)
    for axis, (n, stride) in enumerate(zip(sizes, strides)):
        shape = [1] * len(sizes)
        shape[axis] = n
        positions = positions + torch.arange(n, device=data.device).reshape(shape) * stride
    return positions.expand(tuple(sizes))


def _basic_view(shape: Tuple[int, ...], index):
    """The offset, sizes and strides of ``x[index]`` for a row-major ``x`` of ``shape`` and a basic index
    (integers, slices, None, one Ellipsis), in plain integers (nothing traced)."""
    index = (index,) if not isinstance(index, tuple) else index
    if any(i is Ellipsis for i in index):
        at = next(k for k, i in enumerate(index) if i is Ellipsis)
        taken = sum(1 for i in index if i is not None and i is not Ellipsis)
        index = index[:at] + (slice(None),) * (len(shape) - taken) + index[at + 1:]
    index = index + (slice(None),) * (len(shape) - sum(1 for i in index if i is not None))
    contiguous = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    offset, sizes, strides, d = 0, [], [], 0
    for i in index:
        if i is None:
            sizes.append(1)
            strides.append(0)
            continue
        n = shape[d]
        if isinstance(i, slice):
            start, stop, step = i.indices(n)
            sizes.append(len(range(start, stop, step)))
            strides.append(contiguous[d] * step)
            offset += start * contiguous[d]
        else:
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for dimension {d} with size {n}")
            offset += (i % n) * contiguous[d]
        d += 1
    return offset, sizes, strides


def _compose(outer, inner, data: torch.Tensor):
    inner = _index(inner)
    shape = tuple(_get(data, outer).shape)
    taken = _axes_taken(inner)
    extra = 0 if taken is None else taken - len(shape)
    if outer is Ellipsis and extra <= 0:
        return inner
    # A view of a view: index the flat positions of the first view. A tile of shape [P] is the same
    # elements as one of shape [P, 1] (as everywhere here: tiles align on the partition axis), so
    # ``m[:, 0]`` of a view ``t[:, i]`` is ``t[:, i]`` itself, as NKI indexes such a view; an
    # index past those unit axes raises IndexError as for any tensor.
    positions = _positions(data, outer)
    if extra > 0:
        positions = positions.reshape(shape + (1,) * extra)
    return ("flat", positions[inner])


def written_anywhere(view) -> bool:
    """Whether any element of a tile view was written (nc_matmul: accumulate, or write first)."""
    t = view.tile
    touch(t)
    _pull(t)
    if t.complete:
        return True
    if t.mask is None or _fake(t.mask):
        return False
    return bool(_get(t.mask, view.index).any())


def read(x, what: str) -> torch.Tensor:
    """The values of a tile, a view of one, or a scalar operand.

    Elements never written are read as whatever the memory holds, as on the chip; :func:`defined`
    says which they are, every instruction carries that to its result, and a store of one raises.
    """
    if isinstance(x, (Tile, TileView)):
        t = x.tile
        a = t._alloc
        a.last = t._run.clock
        a.reads += 1
        return values(t, x.index)
    if isinstance(x, (HbmTensor, HbmView)):
        fail(TypeError, f"{what} takes an on-chip tile, not a tensor in HBM: load it first (nl.load or "
                        f"nisa.dma_copy)")
    if isinstance(x, (torch.Tensor, int, float, bool, torch.SymInt, torch.SymFloat)):
        return x
    if type(x).__module__ == "numpy" and getattr(x, "ndim", None) == 0:  # a NumPy scalar (np.int32(3))
        return x.item()
    fail(TypeError, f"{what}: expected a tile or a scalar, got {type(x).__name__}")


def defined(x) -> Optional[torch.Tensor]:
    """None when every element of the tile (view) ``x`` was written, else which were (a bool tensor)."""
    if not isinstance(x, (Tile, TileView)):
        return None
    t = x.tile
    _pull(t)
    if _fake(t.data):
        return None
    if t.place is not None:  # whatever wrote its bytes, through any tile placed over them
        m = t.place.defined(x.index)
        return None if bool(m.all()) else m
    if t.complete:
        return None
    shape = _get(t.data, x.index).shape
    if t.mask is None:
        return torch.zeros(shape, dtype=torch.bool, device=t.data.device)
    m = _get(t.mask, x.index)
    return None if bool(m.all()) else m


def both(shape, *masks) -> Optional[torch.Tensor]:
    """The elements of a result of ``shape`` whose inputs were all written (None: all of them)."""
    masks = [m for m in masks if m is not None]
    if not masks:
        return None
    out = None
    for m in masks:
        if m.dim() < len(shape):  # tiles align on the partition axis
            m = m.reshape(tuple(m.shape) + (1,) * (len(shape) - m.dim()))
        elif m.dim() > len(shape) and m.numel() == math.prod(shape):  # [P, 1] and [P]: the same elements
            m = m.reshape(shape)
        m = m.expand(shape)
        out = m if out is None else out & m
    return out


def require_defined(x, what: str, where=None) -> None:
    """Raise when ``x`` (restricted to ``where``) holds elements never written."""
    d = defined(x)
    if d is None:
        return
    if where is not None:
        d = d | ~torch.as_tensor(where, device=d.device).expand(d.shape)
    if not bool(d.all()):
        fail(RuntimeError, f"{what} uses {x.tile!r} where it was never written ({int((~d).sum())} elements): on "
                           f"the chip that is whatever the memory held (uninitialized tile)")


def write(dst, value: torch.Tensor, what: str, mask=None, valid: Optional[torch.Tensor] = None) -> None:
    """Write ``value`` (broadcast to the destination's shape, cast to its dtype) into a tile or a view."""
    if not isinstance(dst, (Tile, TileView)):
        fail(TypeError, f"{what}: the destination must be an SBUF/PSUM tile, got {type(dst).__name__}")
    touch(dst.tile)
    target_shape = _get(dst.tile.data, dst.index).shape
    value = torch.as_tensor(value, device=dst.tile.data.device) if not isinstance(value, torch.Tensor) else value
    try:
        value = value.to(dst.tile.dtype).expand(target_shape) if value.shape != target_shape else value.to(dst.tile.dtype)
    except RuntimeError:
        if value.numel() == math.prod(target_shape) and value.dim() and target_shape and \
                value.shape[0] == target_shape[0]:  # [P, 1] into a destination indexed down to [P]: same elements
            value = value.to(dst.tile.dtype).reshape(target_shape)
            if valid is not None and valid.numel() == value.numel():
                valid = valid.reshape(target_shape)
        else:
            fail(ValueError, f"{what}: a result of shape {tuple(value.shape)} does not fit a destination of shape "
                         f"{tuple(target_shape)}")
    t = dst.tile
    _pull(t)
    m = None
    if mask is not None and _everywhere(mask):
        mask = None
    if mask is not None:
        m = torch.as_tensor(mask.tensor if isinstance(mask, IndexExpr) else mask, device=value.device).expand(target_shape)
        value = torch.where(m, value, values(t, dst.index))
        if dst is t and not t.complete and t.mask is None and t._alloc.reads == 0 and not _fake(m) \
                and not _fake(t.data):
            # an instruction's new result, computed under a mask: where the mask is off the instruction did
            # not run, so the destination it is assigned into keeps what it held there (assign)
            t.unexecuted = ~m
    if valid is not None and (_fake(valid) or bool(valid.all())):
        valid = None
    if t.place is not None and not _fake(t.data):
        t.place.mark(dst.index, valid, m)
    if valid is not None:  # results computed from elements never written are not written either
        valid = valid.expand(target_shape)
        if t.complete:
            t.complete, t.mask = False, torch.ones(t.shape, dtype=torch.bool, device=t.data.device)
        elif t.mask is None:
            t.mask = torch.zeros(t.shape, dtype=torch.bool, device=t.data.device)
        old = _get(t.mask, dst.index)
        _set(t.mask, dst.index, torch.where(m, valid, old) if m is not None else valid)
    elif not t.complete:
        if dst.index is Ellipsis and mask is None:
            t.complete, t.mask = True, None
        else:
            if t.mask is None:
                t.mask = torch.zeros(t.shape, dtype=torch.bool, device=t.data.device)
            _set(t.mask, dst.index, (_get(t.mask, dst.index) | m) if mask is not None else True)
    if t.place is not None and not _fake(t.data):
        t.place.store(dst.index, value)  # through the memory: its bytes may be another tile's too
    else:
        _set(t.data, dst.index, value)
    if hasattr(t, "_push"):  # a tile viewed as another dtype (_views): what was written is the tile's too
        t._push()


def _pull(t) -> None:
    """A tile viewed as another dtype (``t.view(dtype)``, _views) takes what was written from its tile."""
    if hasattr(t, "_pull"):
        t._pull()


def values(t: "Tile", index) -> torch.Tensor:
    """The values of ``t[index]`` (a placed tile's from its memory, where other tiles may have written)."""
    if t.place is not None and not _fake(t.data):
        return t.place.load(index)
    return _get(t.data, index)


def _get(t: torch.Tensor, index):
    if index is Ellipsis:
        return t
    if isinstance(index, tuple) and index and isinstance(index[0], str):
        if not t.is_contiguous():  # a placed tile's strided view: gather in place, no copy of it all
            return t[torch.unravel_index(index[1], t.shape)]
        return t.reshape(-1)[index[1]]
    return t[index]


_SIGNED = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}


def _set(t: torch.Tensor, index, value) -> None:
    if t.dtype in _SIGNED and index is not Ellipsis:  # PyTorch indexes no writes into unsigned 16/32/64-bit
        value = torch.as_tensor(value, device=t.device).to(t.dtype).view(_SIGNED[t.dtype])
        t = t.view(_SIGNED[t.dtype])
    if index is Ellipsis:
        t.copy_(value) if isinstance(value, torch.Tensor) else t.fill_(value)
    elif isinstance(index, tuple) and index and isinstance(index[0], str):
        t.view(-1)[index[1]] = value
    else:
        t[index] = value


# ---- HBM -------------------------------------------------------------------------------------------

class HbmTensor:
    """A tensor in device memory (HBM): a kernel's argument or an ``nl.ndarray(..., buffer=nl.shared_hbm)``."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(self.tensor.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.tensor.dtype

    def __getitem__(self, index) -> "HbmView":
        return HbmView(self, _as_slices(self.tensor, _index(index)))

    def reshape(self, shape) -> "HbmTensor":
        return HbmTensor(self.tensor.reshape(tuple(shape)))

    def __repr__(self) -> str:
        return f"HbmTensor({list(self.shape)}, {self.dtype})"


class HbmView:
    def __init__(self, base: HbmTensor, index):
        self.base, self.index = base, index

    def __getitem__(self, index) -> "HbmView":
        """A view of this view (``q[b][h]``): basic indices keep it a view of the tensor's memory."""
        return HbmTensor(self.base.tensor[self.index])[index]

    def reshape(self, shape) -> "HbmTensor":
        return HbmTensor(self.base.tensor[self.index].reshape(tuple(shape)))

    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(self.base.tensor[self.index].shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.base.dtype


def hbm_parts(x) -> Tuple[torch.Tensor, Any]:
    if isinstance(x, HbmTensor):
        return x.tensor, Ellipsis
    if isinstance(x, HbmView):
        return x.base.tensor, x.index
    fail(TypeError, f"expected a tensor in HBM (a kernel argument or an nl.ndarray in nl.shared_hbm), "
                    f"got {type(x).__name__}")


class IndexExpr:
    """``nl.arange(n)[:, None]`` and friends: integer index tensors that broadcast like NumPy's."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    def __getitem__(self, index):
        return IndexExpr(self.tensor[index])

    def _bin(self, other, fn):
        if isinstance(other, (Tile, TileView)):  # a dynamic offset: the tile's values, read when it runs
            other = IndexExpr(values(other.tile, other.index).to(torch.int64))
        return IndexExpr(fn(self.tensor, other.tensor if isinstance(other, IndexExpr) else other))

    def __add__(self, o): return self._bin(o, torch.add)
    def __radd__(self, o): return self._bin(o, torch.add)
    def __sub__(self, o): return self._bin(o, torch.sub)
    def __rsub__(self, o): return IndexExpr(o - self.tensor)
    def __mul__(self, o): return self._bin(o, torch.mul)
    def __rmul__(self, o): return self._bin(o, torch.mul)
    def __floordiv__(self, o): return IndexExpr(self.tensor // (o.tensor if isinstance(o, IndexExpr) else o))
    def __mod__(self, o): return IndexExpr(self.tensor % (o.tensor if isinstance(o, IndexExpr) else o))
    def __lt__(self, o): return self._bin(o, torch.lt)
    def __le__(self, o): return self._bin(o, torch.le)
    def __gt__(self, o): return self._bin(o, torch.gt)
    def __ge__(self, o): return self._bin(o, torch.ge)
    def __and__(self, o): return self._bin(torch.as_tensor(o) if isinstance(o, bool) else o, torch.logical_and)
    def __or__(self, o): return self._bin(torch.as_tensor(o) if isinstance(o, bool) else o, torch.logical_or)

    @property
    def shape(self):
        return tuple(self.tensor.shape)


def _as_slices(tensor: torch.Tensor, index):
    """An index of one integer tensor per axis, each a run of consecutive positions along its own axis
    (``t[i * 128 + nl.arange(128)[:, None], nl.arange(n)[None, :]]``) and in range: the same elements as
    basic slices, which read and write in place (no gather). Anything else is returned as given."""
    if not isinstance(index, tuple) or len(index) != tensor.dim() or _fake(tensor):
        return index
    slices = []
    for d, t in enumerate(index):
        if not isinstance(t, torch.Tensor) or t.dtype in (torch.bool, torch.uint8) or t.is_floating_point() \
                or t.dim() != len(index) or _fake(t):
            return index
        if any(size != 1 and axis != d for axis, size in enumerate(t.shape)):
            return index
        n = t.numel()
        flat = t.reshape(n)
        start = int(flat[0])
        if start < 0 or start + n > tensor.shape[d] or not torch.equal(
                flat, torch.arange(start, start + n, dtype=flat.dtype, device=flat.device)):
            return index
        slices.append(slice(start, start + n))
    return tuple(slices)


def _everywhere(mask) -> bool:
    """Whether a mask holds everywhere (then it changes nothing)."""
    m = mask.tensor if isinstance(mask, IndexExpr) else mask
    if isinstance(m, bool):
        return m
    return isinstance(m, torch.Tensor) and not _fake(m) and bool(m.all())


def masked_gather(tensor: torch.Tensor, index, mask) -> torch.Tensor:
    """tensor[index] where only the elements under ``mask`` need be in range (others read as 0)."""
    if mask is not None and _everywhere(mask):
        mask = None
    if mask is None:
        return tensor if index is Ellipsis else tensor[index]
    m = mask.tensor if isinstance(mask, IndexExpr) else mask
    idx, shape = _broadcast_index(tensor, index)
    if _fake(tensor):  # shapes only (a fake kernel): no data-dependent indexing
        return tensor.new_empty(shape)
    m = torch.as_tensor(m, device=tensor.device).expand(shape)
    clamped = tuple(i.clamp(0, tensor.shape[d] - 1) for d, i in enumerate(idx))
    return torch.where(m, tensor[clamped], torch.zeros((), dtype=tensor.dtype, device=tensor.device))


def masked_scatter(tensor: torch.Tensor, index, mask, data: torch.Tensor) -> None:
    if _fake(tensor):  # shapes only: what a store writes does not change any shape
        return
    if _everywhere(mask):
        target = tensor if index is Ellipsis else tensor[index]
        if data.dim() == target.dim():  # a slice past the tensor's end: the part of the value outside is not written
            data = data[tuple(slice(0, n) if d > n else slice(None) for d, n in zip(data.shape, target.shape))]
        if index is Ellipsis or (isinstance(index, tuple) and all(isinstance(i, slice) for i in index)):
            target.copy_(data.expand(target.shape))
        else:
            _set(tensor, index, data.expand(target.shape))
        return
    m = mask.tensor if isinstance(mask, IndexExpr) else mask
    idx, shape = _broadcast_index(tensor, index)
    # A slice past the tensor's end: the part of the value (and mask) outside is masked off.
    if data.dim() == len(shape):
        data = data[tuple(slice(0, n) if d > n else slice(None) for d, n in zip(data.shape, shape))]
    m = torch.as_tensor(m, device=tensor.device)
    if m.dim() == len(shape):
        m = m[tuple(slice(0, n) if d > n else slice(None) for d, n in zip(m.shape, shape))]
    m = m.expand(shape)
    data = data.expand(shape)
    tensor[tuple(i[m] for i in idx)] = data[m]


def _broadcast_index(tensor: torch.Tensor, index):
    """Integer index tensors, one per axis of ``tensor``, broadcast together (slices made aranges)."""
    index = (index,) if not isinstance(index, tuple) else index
    if index == (Ellipsis,) or index is Ellipsis:
        index = ()
    parts = []
    n_slices = sum(isinstance(i, slice) for i in index) + max(0, tensor.dim() - len(index))
    k = 0
    for d in range(tensor.dim()):
        i = index[d] if d < len(index) else slice(None)
        if isinstance(i, slice):
            r = torch.arange(*i.indices(tensor.shape[d]), device=tensor.device)
            view = [1] * n_slices
            view[k] = -1
            parts.append(r.reshape(view))
            k += 1
        else:
            parts.append(torch.as_tensor(i, device=tensor.device))
    shape = torch.broadcast_shapes(*(p.shape for p in parts))
    return tuple(p.expand(shape) for p in parts), shape
