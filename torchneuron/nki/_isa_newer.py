"""The newer NKI's instructions (aws-neuron-sdk 81ce03a, ``nki/api/nki/isa``) not in :mod:`._isa_more`: the
engine sequencers' virtual registers (``register_alloc``/``move``/``load``/``store``, ``VirtualRegister``),
``nc_n_gather`` (GpSimd's per-partition gather), ``dma_compute`` (a DMA that adds its sources),
``activate2`` (ScalarE's two tensor-scalar stages before the activation, NeuronCore-v4), ``NkiInstruction``
(an instruction's result, with ``depends_on``) and ``nl.loop_reduce``. Each computes what
AWS's API reference says it computes and is charged to the engine it names; they add their names to nisa.
"""

from __future__ import annotations

import abc
import ast
import linecache
import math
import sys

import torch

from . import _cost
from . import _hardware as hw
from . import _language_more as _lm
from . import isa
from . import language as nl
from ._calling import _deliver, _required
from ._run import _inside
from ._core import (HbmTensor, HbmView, Tile, TileView, both, defined, fail, hbm_parts, instruction, masked_gather,
                    masked_scatter, read, require_defined, run, write)
from ._isa_more import _accumulate, _per_partition, _reduce_fn, _vector
from ._views import NKIObject

__all__ = ["VirtualRegister", "register_alloc", "register_move", "register_load", "register_store", "nc_n_gather",
           "dma_compute", "activate2", "NkiInstruction"]

_TILE = (Tile, TileView)
_HBM = (HbmTensor, HbmView)


# ---- virtual registers -------------------------------------------------------------------------------------

class VirtualRegister(NKIObject):
    """A register of an engine sequencer (a 32-bit integer), made by ``nisa.register_alloc``. It is a loop's
    trip count (``nl.dynamic_range(reg)``, ``range(reg)``), a ``while reg:`` condition, an ``int``."""

    def __init__(self, state=None, frozen=False):
        self.value = None if state is None else _int32(state, "nisa.register_alloc")
        self.frozen = frozen

    def _get(self) -> int:
        if self.value is None:
            fail(RuntimeError, "a virtual register read before anything was moved or loaded into it")
        return self.value

    def __int__(self) -> int:
        return self._get()

    __index__ = __int__

    def __bool__(self) -> bool:
        return self._get() != 0

    def __repr__(self) -> str:
        return f"VirtualRegister({self.value})"


def _int32(v, what: str) -> int:
    if isinstance(v, VirtualRegister):
        return v._get()
    if isinstance(v, bool) or not isinstance(v, int):
        fail(TypeError, f"{what}: a register holds an int (or takes another register), got {type(v).__name__}")
    if not -2**31 <= v < 2**32:
        fail(ValueError, f"{what}: {v} does not fit a 32-bit register")
    return int(v)


def _register(r, what: str) -> VirtualRegister:
    if not isinstance(r, VirtualRegister):
        fail(TypeError, f"{what}: expected a register from nisa.register_alloc, got {type(r).__name__}")
    return r


def register_alloc(x=None) -> VirtualRegister:
    """A new register, holding ``x`` (an int) or nothing yet."""
    return VirtualRegister(x)


def register_move(dst, src) -> None:
    """``dst`` takes an int or another register's value."""
    _register(dst, "nisa.register_move").value = _int32(src, "nisa.register_move")


def _one(x, what: str) -> torch.Tensor:
    if isinstance(x, _TILE):
        require_defined(x, what)
        v = read(x, what)
    elif isinstance(x, _HBM):
        tensor, index = hbm_parts(x)
        v = masked_gather(tensor, index, None)
    else:
        fail(TypeError, f"{what}: expected a tile or a tensor in HBM of one element, got {type(x).__name__}")
    if v.numel() != 1:
        fail(ValueError, f"{what}: a register loads or stores one element, got a tensor of shape {tuple(v.shape)}")
    return v


def register_load(dst, src) -> None:
    """``dst`` takes the one (32-bit) value of ``src``, a [1] or [1, 1] tensor in SBUF or HBM, read when it runs."""
    v = _one(src, "nisa.register_load")
    if v.element_size() > 4:
        fail(TypeError, f"nisa.register_load: a register holds 32 bits, got {v.dtype}")
    _register(dst, "nisa.register_load").value = int(v.reshape(-1)[0].item())


