"""``nki.compiler.psum``: direct allocation of psum tensors. Here each allocator names the buffer
(``nl.psum``): a tensor allocated with it is a psum tensor whose logical tiles each have memory of their own
(see :mod:`torchneuron.nki.compiler`)."""

from __future__ import annotations

from .._core import psum as _buffer

__all__ = ["alloc", "mod_alloc", "auto_alloc"]


def alloc(func):
    """``buffer=ncc.psum.alloc(func)``: ``func`` places each logical tile; here the tensor is in nl.psum."""
    if not callable(func):
        raise TypeError(f"ncc.psum.alloc takes a callable placing each logical tile, got {type(func).__name__}")
    return _buffer


def mod_alloc(*, base_addr=0, base_partition=0, num_par_tiles=(), num_free_tiles=(), base_bank=0,
              num_bank_tiles=()):
    """``buffer=ncc.psum.mod_alloc(...)``: modulo placement; here the tensor is in nl.psum."""
    return _buffer


def auto_alloc():
    """``buffer=ncc.psum.auto_alloc()``: the same as ``buffer=nl.psum``."""
    return _buffer
