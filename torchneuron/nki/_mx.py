"""MX (microscaling) quantization and matmul of NeuronCore-v4: ``nisa.quantize_mx``, ``nisa.nc_matmul_mx`` and the
4-packed fp8 types ``nl.float8_e5m2_x4`` / ``nl.float8_e4m3fn_x4`` (aws-neuron-sdk 81ce03a: ``nki/api/nki/isa``
and ``nki/guides/architecture/trainium3_arch.rst``, "Quad-MXFP8/MXFP4 Matmul Performance").

An x4 element is a 32-bit word of four fp8 values (the first in the lowest byte), held as int32; a tile made
with an x4 dtype remembers which fp8 it packs. A scaling group is 32 values: 8 partitions x the 4 values of one
x4 element, sharing one 8-bit exponent scale (float8_e8m0fnu or uint8, value 2^(s - 127)). The scales of the
groups of partitions 8g..8g+7 sit on partition (g // 4) * 32 + g % 4 of the scale tile (four partitions per
32-partition quadrant), column for column with the x4 data.

``nl.float4_e2m1fn_x4`` (MXFP4, nc_matmul_mx's input only, as AWS's quantize_mx makes MXFP8) is a 16-bit word of
four fp4 (E2M1) values, the first in the lowest nibble, held as int16.
"""

from __future__ import annotations

import torch

from . import _cost
from . import _dtypes
from . import _hardware as hw
from . import isa
from . import language as nl
from ._calling import _required
from ._core import Tile, TileView, both, defined, fail, instruction, psum, read, write, written_anywhere
from ._isa_more import _vector

__all__ = ["quantize_mx", "nc_matmul_mx"]

_TILE = (Tile, TileView)
#: The largest unbiased exponent of each fp8 type (AWS's quantize_mx: 8 for float8_e4m3fn, 15 for float8_e5m2).
_EMAX = {torch.float8_e4m3fn: 8, torch.float8_e5m2: 15}

float8_e5m2_x4 = _dtypes.make("float8_e5m2_x4", torch.int32)
float8_e4m3fn_x4 = _dtypes.make("float8_e4m3fn_x4", torch.int32)
float4_e2m1fn_x4 = _dtypes.make("float4_e2m1fn_x4", torch.int16)
#: float4_e2m1fn's magnitudes by their 3 low bits (the OCP MX spec's E2M1: no infinities, no NaN).
_FP4 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _v4(what: str) -> None:
    if hw.current().name in ("trn1", "trn2"):
        fail(ValueError, f"{what} is available on NeuronCore-v4 (trn3) and newer; the target is {hw.current().name}")


def _packed(x, what: str) -> torch.dtype:
    p = getattr(x.tile, "packed", None) if isinstance(x, _TILE) else None
    if p is None:
        fail(TypeError, f"{what} is a tile of an x4 type (nl.float8_e5m2_x4 or nl.float8_e4m3fn_x4, made with "
                        f"nl.ndarray), got {getattr(x, 'dtype', type(x).__name__)}")
    return p


