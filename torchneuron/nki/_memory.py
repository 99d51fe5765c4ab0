"""Direct allocation (``ncc.sbuf.alloc``/``mod_alloc``, ``ncc.psum.alloc``/``mod_alloc``): tiles placed at
addresses of one memory per buffer, so that two tiles placed at overlapping addresses share their bytes.

Each program of a kernel has an SBUF and a PSUM here: a byte array of 128 partitions by the target's
capacity per partition (PSUM: its eight 2 KiB banks side by side). A tensor declared with a direct
allocator maps each logical tile (each index of its block axes, the axes before the partition axis)
to a physical tile ``(start_partition, byte_addr)``, as AWS's allocators do (aws-neuron-sdk@cca3784,
``general/nki/nki_direct_allocation_guide.rst`` and ``api/nki/compiler/{sbuf,psum}.py``; the modulo
formula is the one of ``general/nki/test/test_{sbuf,psum}_modulo_alloc.py``). The tensor's data is a
strided view of that memory in its dtype: what one tile writes, every tile over the same bytes reads.
A second byte map says which bytes were written (by any tile), so reading through one tile what another
wrote is defined, and a store of bytes nobody wrote still raises.

A placement must fit the memory (a ``MemoryError`` names the bytes) and follow the ISA's rules (a
``ValueError``): start partitions (0 above 64 partitions, 0/64 above 32, else 0/32/64/96), addresses
aligned to the element size, a PSUM tile within one bank. Reads and writes of a placed tile go through
the element offsets of its elements in the memory, so any placement is exact, modulo allocation with
fewer physical tiles than logical ones included (logical tiles i and i + n are one physical tile).
"""

from __future__ import annotations

import itertools
import math
from functools import reduce
from operator import mul
from typing import Callable, Optional, Tuple

import torch

from . import _hardware as hw
from ._run import fail, run


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32}
_WRITTEN = {1: 0x01, 2: 0x0101, 4: 0x01010101}  # every byte of an element marked written
_SIGNED = {torch.uint16: torch.int16, torch.uint32: torch.int32}


def _linearize(shape, indices) -> int:
    return sum(i * reduce(mul, shape[d + 1:], 1) for d, i in enumerate(indices))


def _modulo(base: int, allocate_shape, scale: int) -> Callable:
    def at(indices) -> int:
        shape = tuple(allocate_shape) if allocate_shape else (1,) * len(indices)
        return _linearize(shape, tuple(i % s for i, s in zip(indices, shape))) * scale + base
    return at


class Placement:
    """``buffer=ncc.sbuf.alloc(func)`` and friends: the buffer, and where each logical tile goes."""

    def __init__(self, buffer, locate: Callable, what: str):
        self.buffer, self.locate, self.what = buffer, locate, what

    @property
    def name(self) -> str:
        return self.buffer.name

    on_chip = True

    def __repr__(self) -> str:
        return self.what


def sbuf_mod(buffer, base_addr=0, base_partition=0, num_par_tiles=(), num_free_tiles=()) -> Placement:
    def locate(idx, pdim_size, fdim_size):
        return (_modulo(base_partition, num_par_tiles, pdim_size)(idx),
                _modulo(base_addr, num_free_tiles, fdim_size)(idx))
    return Placement(buffer, locate, f"ncc.sbuf.mod_alloc(base_addr={base_addr})")


def psum_mod(buffer, base_bank=0, base_addr=0, base_partition=0, num_bank_tiles=(), num_par_tiles=(),
             num_free_tiles=()) -> Placement:
    def locate(idx, pdim_size, fdim_size):
        return (_modulo(base_bank, num_bank_tiles, 1)(idx),
                _modulo(base_partition, num_par_tiles, pdim_size)(idx),
                _modulo(base_addr, num_free_tiles, fdim_size)(idx))
    return Placement(buffer, locate, f"ncc.psum.mod_alloc(base_bank={base_bank})")


