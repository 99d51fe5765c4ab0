"""Telling a program's steps apart from the kernels they ran (see :mod:`torchneuron.projection.counting`).

:class:`_KernelWatch` reads the profiler's kernel records between step boundaries, and
:func:`_resolve_steps` uses their signatures (kernel names with shapes, then names alone) and the
allocations between boundaries to decide which counted steps are the same step run again.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Any, Dict, Iterator, List

import torch

_BOUNDARY = "torchneuron::projection_step"
_ROOT_NAMESPACES = ("aten::", "c10d::", "_c10d_functional::", "c10d_functional::")


class _KernelWatch:
    """The kernels of watched steps as PyTorch's profiler sees them, recorded in C++ by the
    dispatcher's callbacks and read back in Python only when counting ends.

    The first session records every op's name and input shapes, dtypes and integer arguments: a
    step in it is compared exactly with the steps counted op by op. Reading back shapes costs about
    as much as the step itself, so after the first watched step (:meth:`switch`) a second session
    records names only, and each later step is compared with that first watched step by its ops'
    names and by what it allocated on the accelerator (bytes and allocations, from the caching
    allocator's counters, read at every step boundary): a step with other shapes allocates other
    bytes. A program that allocates nothing on an accelerator keeps the first session to the end.
    """

    def __init__(self, free_ops: frozenset) -> None:
        self._free_ops = free_ops  # the base names of ops that cost nothing (counting's table)
        self._prof: Any = None
        self._exact: Dict[int, Any] = {}  # segment -> hash of its kernels with shapes (first session)
        self._names: Dict[int, tuple] = {}  # segment -> its kernels' names (every session)
        self._readings: List[tuple] = []
        self._segment = 0
        self._with_shapes = True

    def _session(self, shapes: bool) -> None:
        self._with_shapes = shapes
        self._first = self._segment
        self._prof = torch.autograd.profiler.profile(use_kineto=True, record_shapes=shapes, use_cpu=True)
        with _quiet_stderr():
            self._prof.__enter__()

    def _end_session(self, final: bool) -> None:
        prof, self._prof = self._prof, None
        with _quiet_stderr():
            prof.__exit__(None, None, None)
        # Read the session back now, so that no profiler result outlives its session. A session
        # ended by a switch owns the segments before the current one (the next session records
        # that one); the final session owns everything from its first segment on.
        end = None if final else self._segment
        for seg, kernels in _segments(prof.kineto_results, self._first, self._with_shapes, self._free_ops).items():
            if end is not None and seg >= end:
                continue
            if self._with_shapes:
                self._exact[seg] = hash(tuple(kernels))
            self._names[seg] = tuple(k[0] for k in kernels)
        del prof

    def start(self) -> None:
        self._readings.append(_allocations())
        self._session(shapes=True)

    def boundary(self) -> None:
        with torch.autograd.profiler.record_function(_BOUNDARY):
            pass
        self._readings.append(_allocations())
        self._segment += 1

    def allocated(self, segment: int) -> tuple:
        """Bytes and allocations the accelerator's allocator made during ``segment``."""
        if segment + 1 >= len(self._readings):
            return ()
        a, b = self._readings[segment], self._readings[segment + 1]
        return tuple(y - x for x, y in zip(a, b))

    def switch(self, reference: int) -> bool:
        """Go on with names only if ``reference`` (a closed watched step) allocated on an accelerator."""
        if not self._with_shapes or not any(self.allocated(reference)):
            return False
        self._end_session(final=False)
        self._session(shapes=False)
        return True

    def stop(self) -> Dict[str, Dict[int, Any]]:
        """End the watch. Returns per segment (the ops between two boundaries) its ``exact``
        signature (names, shapes, dtypes, integer arguments) where shapes were recorded, and its
        ``named`` one (names and allocations) everywhere."""
        self._end_session(final=True)
        named = {seg: hash((names, self.allocated(seg))) for seg, names in self._names.items()}
        return {"exact": dict(self._exact), "named": named}


def _resolve_steps(steps: List[Any], signatures: Dict[str, Dict[int, Any]]) -> int:
    """Give each watched step the records of the fully counted step whose kernels it repeats.

    Args:
        steps: a :class:`CountingMode`'s steps, the last one still open.
        signatures: from :meth:`_KernelWatch.stop`: per segment of the profiler's timeline,
            its ``exact`` signature where shapes were recorded and its ``named`` one.

    Returns the number of watched steps that repeat none.
    """
    exact, named = signatures["exact"], signatures["named"]
    full: Dict[Any, int] = {}
    for i, step in enumerate(steps):
        if step.counted and step.segment in exact:
            full.setdefault(exact[step.segment], i)
    known: Dict[Any, int] = {}  # named signature of a watched step matched exactly -> its source
    unmatched = 0
    for step in steps[:-1]:  # the last one is still open: nothing ran in it
        if step.counted:
            continue
        if step.segment in exact:
            match = full.get(exact[step.segment])
            if match is not None and step.segment in named:
                known.setdefault(named[step.segment], match)
        else:
            match = known.get(named.get(step.segment)) if step.segment in named else None
        if match is None:
            unmatched += 1
            continue
        src = steps[match]
        step.ops = src.ops
        step.start_bytes, step.peak_bytes = src.start_bytes, src.peak_bytes
        step.forward_peak_bytes = src.forward_peak_bytes
        step.counted, step.repeat_of = True, match
    return unmatched


def _segments(results: Any, first: int, shapes: bool, free_ops: frozenset) -> Dict[int, List[Any]]:
    """A profiler session's outermost ATen ops, in time order, cut into segments at the boundaries."""
    events: List[Any] = []
    stack = list(results.experimental_event_tree())
    while stack:
        e = stack.pop()
        name = e.name
        if name == _BOUNDARY or name.startswith(_ROOT_NAMESPACES):
            events.append((e.start_time_ns, name, e))
        else:
            stack.extend(e.children)
    events.sort(key=lambda x: x[0])
    segments: Dict[int, List[Any]] = defaultdict(list)
    seg = first
    segments[seg] = []
    for _, name, e in events:
        if name == _BOUNDARY:
            seg += 1
            segments[seg] = []
            continue
        kernel = _watched_name(name, free_ops)
        if kernel:
            args = tuple(_arg_signature(a) for a in e.extra_fields.inputs) if shapes else ()
            segments[seg].append((kernel, args))
    return segments


def _allocations() -> tuple:
    """The accelerator caching allocator's cumulative counters: bytes and allocations, per device."""
    acc = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    if acc is None:
        return ()
    out = []
    for i in range(torch.accelerator.device_count()):
        stats = torch._C._accelerator_getDeviceStats(i)
        out += [stats["allocated_bytes"]["all"]["allocated"], stats["allocation"]["all"]["allocated"]]
    return tuple(out)


_WATCHED: Dict[str, str] = {}


def _watched_name(name: str, free_ops: frozenset) -> str:
    """The name a watched kernel is compared by: empty for ops that cost nothing (views, ``detach``,
    factories without data), and without the in-place ``_``: counting op by op keeps references
    that can turn an in-place gradient accumulation (``add_``) into an out-of-place one (``add``)."""
    out = _WATCHED.get(name)
    if out is None:
        namespace, _, base = name.partition("::")
        free = base in free_ops
        if not free:
            packet = getattr(getattr(torch.ops, namespace, None), base, None)
            try:
                free = any(getattr(packet, o).is_view for o in packet.overloads()) if packet is not None else False
            except Exception:  # noqa: BLE001 - an op PyTorch cannot describe is compared by name
                free = False
        out = _WATCHED[name] = "" if free else name.rstrip("_")
    return out


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 while the profiler starts and stops: its C++ side prints a line
    each time (``USDT: ... profiler_start``) that says nothing to someone counting a program."""
    import os
    import sys

    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real stderr (embedded interpreters): nothing to silence
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _arg_signature(a: Any) -> Any:
    # Float scalars (learning rates, bias corrections) change from step to step without changing
    # the work; integers (dimensions, sizes) and flags may change it.
    if isinstance(a, float):
        return float
    if isinstance(a, (int, bool, str)) or a is None:
        return a
    if isinstance(a, list):
        return tuple(_arg_signature(x) for x in a)
    sizes = getattr(a, "sizes", None)
    if sizes is not None:
        return (tuple(sizes), str(a.dtype))
    return type(a).__name__