def register_store(dst, src) -> None:
    """The register's value written into ``dst``, a [1] or [1, 1] tensor in SBUF or HBM."""
    value = _register(src, "nisa.register_store")._get()
    if isinstance(dst, _TILE):
        shape = tuple(read(dst, "nisa.register_store").shape)
        if math.prod(shape) != 1:
            fail(ValueError, f"nisa.register_store: a register stores one element, got a destination of shape {shape}")
        write(dst, torch.tensor(value, device=run().device), "nisa.register_store")
    elif isinstance(dst, _HBM):
        tensor, index = hbm_parts(dst)
        target = tensor if index is Ellipsis else tensor[index]
        if target.numel() != 1:
            fail(ValueError, f"nisa.register_store: a register stores one element, got a destination of shape "
                             f"{tuple(target.shape)}")
        masked_scatter(tensor, index, True, torch.tensor(value, device=tensor.device).to(tensor.dtype))
    else:
        fail(TypeError, f"nisa.register_store: dst is a tile or a tensor in HBM, got {type(dst).__name__}")


# ---- GpSimd: a gather within each partition -------------------------------------------------------------------

@instruction
def nc_n_gather(dst=None, data=None, indices=None, **kwargs):
    """``dst[p, ...] = data[p].flatten()[indices[p, ...]]``: within each partition, the elements of ``data`` (its
    free axes flattened) at ``indices`` (uint32), shaped as ``indices`` (GpSimd)."""
    _required("nc_n_gather", data=data, indices=indices)
    x, idx = read(data, "nc_n_gather"), read(indices, "nc_n_gather (indices)")
    if x.shape[0] != idx.shape[0]:
        fail(ValueError, f"nc_n_gather: data has {x.shape[0]} partitions, indices {idx.shape[0]}")
    if idx.dtype != torch.uint32:
        fail(TypeError, f"nc_n_gather: indices are uint32, got {idx.dtype}")
    require_defined(indices, "nc_n_gather (indices)")
    flat, where = _per_partition(x), _per_partition(idx).to(torch.int64)
    n = flat.shape[1]
    if bool(((where < 0) | (where >= n)).any()):
        bad = int(where[(where < 0) | (where >= n)][0])
        fail(IndexError, f"nc_n_gather: index {bad} is out of range for {n} elements per partition")
    out = torch.gather(flat, 1, where).reshape(idx.shape)
    d = defined(data)
    valid = None if d is None else torch.gather(_per_partition(d), 1, where).reshape(idx.shape)
    _vector("nc_n_gather", idx.shape, 1, x.dtype, "GpSimd")
    if dst is not None and isinstance(dst, _TILE) and dst.dtype != x.dtype:
        fail(TypeError, f"nc_n_gather: dst is {dst.dtype}, data {x.dtype}; they are the same dtype")
    return _deliver(dst, out, "nc_n_gather", x.dtype, valid=valid)


# ---- a DMA that computes -----------------------------------------------------------------------------------

def _read_any(x, what: str) -> torch.Tensor:
    if isinstance(x, _TILE):
        return read(x, what)
    if isinstance(x, _HBM):
        tensor, index = hbm_parts(x)
        return masked_gather(tensor, index, None)
    fail(TypeError, f"{what}: expected a tile or a tensor in HBM, got {type(x).__name__}")


@instruction
def dma_compute(dst=None, srcs=None, reduce_op=None, scales=None, unique_indices=True, oob_mode=None, **kwargs):
    """``dst = srcs[0] * scales[0] + srcs[1] * scales[1] + ...`` in float32 on a DMA queue, cast to dst's dtype.
    As AWS documents, ``reduce_op`` is nl.add and every scale 1.0; sources and dst in SBUF or HBM, of the same
    number of elements (a source indexed with a tile of indices reads and writes through them: the
    read-modify-write scatter and gather)."""
    _required("dma_compute", dst=dst, srcs=srcs, reduce_op=reduce_op)
    srcs = list(srcs)
    if not 1 <= len(srcs) <= 16:
        fail(ValueError, f"dma_compute: 1 to 16 sources, got {len(srcs)}")
    if (_lm.numpy_op(reduce_op) or reduce_op) is not nl.add:
        fail(NotImplementedError, f"dma_compute: reduce_op is nl.add (the one AWS supports), got "
                                  f"{getattr(reduce_op, '__name__', reduce_op)!r}")
    scales = [1.0] * len(srcs) if scales is None else list(scales)
    if len(scales) != len(srcs) or any(float(s) != 1.0 for s in scales):
        fail(ValueError, f"dma_compute: one scale per source, each 1.0 (as AWS supports), got {scales}")
    if not unique_indices:
        fail(NotImplementedError, "dma_compute: unique_indices=False (repeated indices) is not supported, as on AWS's")
    target = _read_any(dst, "dma_compute (dst)") if isinstance(dst, _HBM) else None
    shape = tuple(target.shape) if target is not None else tuple(read(dst, "dma_compute (dst)").shape)
    total, nbytes, valid = None, 0, None
    for i, s in enumerate(srcs):
        v = _read_any(s, f"dma_compute (srcs[{i}])")
        if v.numel() != math.prod(shape):
            fail(ValueError, f"dma_compute: srcs[{i}] has {v.numel()} elements, dst {math.prod(shape)}")
        nbytes += v.numel() * v.element_size()
        v = v.float().reshape(shape)
        total = v if total is None else total + v
        if isinstance(s, _TILE):
            d = defined(s)
            valid = both(shape, valid, None if d is None else d.reshape(shape))
    _cost.charge_dma("dma_compute", nbytes + total.numel() * (target.element_size() if target is not None else
                                                              read(dst, "dma_compute").element_size()))
    if isinstance(dst, _TILE):
        write(dst, total, "dma_compute", valid=valid)
        return dst
    if valid is not None and not bool(valid.all()):
        fail(RuntimeError, f"dma_compute: a source holds {int((~valid).sum())} elements never written, which "
                           f"would be stored to HBM (uninitialized tile)")
    tensor, index = hbm_parts(dst)
    masked_scatter(tensor, index, True, total.to(tensor.dtype))
    return dst