def _memory(buffer: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """This program's ``buffer`` memory (uint8, partitions x bytes) and its map of written bytes."""
    r = run()
    memories = getattr(r, "_nki_memory", None)
    if memories is None:
        memories = r._nki_memory = {}
    if buffer not in memories:
        size = r.gen.sbuf_partition_bytes if buffer == "sbuf" else r.gen.psum_partition_bytes
        memories[buffer] = (torch.empty((hw.PMAX, size), dtype=torch.uint8, device=r.device),
                            torch.zeros((hw.PMAX, size), dtype=torch.uint8, device=r.device))
    return memories[buffer]


class Placed:
    """A tile's bytes in its buffer's memory: ``data`` (a strided view of them when the placement is affine
    in the block index, else a tensor of the tile's shape whose contents are not used), and how to read,
    write and check them (through the element offsets of every element, the one path for both)."""

    def __init__(self, buffer: str, shape, dtype: torch.dtype, offsets: torch.Tensor,
                 view: Optional[Tuple[int, tuple]] = None):
        memory, written = _memory(buffer)
        size = torch.empty((), dtype=dtype).element_size()
        self.dtype, self.shape = dtype, tuple(shape)
        if view is not None:
            base, strides = view
            self.data = memory.view(dtype).as_strided(self.shape, strides, base)
        else:
            self.data = torch.empty(self.shape, dtype=dtype, device=memory.device)
        self._offsets = offsets
        self._flat = memory.view(_SIGNED.get(dtype, dtype)).view(-1)
        self._written = written.view(_INT_OF_SIZE[size]).view(-1)
        self._pattern = _WRITTEN[size]

    def offsets(self, index) -> torch.Tensor:
        """The element offsets into the memory (in the tile's dtype) of ``tile[index]`` (an index as
        _core keeps it: Ellipsis, a tuple, or ("flat", positions) in row-major order)."""
        if index is Ellipsis:
            return self._offsets
        if isinstance(index, tuple) and index and isinstance(index[0], str):
            return self._offsets.view(-1)[index[1]]
        return self._offsets[index]

    def load(self, index) -> torch.Tensor:
        v = self._flat[self.offsets(index)]
        return v.view(self.dtype) if self.dtype in _SIGNED else v

    def store(self, index, value: torch.Tensor) -> None:
        off = self.offsets(index)
        v = value.to(self.dtype).expand(off.shape)
        if self.dtype in _SIGNED:
            v = v.view(_SIGNED[self.dtype])
        self._flat[off] = v

    def mark(self, index, valid: Optional[torch.Tensor], mask: Optional[torch.Tensor]) -> None:
        """Bytes written by a write of ``tile[index]``: where ``valid`` (None: everywhere) and ``mask`` hold."""
        off = self.offsets(index)
        written = torch.full(off.shape, self._pattern, dtype=self._written.dtype, device=off.device)
        if valid is not None:
            written = torch.where(valid.expand(off.shape), written, torch.zeros_like(written))
        if mask is not None:
            written = torch.where(mask.expand(off.shape), written, self._written[off])
        self._written[off] = written

    def defined(self, index) -> torch.Tensor:
        return self._written[self.offsets(index)] == self._pattern


def place(placement: Placement, shape: Tuple[int, ...], dtype: torch.dtype, pa: int) -> Placed:
    """The bytes of a tile of ``shape`` (partition axis ``pa``) placed by ``placement``, checked against the
    target's memory and the ISA's rules."""
    buffer = placement.buffer.name
    gen = run().gen
    itemsize = torch.empty((), dtype=dtype).element_size()
    blocks, pdim, free = shape[:pa], shape[pa], shape[pa + 1:]
    fdim_bytes = math.prod(free) * itemsize
    capacity = gen.sbuf_partition_bytes if buffer == "sbuf" else gen.psum_partition_bytes
    row = capacity // itemsize
    offsets = {}
    for idx in itertools.product(*(range(n) for n in blocks)):
        where = placement.locate(idx=tuple(idx), pdim_size=pdim, fdim_size=fdim_bytes)
        where = tuple(int(w) for w in where)
        if buffer == "psum":
            bank, partition, addr = where
            if not 0 <= bank < gen.psum_banks:
                fail(MemoryError, f"PSUM is full: {placement!r} places logical tile {idx} in bank {bank}; "
                                  f"PSUM has {gen.psum_banks} banks")
            if addr < 0 or addr + fdim_bytes > hw.PSUM_BANK_BYTES:
                fail(ValueError, f"{placement!r}: logical tile {idx} at byte {addr} of bank {bank} takes "
                                 f"{fdim_bytes} bytes per partition; a PSUM tile stays within its bank of "
                                 f"{hw.PSUM_BANK_BYTES} bytes")
            addr += bank * hw.PSUM_BANK_BYTES
        else:
            partition, addr = where
        if addr < 0 or addr + fdim_bytes > capacity:
            fail(MemoryError, f"{buffer.upper()} is full: {placement!r} places logical tile {idx} at bytes "
                              f"[{addr}, {addr + fdim_bytes}) of a partition of {capacity} bytes")
        allowed = (0,) if pdim > 64 else ((0, 64) if pdim > 32 else (0, 32, 64, 96))
        if partition not in allowed:
            fail(ValueError, f"{placement!r}: logical tile {idx} of {pdim} partitions starts at partition "
                             f"{partition}; the ISA allows {', '.join(map(str, allowed))}")
        if addr % itemsize:
            fail(ValueError, f"{placement!r}: logical tile {idx} at byte {addr} is not aligned to its "
                             f"{itemsize}-byte elements ({dtype})")
        offsets[idx] = partition * row + addr // itemsize
    device = run().device
    # Within a logical tile: partitions a row of the memory apart, its free axes packed (row-major).
    free_strides = [math.prod(free[i + 1:]) for i in range(len(free))]
    within = torch.zeros((), dtype=torch.int64, device=device)
    for axis, (n, st) in enumerate(zip((pdim,) + tuple(free), [row] + free_strides)):
        view = [1] * (1 + len(free))
        view[axis] = n
        within = within + torch.arange(n, device=device).reshape(view) * st
    table = torch.tensor([offsets[idx] for idx in itertools.product(*(range(n) for n in blocks))],
                         dtype=torch.int64, device=device).reshape(tuple(blocks) + (1,) * (1 + len(free)))
    all_offsets = (table + within).expand(shape).contiguous()
    # A placement affine in the block index is one strided view of the memory as well.
    zero = (0,) * len(blocks)
    base = offsets[zero]
    block_strides = []
    for axis, n in enumerate(blocks):
        unit = tuple(1 if a == axis else 0 for a in range(len(blocks)))
        block_strides.append(offsets[unit] - base if n > 1 else 0)
    affine = all(s >= 0 for s in block_strides) and all(
        off == base + sum(i * s for i, s in zip(idx, block_strides)) for idx, off in offsets.items())
    view = (base, tuple(block_strides) + (row,) + tuple(free_strides)) if affine else None
    return Placed(buffer, shape, dtype, all_offsets, view)
