"""TensorE's instructions, ``nisa.nc_matmul`` and ``nisa.nc_transpose`` (``nl.matmul`` and
``nl.transpose`` are built from them)."""

from __future__ import annotations

import torch

from . import _cost
from . import _hardware as hw
from ._calling import _deliver, _split_dst, _take
from ._core import (_get, both, defined, fail, instruction, psum, read, tensor_engine_writes, touch, values,
                    write, written_anywhere)


@instruction
def nc_matmul(*args, **kwargs):
    """stationary.T @ moving on TensorE: stationary [K, M] (K <= 128 partitions, M <= 128), moving [K, N]
    (N <= 512), the result [M, N] in PSUM as float32. Into a PSUM ``dst`` it accumulates: the first
    matmul into a region writes it, later ones add to it."""
    dst, rest = _split_dst(args, kwargs, [("stationary", "tile"), ("moving", "tile")], "nc_matmul")
    stationary, moving = _take(rest, kwargs, ["stationary", "moving"])
    s, m = read(stationary, "nc_matmul (stationary)"), read(moving, "nc_matmul (moving)")
    ds, dmv = defined(stationary), defined(moving)
    if _double_row(kwargs.pop("perf_mode", None)):
        # FP8 double performance (NeuronCore-v3 on): the contraction spans the partitions and the first free
        # axis, which is 2: [K, 2, M] and [K, 2, N] contract over K x 2 (AWS's nki.isa.nc_matmul, Layout).
        if hw.current().name == "trn1":
            fail(ValueError, "nc_matmul: perf_mode double_row needs NeuronCore-v3 or later (trn2, trn3), the "
                             "target is trn1")
        if s.dim() != 3 or m.dim() != 3 or s.shape[1] != 2 or m.shape[1] != 2:
            fail(ValueError, f"nc_matmul: perf_mode double_row takes [K, 2, M] and [K, 2, N] tiles, got "
                             f"{tuple(s.shape)} and {tuple(m.shape)}")
        if s.element_size() != 1 or m.element_size() != 1:
            fail(TypeError, f"nc_matmul: perf_mode double_row takes float8 tiles, got {s.dtype} and {m.dtype}")
        s, m = s.reshape(-1, s.shape[2]), m.reshape(-1, m.shape[2])
        ds = None if ds is None else ds.reshape(s.shape)
        dmv = None if dmv is None else dmv.reshape(m.shape)
    if s.dim() != 2 or m.dim() != 2:
        fail(ValueError, f"nc_matmul takes 2-D tiles, got {tuple(s.shape)} and {tuple(m.shape)}")
    k, mm = s.shape
    k2, n = m.shape
    if k != k2:
        fail(ValueError, f"nc_matmul: the contraction (partition) axes differ: stationary {tuple(s.shape)}, "
                         f"moving {tuple(m.shape)}")
    if mm > hw.GEMM_STATIONARY_FMAX:
        fail(ValueError, f"nc_matmul: the stationary operand's free axis is {mm}, at most "
                         f"{hw.GEMM_STATIONARY_FMAX} (nl.tile_size.gemm_stationary_fmax)")
    if n > hw.GEMM_MOVING_FMAX:
        fail(ValueError, f"nc_matmul: the moving operand's free axis is {n}, at most {hw.GEMM_MOVING_FMAX} "
                         f"(nl.tile_size.gemm_moving_fmax)")
    for t, which in ((s, "stationary"), (m, "moving")):
        if t.dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2):
            fail(TypeError, f"nc_matmul: the {which} operand is {t.dtype}; TensorE takes float32, bfloat16, "
                            f"float16 or float8 inputs")
    if s.dtype.is_floating_point and m.dtype.is_floating_point and (s.element_size() == 4) != (m.element_size() == 4):
        fail(TypeError, f"nc_matmul: float32 and {s.dtype if m.element_size() == 4 else m.dtype} operands mixed; "
                        f"cast one first")
    valid = both((mm, n), None if ds is None else ds.all(0)[:, None], None if dmv is None else dmv.all(0)[None, :])
    rate = "fp32" if s.element_size() == 4 else ("fp8" if s.element_size() == 1 else "16bit")
    _cost.charge_tensor("nc_matmul", n, rate)
    st, mv = (s, m) if s.dtype == m.dtype == torch.float32 else (s.float(), m.float())
    transposed = bool(kwargs.pop("is_transpose", False))
    if dst is not None and dst.buffer is psum and dst.tile.dtype not in (torch.float32, torch.int32):
        tensor_engine_writes(dst, _Made(transposed, s.dtype),
                             accumulating=bool(kwargs.get("accumulate")) or written_anywhere(dst))
    fast = (dst is not None and valid is None and dst.index is Ellipsis and dst.buffer is psum
            and dst.tile.dtype == torch.float32 and dst.tile.place is None and tuple(dst.tile.shape) == (mm, n)
            and kwargs.get("accumulate") is None)
    if fast:  # straight into the PSUM tile: the first matmul writes it, the next ones accumulate in place
        touch(dst.tile)
        if dst.tile.complete:
            dst.tile.data.addmm_(st.t(), mv)
        elif dst.tile.mask is None:
            torch.mm(st.t(), mv, out=dst.tile.data)
            dst.tile.complete = True
        else:
            fast = False
        if fast:
            return dst
    result = st.t() @ mv
    if dst is None:
        out = _deliver(None, result, "nc_matmul", torch.float32, psum, valid=valid)
        out._tensor_engine = (transposed, s.dtype)
        return out
    if dst.buffer is not psum:
        fail(ValueError, "nc_matmul writes its result to a PSUM tile")
    current = values(dst.tile, dst.index)
    if current.shape != result.shape:
        fail(ValueError, f"nc_matmul: a result of shape {tuple(result.shape)} into a destination of shape "
                         f"{tuple(current.shape)}")
    accumulate = kwargs.pop("accumulate", None)
    if accumulate is None:
        accumulate = written_anywhere(dst)
    if accumulate:
        if dst.index is Ellipsis and dst.tile.complete and valid is None and dst.tile.place is None:
            current.add_(result)  # in place, in PSUM
        else:
            write(dst, current + result, "nc_matmul", valid=both(tuple(result.shape), defined(dst), valid))
        return dst
    write(dst, result, "nc_matmul", valid=valid)
    return dst


