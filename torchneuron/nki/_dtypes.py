"""nl's dtypes (``nl.float32``, ``nl.bfloat16``, ``nl.float8_e5m2``, ...): each a torch dtype that NumPy takes too.

In AWS's NKI an nl dtype is NumPy's: neuronxcc 2.x has ``nl.float32 = np.float32`` and
``nl.bfloat16 = np.dtype('bfloat16')`` (ml_dtypes' types, registered with NumPy), the newer NKI the
dtype's name (``nl.DType = str``). So AWS's samples write ``np.zeros(shape, dtype=nl.float8_e5m2)`` and
``x.astype(nl.bfloat16)`` on the host. Here an nl dtype is a :class:`DType`: it stands for its torch dtype
(equal to it and hashed as it, its attributes are the torch dtype's, and every nl/nisa function takes it
where a dtype goes) and gives NumPy its NumPy dtype through the ``dtype`` attribute NumPy reads
(``np.dtype(nl.bfloat16)`` is ``ml_dtypes.bfloat16``; bfloat16 and the fp8 types need ml_dtypes, as AWS's
NKI does). PyTorch's own functions do not take it: ``nl.float32.torch`` is the torch dtype.
"""

from __future__ import annotations

import logging
from typing import Dict, Optional

import numpy as np
import torch

__all__ = ["DType", "numpy_dtype", "to_torch", "to_numpy"]

log = logging.getLogger("torchneuron")

# ml_dtypes' NumPy types PyTorch has the same bits of (its name -> the torch dtype).
_BITS: Dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float8_e4m3fn": torch.float8_e4m3fn,
                                 "float8_e5m2": torch.float8_e5m2}
if hasattr(torch, "float8_e8m0fnu"):
    _BITS["float8_e8m0fnu"] = torch.float8_e8m0fnu
# The NumPy type of a tensor of each of these torch dtypes (a kernel's result). PyTorch's e4m3 is the fn
# variant (no infinities, up to 448), which stands here for nl.float8_e4m3 too; AWS's nl.float8_e4m3 is
# ml_dtypes' float8_e4m3 (IEEE-style: infinities, up to 240), and a result comes back as that, by value (a
# magnitude over 240 is an infinity there, as on a chip computing in that type).
_ML_NAMES: Dict[torch.dtype, str] = {t: n for n, t in _BITS.items()}
_ML_NAMES[torch.float8_e4m3fn] = "float8_e4m3"


def _ml_dtypes():
    try:
        import ml_dtypes
    except ImportError:
        return None
    return ml_dtypes


def numpy_dtype(t: torch.dtype, name: Optional[str] = None) -> Optional[np.dtype]:
    """The NumPy dtype of a torch dtype (bfloat16 and fp8: ml_dtypes' ``name``, by default
    ``_ML_NAMES``'), None when there is none."""
    name = name or _ML_NAMES.get(t)
    if name is not None:
        ml = _ml_dtypes()
        return None if ml is None or not hasattr(ml, name) else np.dtype(getattr(ml, name))
    try:
        return torch.empty(0, dtype=t).numpy().dtype
    except (TypeError, RuntimeError):
        return None


class DType:
    """An nl dtype: its torch dtype for the kernel, its NumPy dtype for the host (see the module's docstring)."""

    __slots__ = ("name", "torch", "_numpy")

    def __init__(self, name: str, torch_dtype: torch.dtype, numpy_name: Optional[str] = None):
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "torch", torch_dtype)
        object.__setattr__(self, "_numpy", numpy_name)  # ml_dtypes' name, when not _ML_NAMES' for the torch dtype

    def __setattr__(self, name, value):
        raise AttributeError(f"nl.{self.name} is read-only")

    @property
    def dtype(self) -> np.dtype:
        """The NumPy dtype (what ``np.dtype(nl.x)``, ``np.zeros(..., dtype=nl.x)`` and ``astype`` read)."""
        d = numpy_dtype(self.torch, self._numpy)
        if d is None:
            msg = (f"nl.{self.name} has no NumPy dtype: install ml_dtypes (NumPy's bfloat16 and fp8 types, as "
                   f"AWS's NKI uses)" if self.torch in _ML_NAMES else f"nl.{self.name} has no NumPy dtype")
            log.warning("%s", msg)  # NumPy replaces this error with "Cannot interpret ... as a data type"
            raise AttributeError(msg)
        return d

    def __getattr__(self, name):  # is_floating_point, itemsize, is_signed, ...: the torch dtype's
        return getattr(object.__getattribute__(self, "torch"), name)

    def __eq__(self, other):
        if isinstance(other, DType):
            return self.torch == other.torch
        if isinstance(other, torch.dtype):
            return self.torch == other
        if isinstance(other, str):  # the newer NKI's dtypes are their names
            return other == self.name
        if isinstance(other, np.dtype) or (isinstance(other, type) and issubclass(other, np.generic)):
            d = numpy_dtype(self.torch, self._numpy)
            return d is not None and d == np.dtype(other)
        return NotImplemented

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return hash(self.torch)  # as its torch dtype: a dict keyed by torch dtypes finds it

    def __repr__(self) -> str:
        return f"nl.{self.name}"

    __str__ = __repr__

    def __reduce__(self):
        return (_by_name, (self.name,))


