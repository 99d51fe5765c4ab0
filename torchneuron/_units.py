"""Byte counts as text, the one formatter of the Python side.

It writes sizes as the C++ allocator's out-of-memory message does (``csrc/aten/allocator.cpp``'s
``formatBytes``, itself in the form of CUDA's caching allocator): ``512 bytes``, ``1.50 KiB``,
``20.00 GiB``. ``tests/test_memory.py`` checks that the two agree. It imports nothing of the device,
so every layer, the offline viewers in ``tools/`` included, may use it.
"""

from __future__ import annotations

_UNITS = ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


def format_bytes(n: float, digits: int = 2) -> str:
    """Return a byte count as text: whole ``bytes`` below 1 KiB, else KiB, MiB or GiB with ``digits`` decimals.

    >>> format_bytes(3 << 30), format_bytes(1536, digits=1), format_bytes(12)
    ('3.00 GiB', '1.5 KiB', '12 bytes')
    """
    for size, unit in _UNITS:
        if abs(n) >= size:
            return f"{n / size:.{digits}f} {unit}"
    return f"{n:.0f} bytes"
