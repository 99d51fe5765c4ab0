"""On-chip memory as the compiler allocates it: a tile holds its SBUF or PSUM space from its allocation
to its last use (its last read or write), not for as long as Python keeps the object.

Each kernel run keeps a clock that ticks as every instruction (or tile assignment) starts and ends, and one
:class:`Allocation` per tile: the tick it was made at, the tick it was last used at, where it was made.
When the program ends, :func:`check` sweeps the intervals: the peaks of SBUF (bytes per partition) and
PSUM (banks, and bytes per partition), and, for a kernel over a capacity, a ``MemoryError`` naming the
limit and listing the tiles live at the first point it is exceeded.

A PSUM tile whose only use is being assigned or added into another PSUM tile right after it was
written (``acc[...] = nisa.nc_matmul(...)``, ``acc += nisa.nc_matmul(...)``) is the matmul writing
into the accumulator, as the compiler emits it: it takes no space of its own.
"""

from __future__ import annotations

import dataclasses
import linecache
import re
from typing import List, Optional, Tuple

from . import _hardware as hw


@dataclasses.dataclass
class Allocation:
    """A tile's claim on SBUF or PSUM: its size per partition and its live interval in ticks."""

    buffer: str  # "sbuf" or "psum"
    shape: Tuple[int, ...]
    dtype: object
    per_partition: int
    banks: int
    line: str  # file:line of the kernel where it was made
    start: int
    last: int
    reads: int = 0
    folded: Optional[int] = None  # the tick its value went into an accumulator (see the module's doc)

    @property
    def elided(self) -> bool:
        return self.folded is not None and self.last <= self.folded

    @property
    def name(self) -> str:
        """The variable the kernel's line assigns, else the shape (a temporary)."""
        file, _, lineno = self.line.rpartition(":")
        if file and lineno.isdigit():
            m = _ASSIGN.match(linecache.getline(file, int(lineno)))
            if m:
                return m.group(1)
        return f"a temporary {self.shape}"


_ASSIGN = re.compile(r"\s*([A-Za-z_]\w*)\s*(?::[^=]*)?=(?!=)")


@dataclasses.dataclass
class Peaks:
    sbuf_bytes: int = 0
    psum_bytes: int = 0
    psum_banks: int = 0


def check(allocations: List[Allocation], gen: hw.Generation) -> Peaks:
    """The peaks of ``allocations`` by liveness; raises ``MemoryError`` when one exceeds ``gen``'s capacity."""
    events = []
    for i, a in enumerate(allocations):
        if a.per_partition and not a.elided:
            events.append((a.start, 0, i))  # at one tick, tiles made before tiles whose last use it is go
            events.append((a.last, 1, i))
    events.sort()
    peaks = Peaks()
    sbuf = psum = banks = 0
    live = {}
    for tick, leaving, i in events:
        a = allocations[i]
        if leaving:
            live.pop(i, None)
            if a.buffer == "sbuf":
                sbuf -= a.per_partition
            else:
                psum -= a.per_partition
                banks -= a.banks
            continue
        live[i] = a
        if a.buffer == "sbuf":
            sbuf += a.per_partition
            if sbuf > gen.sbuf_partition_bytes:
                _full(a, live, gen, f"SBUF is full: a tile of shape {a.shape} ({a.dtype}) needs {a.per_partition} "
                                    f"bytes per partition, {sbuf - a.per_partition} of {gen.sbuf_partition_bytes} "
                                    f"are in use", "sbuf")
            peaks.sbuf_bytes = max(peaks.sbuf_bytes, sbuf)
        else:
            psum += a.per_partition
            banks += a.banks
            if banks > gen.psum_banks:
                _full(a, live, gen, f"PSUM is full: a tile of shape {a.shape} needs {a.banks} of its {gen.psum_banks} "
                                    f"banks ({hw.PSUM_BANK_BYTES} bytes per partition each), {banks - a.banks} are "
                                    f"in use", "psum")
            peaks.psum_bytes = max(peaks.psum_bytes, psum)
            peaks.psum_banks = max(peaks.psum_banks, banks)
    return peaks


def _full(crossing: Allocation, live: dict, gen: hw.Generation, message: str, buffer: str):
    tiles = [a for a in live.values() if a.buffer == buffer]
    rows = "\n".join(f"  {a.name}: shape {a.shape} {a.dtype}, {a.per_partition} bytes per partition"
                     + (f" ({a.banks} banks)" if buffer == "psum" else "") + f", made at {a.line}"
                     + (" (the one that does not fit)" if a is crossing else "") for a in tiles)
    raise MemoryError(f"{message} (at {crossing.line}, target {gen.name}); a tile holds its space from its "
                      f"allocation to its last use. The {len(tiles)} tiles live there:\n{rows}")