def _scale_rows(partitions: int, device) -> torch.Tensor:
    """The scale tile's partition for each group of 8 data partitions: (g // 4) * 32 + g % 4."""
    g = torch.arange(partitions // 8, device=device)
    return (g // 4) * 32 + g % 4


def _scale_bits(x, what: str) -> torch.Tensor:
    v = read(x, what)
    if v.dtype == torch.uint8:
        return v
    if v.dtype == getattr(torch, "float8_e8m0fnu", None):
        return v.view(torch.uint8)
    fail(TypeError, f"{what} is float8_e8m0fnu or uint8, got {v.dtype}")


@instruction
def quantize_mx(dst=None, src=None, dst_scale=None, **kwargs):
    """float16/bfloat16 ``src`` [P, F] quantized to MXFP8: per group of 8 partitions x 4 values the scale
    X = 2^(floor(log2(max |v|)) - (Emax - 1)) (2^-127 for a group of zeros), ``dst`` [P, F/4] (x4) the values
    divided by X in its fp8 type, ``dst_scale`` the biased exponents (VectorE)."""
    _required("quantize_mx", dst=dst, src=src, dst_scale=dst_scale)
    _v4("quantize_mx")
    fp8 = _packed(dst, "quantize_mx: dst")
    if fp8 not in _EMAX:
        fail(TypeError, "quantize_mx: dst is float8_e5m2_x4 or float8_e4m3fn_x4 (MXFP8), got float4_e2m1fn_x4")
    x = read(src, "quantize_mx (src)")
    if x.dtype not in (torch.float16, torch.bfloat16):
        fail(TypeError, f"quantize_mx: src is float16 or bfloat16, got {x.dtype}")
    if x.dim() != 2 or x.shape[0] % 32 or x.shape[1] % 4:
        fail(ValueError, f"quantize_mx: src is [P, F] with P a multiple of 32 and F of 4, got {tuple(x.shape)}")
    p, f = x.shape
    if tuple(read(dst, "quantize_mx").shape) != (p, f // 4):
        fail(ValueError, f"quantize_mx: dst is [{p}, {f // 4}] (x4 elements), got {tuple(dst.shape)}")
    v = x.float()
    amax = v.abs().reshape(p // 8, 8, f // 4, 4).amax(dim=(1, 3))          # [P/8, F/4]
    _, e = torch.frexp(amax)                                                  # amax = m * 2^e, m in [0.5, 1)
    exp = torch.where(amax > 0, (e - 1) - (_EMAX[fp8] - 1), torch.full_like(e, -127))
    biased = (exp + 127).clamp(0, 254)
    scale = torch.exp2((biased - 127).float())
    q = (v / scale.repeat_interleave(8, 0).repeat_interleave(4, 1)).to(fp8)  # |q| < 2^Emax: no saturation
    d = defined(src)
    valid = None if d is None else d.reshape(p, f // 4, 4).all(-1)
    write(dst, q.contiguous().view(torch.uint8).view(torch.int32), "quantize_mx", valid=valid)
    rows = _scale_rows(p, x.device)
    sp, sf = tuple(dst_scale.shape)[:2] if isinstance(dst_scale, _TILE) else (0, 0)
    if not isinstance(dst_scale, _TILE) or len(dst_scale.shape) != 2 or sp <= int(rows.max()) or sf < f // 4:
        fail(ValueError, f"quantize_mx: dst_scale is a [P', F'] tile with partitions {rows.tolist()} and at least "
                         f"{f // 4} columns, got {getattr(dst_scale, 'shape', type(dst_scale).__name__)}")
    bits = biased.to(torch.uint8)
    if dst_scale.dtype != torch.uint8:
        if dst_scale.dtype != getattr(torch, "float8_e8m0fnu", None):
            fail(TypeError, f"quantize_mx: dst_scale is float8_e8m0fnu or uint8, got {dst_scale.dtype}")
        bits = bits.view(dst_scale.dtype)
    cols = torch.arange(f // 4, device=x.device)
    write(dst_scale[rows[:, None], cols[None, :]], bits, "quantize_mx (dst_scale)")
    _vector("quantize_mx", x.shape, 1, x.dtype)
    return dst


def _dequantized(data, scale, what: str) -> torch.Tensor:
    """An x4 tile [K, M] as float32 values [K, M, 4], each times its group's scale."""
    packed = _packed(data, f"nc_matmul_mx: {what}")
    words = read(data, f"nc_matmul_mx ({what})")
    k, m = words.shape
    b = words.contiguous().view(torch.uint8)
    if packed == "float4_e2m1fn":  # each byte two values, the low nibble first
        nibbles = torch.stack([b & 0xF, b >> 4], dim=-1).reshape(k, m, 4).to(torch.int64)
        mag = torch.tensor(_FP4, device=b.device)[nibbles & 7]
        values = torch.where(nibbles >= 8, -mag, mag)
    else:
        values = b.view(packed).float().reshape(k, m, 4)
    s = _scale_bits(scale, f"nc_matmul_mx: {what}_scale")
    rows = _scale_rows(k, words.device)
    if s.dim() != 2 or s.shape[0] <= int(rows.max()) or s.shape[1] < m:
        fail(ValueError, f"nc_matmul_mx: {what}_scale needs partitions {rows.tolist()} and {m} columns, got "
                         f"{tuple(s.shape)}")
    factor = torch.exp2(s[rows, :m].float() - 127).repeat_interleave(8, 0)  # [K, M]
    return values * factor[:, :, None]


@instruction
def nc_matmul_mx(dst=None, stationary=None, moving=None, stationary_scale=None, moving_scale=None,
                 tile_position=None, tile_size=None, accumulate=None, **kwargs):
    """MXFP8/MXFP4 stationary [K, M] and moving [K, N] (x4 elements) dequantized with their scales and multiplied on
    TensorE, contracting over K and the 4 values of each x4 element: ``dst`` [M, N] in PSUM (float32); the
    first matmul into a region writes it, later ones add (``accumulate``, as nc_matmul)."""
    _required("nc_matmul_mx", dst=dst, stationary=stationary, moving=moving, stationary_scale=stationary_scale,
              moving_scale=moving_scale)
    _v4("nc_matmul_mx")
    s, mv = read(stationary, "nc_matmul_mx (stationary)"), read(moving, "nc_matmul_mx (moving)")
    if s.dim() != 2 or mv.dim() != 2 or s.shape[0] != mv.shape[0]:
        fail(ValueError, f"nc_matmul_mx: stationary [K, M] and moving [K, N] with the same K, got {tuple(s.shape)} "
                         f"and {tuple(mv.shape)}")
    k, m = s.shape
    n = mv.shape[1]
    if k % 32 or k > hw.PMAX:
        fail(ValueError, f"nc_matmul_mx: the partitions (K = {k}) are a multiple of 32, at most {hw.PMAX}")
    if m % 2 or m > hw.GEMM_STATIONARY_FMAX:
        fail(ValueError, f"nc_matmul_mx: the stationary free size ({m}) is even and at most {hw.GEMM_STATIONARY_FMAX}")
    if n > 4096:
        fail(ValueError, f"nc_matmul_mx: the moving free size ({n}) is at most 4096 for a float32 dst")
    if not isinstance(dst, _TILE) or dst.buffer is not psum:
        fail(ValueError, "nc_matmul_mx writes its result to a PSUM tile")
    a = _dequantized(stationary, stationary_scale, "stationary")
    b = _dequantized(moving, moving_scale, "moving")
    result = torch.einsum("kmj,knj->mn", a, b)
    ds, dm = defined(stationary), defined(moving)
    valid = both((m, n), None if ds is None else ds.all(0)[:, None], None if dm is None else dm.all(0)[None, :])
    _cost.charge_tensor("nc_matmul_mx", n, "fp8")
    if accumulate is None:
        accumulate = written_anywhere(dst)
    if accumulate:
        current = read(dst, "nc_matmul_mx (accumulate)")
        write(dst, current + result, "nc_matmul_mx", valid=both((m, n), defined(dst), valid))
    else:
        write(dst, result, "nc_matmul_mx", valid=valid)
    return dst


# ---- into nisa and nl ---------------------------------------------------------------------------------

for _name in __all__:
    setattr(isa, _name, globals()[_name])
isa.__all__ += [n for n in __all__ if n not in isa.__all__]
nl.float8_e5m2_x4, nl.float8_e4m3fn_x4, nl.float4_e2m1fn_x4 = float8_e5m2_x4, float8_e4m3fn_x4, float4_e2m1fn_x4
nl.__all__ += ["float8_e5m2_x4", "float8_e4m3fn_x4", "float4_e2m1fn_x4"]
del _name
