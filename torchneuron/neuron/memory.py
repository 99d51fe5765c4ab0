"""Device memory of neuron devices: statistics and the caching allocator."""

from collections import OrderedDict
from typing import Any

import torch

from .. import _C
from .._units import format_bytes
from ._memory_history import _dump_snapshot, _record_memory_history, _snapshot  # noqa: F401
from ._utils import _get_device_index

__all__ = [
    "empty_cache", "host_memory_stats", "max_memory_allocated", "max_memory_reserved",
    "mem_get_info", "memory_allocated", "memory_reserved", "memory_stats", "memory_summary",
    "reset_accumulated_memory_stats", "reset_max_memory_allocated", "reset_peak_memory_stats",
]


def empty_cache() -> None:
    """Release the cached, unoccupied device memory of every neuron device."""
    torch._C._accelerator_emptyCache()


def memory_stats(device: Any = None) -> "OrderedDict[str, Any]":
    """Return the caching allocator's statistics of a device, keyed like ``torch.cuda.memory_stats``.

    Args:
        device: the device (default: the current one).
    """
    return torch.accelerator.memory_stats(_get_device_index(device))


def memory_allocated(device: Any = None) -> int:
    """Return the bytes occupied by tensors on a device.

    Args:
        device: the device (default: the current one).
    """
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device: Any = None) -> int:
    """Return the peak of :func:`memory_allocated` since start or the last reset."""
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device: Any = None) -> int:
    """Return the bytes the caching allocator holds on a device (in use or cached)."""
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device: Any = None) -> int:
    """Return the peak of :func:`memory_reserved` since start or the last reset."""
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device: Any = None) -> None:
    """Reset the peaks tracked by the caching allocator of a device."""
    torch.accelerator.reset_peak_memory_stats(_get_device_index(device))


def reset_max_memory_allocated(device: Any = None) -> None:
    """Reset the peak of :func:`memory_allocated` (and every other peak) of a device."""
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device: Any = None) -> None:
    """Reset the accumulated counts (allocations, frees, retries, OOMs) of a device."""
    torch.accelerator.reset_accumulated_memory_stats(_get_device_index(device))


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """Return ``(free, total)`` device memory in bytes.

    Args:
        device: the device (default: the current one).
    """
    return tuple(_C._mem_get_info(_get_device_index(device)))


def host_memory_stats() -> "OrderedDict[str, Any]":
    """Return statistics of the pinned host memory allocator."""
    return OrderedDict(sorted(_C._host_memory_stats().items()))



def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """Return a readable table of a device's memory statistics.

    Args:
        device: the device (default: the current one).
        abbreviated: show only the aggregate rows.
    """
    index = _get_device_index(device)
    stats = memory_stats(index)
    free, total = mem_get_info(index)
    rows = [
        ("Allocated memory", "allocated_bytes", True),
        ("Active memory", "active_bytes", True),
        ("Requested memory", "requested_bytes", True),
        ("Reserved memory", "reserved_bytes", True),
        ("Allocations", "allocation", False),
        ("Active allocs", "active", False),
        ("Device reserved segments", "segment", False),
    ]
    pools = ("all",) if abbreviated else ("all", "large_pool", "small_pool")
    line = "=" * 79
    out = [line, f" neuron:{index} memory summary (capacity {format_bytes(total)}, free {format_bytes(free)})".ljust(79), line,
           f"{'Metric':<34}|{'Cur Usage':>10} |{'Peak Usage':>11} |{'Tot Alloc':>10} |{'Tot Freed':>10}", "-" * 79]
    for title, key, is_bytes in rows:
        for pool in pools:
            name = title if pool == "all" else f"  from {pool.replace('_', ' ')}"
            vals = [stats.get(f"{key}.{pool}.{m}", 0) for m in ("current", "peak", "allocated", "freed")]
            fmt = format_bytes if is_bytes else str
            out.append(f"{name:<34}|" + "|".join(f"{fmt(v):>10} " for v in vals))
    out.append("-" * 79)
    out.append(f"{'Allocation retries':<34}|{stats.get('num_alloc_retries', 0):>10} ")
    out.append(f"{'Out-of-memory errors':<34}|{stats.get('num_ooms', 0):>10} ")
    out.append(line)
    return "\n".join(out)
