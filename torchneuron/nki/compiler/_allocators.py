"""The direct-allocation API of ``nki.compiler.sbuf`` and ``nki.compiler.psum``, one definition for both.

``alloc(func)`` and ``mod_alloc(...)`` place each logical tile of a tensor at an address of the buffer's
memory, where tiles at overlapping addresses share bytes (:mod:`torchneuron.nki._memory`);
``auto_alloc()`` is the buffer itself (the compiler's allocation, checked by liveness).
"""

from __future__ import annotations

from typing import Any, Callable

from .._memory import Placement, psum_mod, sbuf_mod


def allocators(name: str, buffer: Any) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """``alloc``, ``mod_alloc`` and ``auto_alloc`` of the buffer called ``name``."""

    def alloc(func):
        if not callable(func):
            raise TypeError(f"ncc.{name}.alloc takes a callable placing each logical tile, got {type(func).__name__}")
        return Placement(buffer, func, f"ncc.{name}.alloc({getattr(func, '__name__', 'func')})")

    if name == "psum":
        def mod_alloc(*, base_bank=0, base_addr=0, base_partition=0, num_bank_tiles=(), num_par_tiles=(),
                      num_free_tiles=()):
            return psum_mod(buffer, base_bank, base_addr, base_partition, num_bank_tiles, num_par_tiles,
                            num_free_tiles)
    else:
        def mod_alloc(*, base_addr=0, base_partition=0, num_par_tiles=(), num_free_tiles=()):
            return sbuf_mod(buffer, base_addr, base_partition, num_par_tiles, num_free_tiles)

    def auto_alloc():
        return buffer

    alloc.__doc__ = (f"``buffer=ncc.{name}.alloc(func)``: ``func(block_index, partitions, bytes_per_partition)`` "
                     f"places each logical tile (see torchneuron.nki._memory).")
    mod_alloc.__doc__ = f"``buffer=ncc.{name}.mod_alloc(...)``: modulo placement (see torchneuron.nki._memory)."
    auto_alloc.__doc__ = f"``buffer=ncc.{name}.auto_alloc()``: the same as ``buffer=nl.{name}``."
    return alloc, mod_alloc, auto_alloc
