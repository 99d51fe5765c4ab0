"""Memory history and snapshots of neuron devices, in the structure of PyTorch's CUDA snapshots.

A snapshot is the dictionary ``torch.cuda.memory._snapshot()`` returns: ``segments`` (the caching
allocator's reserved memory, each with its blocks, allocated or cached) and ``device_traces`` (per
device, the allocator's actions while the history was on), so PyTorch's renderers in
``torch.cuda._memory_viz`` and its visualizer page draw it as they draw a CUDA one.
"""

import logging
import os
import pickle
import sys
import time
from typing import Any, Optional

from .. import _C

__all__ = ["_dump_snapshot", "_record_memory_history", "_snapshot"]

logger = logging.getLogger("torchneuron")


def _record_memory_history(
    enabled: Optional[str] = "all",
    context: Optional[str] = "all",
    stacks: str = "all",
    max_entries: int = sys.maxsize,
    device: Any = None,
    clear_history: bool = False,
) -> None:
    """Start or stop recording where device memory is allocated, and what the allocator does.

    Like ``torch.cuda.memory._record_memory_history``. While it records, an out-of-memory error
    writes a snapshot and names its file (see :func:`_snapshot`).

    Args:
        enabled: ``None`` stops recording; ``"state"`` keeps a traceback with each live block;
            ``"all"`` also keeps a history of allocations, frees and segment changes.
        context: which tracebacks to keep: ``None``, ``"state"`` (live blocks), ``"alloc"``
            (and allocation events), ``"all"`` (and free events).
        stacks: ``"python"`` for Python frames, ``"all"`` for C++ frames too.
        max_entries: the most history entries kept per device; older ones are dropped.
        device: ignored (every device records), as for CUDA.
        clear_history: drop the history recorded so far.

    Example::

        torch.neuron.memory._record_memory_history(max_entries=100_000)
        train_step()
        torch.neuron.memory._dump_snapshot("snapshot.pickle")
        torch.neuron.memory._record_memory_history(enabled=None)
    """
    if isinstance(enabled, bool):  # the older signature: _record_memory_history(True/False, ...)
        enabled = "all" if enabled else None
    if max_entries is None or max_entries < 1:
        raise ValueError(f"_record_memory_history: max_entries must be at least 1, got {max_entries}")
    _C._neuron_record_memory_history(enabled, context, stacks, min(int(max_entries), sys.maxsize), clear_history)


def _snapshot(device: Any = None) -> dict:
    """Return the caching allocator's state and recorded history of every neuron device.

    The dictionary has CUDA's structure: ``segments``, a list of dictionaries with ``device``,
    ``address``, ``total_size``, ``allocated_size``, ``active_size``, ``requested_size``,
    ``stream``, ``segment_type`` and ``blocks`` (each with ``address``, ``size``,
    ``requested_size``, ``state`` ``"active_allocated"`` or ``"inactive"`` and ``frames``); and
    ``device_traces``, one list per device of entries with ``action`` (``alloc``,
    ``free_requested``, ``free_completed``, ``segment_alloc``, ``segment_free``, ``oom``),
    ``addr``, ``size``, ``stream``, ``time_us`` and ``frames``. A frame is a dictionary with
    ``filename``, ``line`` and ``name``.

    Args:
        device: ignored; every device is in the snapshot, as for CUDA.
    """
    return _C._neuron_memory_snapshot()


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    """Write :func:`_snapshot` to a file with ``pickle``.

    Open it with ``torchneuron memviz FILE`` or drop it on PyTorch's visualizer page
    (https://pytorch.org/memory_viz).

    Args:
        filename: the file to write.
    """
    snapshot = _snapshot()
    with open(filename, "wb") as f:
        pickle.dump(snapshot, f)


def _dump_oom_snapshot(device: int) -> str:
    """Write a snapshot after an out-of-memory error on ``neuron:device`` and return its path.

    The directory is ``TORCHNEURON_OOM_SNAPSHOT`` if set, else the current one. Called by the
    allocator, with the history on, before it raises the error.
    """
    directory = os.environ.get("TORCHNEURON_OOM_SNAPSHOT") or os.getcwd()
    os.makedirs(directory, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = os.path.abspath(os.path.join(
        directory, f"neuron_oom_snapshot_dev{device}_pid{os.getpid()}_{stamp}_{time.monotonic_ns() % 1000000:06d}.pickle"))
    _dump_snapshot(path)
    logger.warning("neuron:%d ran out of memory; memory snapshot written to %s", device, path)
    return path