# ---- ScalarE: tensor-scalar stages, the activation, a reduction (NeuronCore-v4) ---------------------------------

_STAGES = {None, nl.bypass}


def _stage(y: torch.Tensor, op, imm, reverse: bool, what: str) -> torch.Tensor:
    op = _lm.numpy_op(op) or op
    if op in _STAGES:
        return y
    if op not in (nl.multiply, nl.add, nl.subtract):
        fail(ValueError, f"activate2: {what} is nl.multiply, nl.add, nl.subtract or nl.bypass, got "
                         f"{getattr(op, '__name__', op)!r}")
    v = read(imm, f"activate2 ({what} operand)")
    v = _per_partition_scalar(v, y) if isinstance(v, torch.Tensor) else float(v)
    fn = {nl.multiply: torch.mul, nl.add: torch.add, nl.subtract: torch.sub}[op]
    return fn(v, y) if reverse else fn(y, v)


def _per_partition_scalar(v: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if v.numel() == 1:
        return v.float().reshape(())
    if v.shape[0] != y.shape[0] or v.numel() != y.shape[0]:
        fail(ValueError, f"activate2: an operand is a scalar or [P, 1], got shape {tuple(v.shape)} for data "
                         f"{tuple(y.shape)}")
    return v.float().reshape((y.shape[0],) + (1,) * (y.dim() - 1))


@instruction
def activate2(dst=None, op=None, data=None, imm0=None, imm1=None, op0=None, op1=None, relu_param=0.0,
              reverse0=False, reverse1=False, reduce_op=None, reduce_res=None, reduce_cmd=None, **kwargs):
    """``op((data op0 imm0) op1 imm1)`` on ScalarE in float32 (``reverse0``: ``imm0 op0 data``; nl.bypass skips a
    stage), cast to ``dst``'s dtype; with ``reduce_op`` also reduced along each partition's free axes into
    ``reduce_res`` (or the accumulator ``reduce_cmd`` drives). NeuronCore-v4 (trn3) only, as documented."""
    _required("activate2", dst=dst, op=op, data=data)
    if hw.current().name in ("trn1", "trn2"):
        fail(ValueError, f"activate2 is available on NeuronCore-v4 (trn3) and newer; the target is {hw.current().name}")
    if (op1 not in _STAGES and op0 in _STAGES) or (reverse0 and op0 in _STAGES) or (reverse1 and op1 in _STAGES):
        fail(ValueError, "activate2: op1 needs op0, reverse0 needs op0 and reverse1 needs op1")
    pair = tuple((_lm.numpy_op(o) or o) if o is not None else nl.bypass for o in (op0, op1))
    allowed = {(nl.multiply, nl.add), (nl.multiply, nl.subtract), (nl.multiply, nl.bypass), (nl.add, nl.bypass),
               (nl.subtract, nl.bypass), (nl.bypass, nl.bypass)}
    if pair not in allowed:
        fail(ValueError, f"activate2: (op0, op1) is one of (multiply, add), (multiply, subtract), (multiply, bypass), "
                         f"(add, bypass), (subtract, bypass), (bypass, bypass); got "
                         f"({pair[0].__name__}, {pair[1].__name__})")
    x = read(data, "activate2").float()
    y = _stage(_stage(x, op0, imm0, reverse0, "op0"), op1, imm1, reverse1, "op1")
    f = _lm.numpy_op(op) or op
    if f is nl.prelu:
        p = read(relu_param, "activate2 (relu_param)")
        p = _per_partition_scalar(p, y) if isinstance(p, torch.Tensor) else float(p)
        y = torch.where(y >= 0, y, y * p)
    else:
        y = isa._torch_op(op, "activate2")(y)
    _cost.charge_scalar("activate2", x.shape)
    valid = both(tuple(x.shape), defined(data), defined(imm0), defined(imm1))
    out = _deliver(dst, y, "activate2", valid=valid)
    if reduce_res is not None or (reduce_cmd is not None and int(reduce_cmd) != 0):
        yy = _per_partition(read(out, "activate2").float())
        fn = _reduce_fn(reduce_op or nl.add, "activate2")
        if reduce_cmd is not None and int(reduce_cmd) != 0:
            _accumulate(reduce_res, yy, reduce_cmd, fn, "activate2")
        else:
            write(reduce_res, fn(yy, 1, keepdim=True), "activate2")
        _vector("activate2_reduce", yy.shape, 1, torch.float32)
    return out


# ---- instruction handles ----------------------------------------------------------------------------------

class NkiInstruction(NKIObject, metaclass=abc.ABCMeta):
    """``nisa.NkiInstruction``: what an instruction returns, for ``.depends_on(*producers)`` (a scheduling
    edge). Here an instruction returns its destination (a tile or an HBM tensor), which is one, and
    instructions run in program order, so every dependency on an earlier one holds: ``depends_on`` checks its
    arguments are instructions' results and returns ``self``."""

    def __init__(self, handle=None):
        self.handle = handle

    def depends_on(self, *producers):
        return _depends_on(self, *producers)


def _depends_on(self, *producers):
    for p in producers:
        if not isinstance(p, NkiInstruction):
            fail(TypeError, f"depends_on: producers are instructions' results, got {type(p).__name__}")
    return self


for _cls in (Tile, TileView, HbmTensor, HbmView):
    NkiInstruction.register(_cls)
    _cls.depends_on = _depends_on
del _cls


# ---- nl.loop_reduce ------------------------------------------------------------------------------------

_ASSIGNS: dict = {}  # file -> {line: the name a loop_reduce call on that line is assigned to, or _INTO}
_INTO = object()  # assigned into a tile: acc[...] = nl.loop_reduce(...)


def _assigned_name(filename: str, lineno: int):
    table = _ASSIGNS.get(filename)
    if table is None:
        table = _ASSIGNS[filename] = {}
        try:
            tree = ast.parse("".join(linecache.getlines(filename)))
        except SyntaxError:
            tree = None
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                    getattr(node.value.func, "attr", getattr(node.value.func, "id", None)) == "loop_reduce":
                target = node.targets[0] if len(node.targets) == 1 else None
                name = target.id if isinstance(target, ast.Name) else _INTO if isinstance(target, ast.Subscript) else None
                for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                    table[line] = name
    return table.get(lineno)


def loop_reduce(x, op, loop_indices, *, dtype=None, mask=None, **kwargs):
    """``b = nl.loop_reduce(a, op, loop_indices=[k])`` is ``b = nisa.tensor_tensor(data1=b, data2=a, op=op)``: as
    AWS documents, the destination tile is also ``op``'s other input. The destination is the name the call is
    assigned to on the kernel's line (its value before the call), or, for ``acc[...] = nl.loop_reduce(a, ...)``,
    the tile the result is assigned into (``_language_more.loop_reduce_into``)."""
    frame = sys._getframe(1)
    while frame is not None and _inside(frame.f_code.co_filename):
        frame = frame.f_back
    name = _assigned_name(frame.f_code.co_filename, frame.f_lineno) if frame is not None else None
    if name is _INTO:  # acc[...] = nl.loop_reduce(a, ...): the accumulator is what the result is assigned into
        return _lm.loop_reduce_into(x, op, loop_indices, dtype=dtype, mask=mask, **kwargs)
    if name is None:
        fail(NotImplementedError, "nl.loop_reduce: its destination is the tile the call is assigned to "
                                  "(b = nl.loop_reduce(a, ...) or acc[...] = nl.loop_reduce(a, ...)); accumulate "
                                  "explicitly otherwise (b = nl.add(b, a))")
    acc = frame.f_locals.get(name)
    if not isinstance(acc, _TILE):
        fail(TypeError, f"nl.loop_reduce: the destination {name!r} is a tile made before the loop (nl.zeros(...)), "
                        f"got {type(acc).__name__}")
    return isa.tensor_tensor(data1=acc, data2=x, op=op, dtype=dtype, mask=mask)


# ---- into nisa ----------------------------------------------------------------------------------------

for _name in __all__:
    setattr(isa, _name, globals()[_name])
isa.__all__ += [n for n in __all__ if n not in isa.__all__]
del _name
nl.loop_reduce = loop_reduce
nl.__all__ += ["loop_reduce"]