_BY_NAME: Dict[str, DType] = {}


def _by_name(name: str) -> DType:
    return _BY_NAME[name]


#: The 4-packed types of MX matmuls (nl.float8_e5m2_x4, ...): each element a 32-bit word of four fp8 values
#: (the first in the lowest byte), held as int32, or a 16-bit word of four fp4 values (int16); name -> what
#: it packs (the fp8 torch dtype, or "float4_e2m1fn").
PACKED: Dict[str, object] = {"float8_e5m2_x4": torch.float8_e5m2, "float8_e4m3fn_x4": torch.float8_e4m3fn,
                             "float4_e2m1fn_x4": "float4_e2m1fn"}  # 4 x fp4: a 16-bit word, nibbles low first


def packed_of(d):
    """What an x4 dtype packs (None for any other dtype)."""
    return PACKED.get(d.name) if isinstance(d, DType) else (PACKED.get(d) if isinstance(d, str) else None)


def make(name: str, torch_dtype: Optional[torch.dtype], numpy_name: Optional[str] = None) -> Optional[DType]:
    if torch_dtype is None:
        return None
    d = _BY_NAME[name] = DType(name, torch_dtype, numpy_name)
    return d


def to_torch(a) -> torch.Tensor:
    """A NumPy array as a CPU tensor (ml_dtypes' bfloat16 and fp8 arrays by their bits; AWS's IEEE-style
    float8_e4m3 by value, as PyTorch's e4m3 is the fn variant); TypeError when PyTorch has no such dtype."""
    a = np.ascontiguousarray(a)
    name = a.dtype.name
    if name in _BITS:
        return torch.from_numpy(a.view(np.uint8 if a.dtype.itemsize == 1 else np.uint16)).view(_BITS[name])
    if name == "float8_e4m3":  # ml_dtypes' IEEE e4m3: every finite value is one of float8_e4m3fn's
        return torch.from_numpy(a.astype(np.float32)).to(torch.float8_e4m3fn)
    return torch.from_numpy(a)


def to_numpy(t: torch.Tensor, what: str, like: Optional[np.dtype] = None):
    """A CPU tensor as a NumPy array: bfloat16 and fp8 as ml_dtypes' types (``like``'s when it holds the same
    bits, as an array the kernel wrote into) when ml_dtypes is installed, else widened to float32 (exact)
    with a warning in the log."""
    if t.dtype not in _ML_NAMES:
        try:
            return t.numpy()
        except TypeError:
            raise TypeError(f"{what}: a result of dtype {t.dtype} has no NumPy counterpart") from None
    name = like.name if like is not None and _BITS.get(like.name) == t.dtype else _ML_NAMES[t.dtype]
    d = numpy_dtype(t.dtype, name)
    if d is None:
        log.warning("%s: a %s result is returned as float32 (exact): NumPy has no %s without ml_dtypes",
                    what, t.dtype, name)
        return t.float().numpy()
    if name not in _BITS:  # by value (float8_e4m3fn -> AWS's float8_e4m3)
        return t.float().numpy().astype(d)
    bits = torch.uint8 if t.element_size() == 1 else torch.uint16
    return t.contiguous().view(bits).numpy().view(d)