@instruction
def nc_transpose(*args, **kwargs):
    """The transpose of a [P, F] tile (P, F <= 128) through TensorE, into PSUM."""
    dst, rest = _split_dst(args, kwargs, [("data", "tile")], "nc_transpose")
    (data,) = _take(rest, kwargs, ["data"])
    x = read(data, "nc_transpose")
    if x.dim() != 2 or x.shape[1] > hw.PMAX:
        fail(ValueError, f"nc_transpose takes a 2-D tile of at most {hw.PMAX}x{hw.PMAX}, got {tuple(x.shape)}")
    _cost.charge_tensor("nc_transpose", x.shape[0], "fp32" if x.element_size() == 4 else "16bit")
    d = defined(data)
    if dst is not None and dst.buffer is psum:
        tensor_engine_writes(dst, _Made(True, x.dtype))
    out = _deliver(dst, x.t().float(), "nc_transpose", torch.float32, psum, valid=None if d is None else d.t())
    if dst is None:
        out._tensor_engine = (True, x.dtype)
    return out


class _Made:
    """What TensorE is about to write into a ``dst`` given to it (see _core.tensor_engine_writes)."""

    def __init__(self, transposed: bool, source: torch.dtype):
        self._tensor_engine = (transposed, source)


def _double_row(perf_mode) -> bool:
    """Whether ``perf_mode`` is nc_matmul's double_row (``"double_row"``, ``"double_row_gen3"`` or the enum)."""
    if perf_mode is None:
        return False
    name = getattr(perf_mode, "name", perf_mode)
    if isinstance(name, str):
        if name in ("double_row", "double_row_gen3"):
            return True
        if name == "none":
            return False
    if isinstance(perf_mode, int) and not isinstance(perf_mode, bool):
        return perf_mode == 1
    fail(ValueError, f"nc_matmul: perf_mode is none, double_row or double_row_gen3, got {perf_mode!r}")
