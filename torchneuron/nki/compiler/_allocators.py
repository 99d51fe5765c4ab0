"""The direct-allocation API of ``nki.compiler.sbuf`` and ``nki.compiler.psum``, one definition for both.

Here each allocator names its buffer (``nl.sbuf`` or ``nl.psum``): a tensor allocated with it lives in
that buffer, and its logical tiles each have memory of their own (see :mod:`torchneuron.nki.compiler`).
"""

from __future__ import annotations

from typing import Any, Callable


def allocators(name: str, buffer: Any) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """``alloc``, ``mod_alloc`` and ``auto_alloc`` of the buffer called ``name``."""

    def alloc(func):
        if not callable(func):
            raise TypeError(f"ncc.{name}.alloc takes a callable placing each logical tile, got {type(func).__name__}")
        return buffer

    def mod_alloc(*, base_addr=0, base_partition=0, num_par_tiles=(), num_free_tiles=(), base_bank=0,
                  num_bank_tiles=()):
        return buffer

    def auto_alloc():
        return buffer

    alloc.__doc__ = f"``buffer=ncc.{name}.alloc(func)``: ``func`` places each logical tile; here the tensor is in nl.{name}."
    mod_alloc.__doc__ = f"``buffer=ncc.{name}.mod_alloc(...)``: modulo placement; here the tensor is in nl.{name}."
    auto_alloc.__doc__ = f"``buffer=ncc.{name}.auto_alloc()``: the same as ``buffer=nl.{name}``."
    return alloc, mod_alloc, auto_alloc
