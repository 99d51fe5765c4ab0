"""``nki.compiler.sbuf``: direct allocation of sbuf tensors (see :mod:`torchneuron.nki.compiler._allocators`)."""

from __future__ import annotations

from .._core import sbuf as _buffer
from ._allocators import allocators

__all__ = ["alloc", "mod_alloc", "auto_alloc"]

alloc, mod_alloc, auto_alloc = allocators("sbuf", _buffer)
