"""The neuron stream sanitizer: finds the synchronization bugs a device running asynchronously would expose.

By default the emulated NeuronCore finishes every kernel and copy before control
returns, so a program that forgets a synchronization gives correct results here
and wrong ones on an accelerator that runs asynchronously from the host. With
asynchronous streams (``TORCHNEURON_ASYNC=1``; strict mode implies it) each
stream's kernels run on its worker thread while the host goes on, and such a
program gives wrong results (or an error) here too, when the race goes the
wrong way and without saying where. What the sanitizer reports does not depend
on the mode: its dispatch mode sees each operator on the host thread that
launches it, and it follows the order the program asks for (streams, events,
synchronizations), not the order the kernels ran in, so it reports the same
bugs in both modes, every time:

* **unsynchronized access**: a kernel on one stream reads or writes a tensor
  that a kernel on another stream wrote (or, for a write, read) with nothing
  ordering the two (``wait_stream``, ``wait_event``, a synchronize);
* **host access before synchronization**: the host reads (or writes) the
  destination of a ``non_blocking`` device-to-host copy into pinned memory
  before a stream, event or device synchronize has finished the copy;
* **pinned buffer reused**: the host writes the pinned source of a
  ``non_blocking`` host-to-device copy before the copy is known to have finished;
* **free without record_stream**: a device block is freed while a stream other
  than the one it was allocated on may still use it (no ``record_stream``, no
  wait of the allocating stream);
* **elapsed_time before synchronization**: ``Event.elapsed_time`` is read before
  the events are known complete (on CUDA this raises ``cudaErrorNotReady``).

Each report names the bug and the Python source lines of both accesses.

It is built on PyTorch's CUDA sanitizer (``torch.cuda._sanitizer``): its
``EventHandler`` (the happens-before bookkeeping of streams, events and host
synchronizations, by sequence numbers) and ``ArgumentHandler`` (which
arguments of an operator it reads and writes, from the schema) are used as they
are, for neuron tensors; what is neuron's own is the dispatch mode, the host
side (pending copies), frees (through PyTorch's GPU trace, which the neuron
caching allocator fires while the sanitizer is on) and the reports. Streams and events report to it
through ``torch.neuron._gpu_trace`` (see :mod:`torchneuron.neuron.streams`).

What it does not see: work on streams or events made before it was turned on,
streams reached only through ``torch.accelerator`` (not ``torch.neuron``),
host reads that dispatch no operator (``.numpy()``, ``.tolist()``, a raw
``data_ptr()``), and timing with the host's clock (``time.perf_counter()``
around unsynchronized work: the host reads no tensor, so nothing is dispatched).
Two views of one storage count as the same tensor.

Turn it on with ``TORCHNEURON_SANITIZER=1`` (``=warn`` logs and continues) or
:func:`enable`; ``torchneuron doctor --sanitize SCRIPT`` runs a script under it.

Example::

    >>> torchneuron.neuron._sanitizer.enable("record")
    >>> ...                                    # the program
    >>> for report in torchneuron.neuron._sanitizer.reports():
    ...     print(report)
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch.cuda._sanitizer import FACTORY_FUNCTION_REGEX, Access, ArgumentHandler, EventHandler
from torch.utils._python_dispatch import TorchDispatchMode

from . import _gpu_trace, streams

__all__ = ["NeuronSanitizerError", "Report", "disable", "enable", "is_enabled", "reports"]

log = logging.getLogger("torchneuron")
aten = torch.ops.aten

MODES = ("raise", "warn", "record")

#: The kinds of report, with the name each message starts with.
KINDS = {
    "unsynchronized-access": "unsynchronized access between streams",
    "host-read-before-sync": "host access to a non_blocking copy's destination before synchronization",
    "pinned-buffer-reused": "pinned host buffer written while a non_blocking copy from it may still run",
    "free-without-record-stream": "device memory freed while another stream may still use it",
    "elapsed-time-before-sync": "Event.elapsed_time read before the events completed",
}

_SKIP_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch, sys.modules["torchneuron"]))


@dataclass
class Site:
    """Where in the user's program an access happened: the innermost frame outside torch and torchneuron."""

    filename: str
    lineno: int
    line: str
    what: str  # "stream 33 on neuron:0 writing to ... by aten::mul.Tensor", "the host reading ..."

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno}: {self.line}"


@dataclass
class Report:
    """One finding of the sanitizer.

    Attributes:
        kind: one of :data:`KINDS`.
        sites: the accesses involved, the current one first.
        detail: what happened, in a sentence.
        fix: what to change.
    """

    kind: str
    sites: list[Site]
    detail: str
    fix: str
    stacks: list[traceback.StackSummary] = field(default_factory=list, repr=False)

    @property
    def title(self) -> str:
        """The bug's name and the line it was found at."""
        where = f" at {self.sites[0].filename}:{self.sites[0].lineno}" if self.sites else ""
        return f"{KINDS[self.kind]}{where}"

    def __str__(self) -> str:
        lines = [f"neuron sanitizer: {self.title}", f"  {self.detail}"]
        for label, site in zip(("this access", "racing with"), self.sites):
            lines.append(f"  {label}: {site.what}")
            lines.append(f"    {site}")
        lines.append(f"  fix: {self.fix}")
        return "\n".join(lines)


class NeuronSanitizerError(RuntimeError):
    """Raised by the sanitizer in ``"raise"`` mode; ``reports`` holds the findings."""

    def __init__(self, reports: list[Report]):
        self.reports = reports
        super().__init__("\n\n".join(str(r) for r in reports))


def _describe_stream(key: Any) -> str:
    if isinstance(key, int) and key >= 0:
        return f"stream {key >> 8} on neuron:{key & 0xFF}" + (" (default)" if key >> 8 == 0 else "")
    return f"stream {key}"


def _capture() -> traceback.StackSummary:
    stack = traceback.StackSummary.extract(traceback.walk_stack(inspect.currentframe()), lookup_lines=False)
    stack.reverse()
    return stack


def _user_frame(stack: traceback.StackSummary) -> Optional[traceback.FrameSummary]:
    for frame in reversed(stack):
        name = frame.filename
        if name.startswith(_SKIP_DIRS) or name.startswith("<frozen") or name == __file__:
            continue
        if os.sep + "contextlib.py" in name or os.sep + "threading.py" in name:
            continue
        return frame
    return stack[-1] if len(stack) else None


def _site(stack: traceback.StackSummary, what: str) -> Site:
    frame = _user_frame(stack)
    if frame is None:
        return Site("<unknown>", 0, "", what)
    line = frame.line or ""
    return Site(frame.filename, frame.lineno or 0, line.strip(), what)


def _access_what(access: Access) -> str:
    name = getattr(access.operator, "name", str(access.operator))
    return f"{_describe_stream(access.stream)} {access.type} it in {name}"


class _NeuronArguments(ArgumentHandler):
    """PyTorch's argument handler for neuron tensors (keyed by their storage's block); CPU tensors kept apart."""

    def __init__(self, host: bool) -> None:
        super().__init__()
        self.host = host  # also collect CPU tensors (some host buffer is pending)
        self.host_read: dict[int, torch.Tensor] = {}
        self.host_written: dict[int, torch.Tensor] = {}
        self.device: Optional[torch.device] = None

    def _handle_argument(self, value: Any, is_write: bool, metadata_only: bool, name: Optional[str] = None,
                         is_output: bool = False) -> None:
        if not isinstance(value, torch.Tensor):
            return
        kind = value.device.type
        if kind == "neuron":
            key = _storage_key(value)
            if key is None:
                return
            if self.device is None:
                self.device = value.device
            if is_write:
                self.dataptrs_written.add(key)
            elif not metadata_only:
                self.dataptrs_read.add(key)
            self.tensor_aliases.setdefault(key, [])
            if name is not None:
                self.tensor_aliases[key].append(name)
            if is_output:
                self.outputs.add(key)
        elif self.host and kind == "cpu" and not metadata_only:
            key = _storage_key(value)
            if key is not None:
                (self.host_written if is_write else self.host_read)[key] = value


def _storage_key(t: torch.Tensor) -> Optional[int]:
    try:
        ptr = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # sparse, nested and other storage-less tensors
        return None
    return ptr or None


@dataclass
class _PendingCopy:
    kind: str            # "d2h" (host buffer is the destination) or "h2d" (host buffer is the source)
    stream: int
    seq_num: int
    stack: traceback.StackSummary
    operator: str


class _State(EventHandler):
    """PyTorch's happens-before bookkeeping, plus neuron's host side and frees."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: dict[int, _PendingCopy] = {}           # host storage -> unfinished non_blocking copy
        self.alloc_stream: dict[int, int] = {}               # device block -> stream it was allocated on
        self.users: dict[int, dict[int, Access]] = {}        # device block -> stream -> its last access
        self.recorded: dict[int, set[int]] = {}              # device block -> streams given by record_stream
        self.elapsed_checked: set[tuple[int, int]] = set()

    # -- host synchronization ------------------------------------------------------------------
    def host_done(self, stream: int, seq_num: int) -> bool:
        return self.syncs.host_sync_state.get(stream, -1) >= seq_num

    def event_done(self, event: int) -> bool:
        state = self.syncs.recorded_sync_states.get(event)
        if state is None:
            return True  # never recorded: nothing to wait for
        return all(self.host_done(stream, seq) for stream, seq in state.items()
                   if stream in self.syncs.host_sync_state and seq > 0)

    def _forget_finished(self) -> None:
        for key in [k for k, p in self.pending.items() if self.host_done(p.stream, p.seq_num)]:
            del self.pending[key]

    def sync_device(self, device: int) -> None:
        syncs = self.syncs
        for stream, state in syncs.current_sync_states.items():
            if isinstance(stream, int) and (stream & 0xFF) == device:
                syncs.host_sync_state[stream] = max(syncs.host_sync_state.get(stream, -1), state.get(stream, -1))
        for state in syncs.current_sync_states.values():
            syncs._state_wait_for_other(state, syncs.host_sync_state)
        self._forget_finished()

    def sync_stream(self, stream: int) -> None:
        self._handle_stream_synchronization(stream)
        self._forget_finished()

    def sync_event(self, event: int) -> None:
        self._handle_event_synchronization(event)
        self._forget_finished()

    def wait_event(self, event: int, stream: int) -> None:
        self._handle_event_wait(event, stream)

    def record_event(self, event: int, stream: int) -> None:
        self._handle_event_record(event, stream)


class _Sanitizer:
    """The sanitizer's state, its dispatch mode and its callbacks.

    About 240 lines, on purpose: the device's trace callbacks (events, streams, allocations) and the
    dispatch mode's per-operator check read and write one state under one lock, in the order the
    runtime reports them; split in two, each half would need the other's lock and state.
    """

    def __init__(self, on_report: str) -> None:
        self.on_report = on_report
        self.state = _State()
        self.reports: list[Report] = []
        self.unraised: list[Report] = []  # found in a callback, raised at the next operator
        self.lock = threading.RLock()
        self.mode = _Mode(self)
        self.callbacks = {
            "EventRecordCallbacks": self._event_record,
            "EventWaitCallbacks": self._event_wait,
            "EventSynchronizationCallbacks": self._event_sync,
            "EventDeletionCallbacks": self._event_deletion,
            "EventElapsedTimeCallbacks": self._elapsed_time,
            "StreamSynchronizationCallbacks": self._stream_sync,
            "StreamCreationCallbacks": self._stream_creation,
            "DeviceSynchronizationCallbacks": self._device_sync,
            "MemoryAllocationCallbacks": self._allocation,
            "MemoryDeallocationCallbacks": self._deallocation,
        }

    # -- reporting -----------------------------------------------------------------------------
    def report(self, report: Report, *, deferred: bool = False) -> None:
        self.reports.append(report)
        if self.on_report == "warn":
            log.warning("%s", report)
        elif self.on_report == "raise":
            if deferred:
                log.error("%s", report)
                self.unraised.append(report)
            else:
                raise NeuronSanitizerError([report])

    def raise_deferred(self) -> None:
        if self.unraised:
            found, self.unraised = self.unraised, []
            raise NeuronSanitizerError(found)

    # -- callbacks from torch.neuron._gpu_trace --------------------------------------------------
    def _event_record(self, event: int, stream: int) -> None:
        with self.lock:
            self.state.record_event(event, stream)

    def _event_wait(self, event: int, stream: int) -> None:
        with self.lock:
            self.state.wait_event(event, stream)

    def _event_sync(self, event: int) -> None:
        with self.lock:
            self.state.sync_event(event)

    def _event_deletion(self, event: int) -> None:
        with self.lock:
            self.state.syncs.recorded_sync_states.pop(event, None)

    def _stream_sync(self, stream: int) -> None:
        with self.lock:
            self.state.sync_stream(stream)

    def _stream_creation(self, stream: int) -> None:
        with self.lock:
            self.state.syncs.create_stream(stream)

    def _device_sync(self, device: int) -> None:
        with self.lock:
            self.state.sync_device(device)

    def _elapsed_time(self, start: int, end: int) -> None:
        with self.lock:
            late = [e for e in (end, start) if not self.state.event_done(e)]
            if not late:
                return
            stack = _capture()
            self.report(Report(
                "elapsed-time-before-sync",
                [_site(stack, "Event.elapsed_time read on the host")],
                "the end event was recorded on a stream the host has not synchronized with since, so on a device "
                "that runs asynchronously the event has not completed (CUDA raises cudaErrorNotReady here) and a "
                "time taken this way does not cover the work",
                "call end_event.synchronize() (or torch.neuron.synchronize()) before elapsed_time",
                [stack]))

    def _allocation(self, ptr: int) -> None:
        with self.lock:
            state = self.state
            state.users.pop(ptr, None)
            state.recorded.pop(ptr, None)
            state.tensors_accessed.accesses.pop(ptr, None)
            device = torch.device("neuron", torch.neuron.current_device())  # the accelerator may be another
            state.alloc_stream[ptr] = streams.stream_key(torch.accelerator.current_stream(device))

    def _deallocation(self, ptr: int) -> None:
        if sys.is_finalizing():  # the interpreter frees what is left: nothing runs after that
            return
        with self.lock:
            state = self.state
            users = state.users.pop(ptr, {})
            recorded = state.recorded.pop(ptr, set())
            home = state.alloc_stream.pop(ptr, None)
            state.tensors_accessed.accesses.pop(ptr, None)
            if home is None:
                return
            for stream, access in users.items():
                if stream == home or stream in recorded:
                    continue
                if state.syncs.is_ordered_after(home, access.seq_num, stream):
                    continue
                stack = _capture()
                self.report(Report(
                    "free-without-record-stream",
                    [_site(stack, f"the tensor's last reference dropped; its block goes back to "
                                  f"{_describe_stream(home)}, which may reuse it at once"),
                     _site(access.stack_trace, _access_what(access))],
                    f"the block was allocated on {_describe_stream(home)} and used on {_describe_stream(stream)}; "
                    f"nothing makes {_describe_stream(home)} wait for that use, so the caching allocator may hand "
                    "the memory to a new tensor while the other stream still reads or writes it",
                    f"call tensor.record_stream(<{_describe_stream(stream)}>) after using it there, or make the "
                    f"allocating stream wait (wait_stream / wait_event) before the tensor is freed",
                    [stack, access.stack_trace]), deferred=True)

    # -- operators -------------------------------------------------------------------------------
    def on_operator(self, func: Any, args: tuple, kwargs: dict) -> Any:
        state = self.state
        if func is aten.record_stream.default:
            tensor, stream = args[0], args[1]
            out = func(*args, **kwargs)
            key = _storage_key(tensor) if tensor.device.type == "neuron" else None
            if key is not None:
                with self.lock:
                    state.recorded.setdefault(key, set()).add(streams.stream_key(stream))
            return out
        self.raise_deferred()
        is_factory = bool(FACTORY_FUNCTION_REGEX.match(func._schema.name))
        handler = _NeuronArguments(host=bool(state.pending))
        handler.parse_inputs(func._schema, args, kwargs, is_factory=is_factory)
        if handler.host_read or handler.host_written:
            self._check_host(func, handler)
        outputs = func(*args, **kwargs)
        handler.parse_outputs(func._schema, outputs, is_factory=is_factory)
        if handler.device is None:  # no neuron tensor: a host operator
            return outputs
        stream = streams.stream_key(torch.accelerator.current_stream(handler.device))
        with self.lock:
            errors = state._handle_kernel_launch(
                stream, handler.dataptrs_read - handler.dataptrs_written, handler.dataptrs_written,
                handler.outputs, func._schema, handler.tensor_aliases)
            seq = state.seq_num
            touched = handler.dataptrs_read | handler.dataptrs_written
            for key in touched:
                info = state.tensors_accessed.accesses.get(key)
                if info is None:
                    continue
                if info.write is not None and info.write.seq_num == seq:
                    access = info.write
                else:
                    access = next((r for r in reversed(info.reads) if r.seq_num == seq), None)
                if access is not None:
                    state.users.setdefault(key, {})[stream] = access
            self._note_copy(func, args, kwargs, outputs, stream, seq)
        for error in errors:
            current, previous = error.current_access, error.previous_access
            self.report(Report(
                "unsynchronized-access",
                [_site(current.stack_trace, _access_what(current)),
                 _site(previous.stack_trace, _access_what(previous))],
                f"{_describe_stream(current.stream)} uses a tensor that {_describe_stream(previous.stream)} "
                f"{'wrote' if previous.type.name == 'WRITE' else 'read'} with no synchronization between "
                "the two: on a device that runs streams concurrently they may overlap",
                f"make the second stream wait for the first before the access, e.g. "
                f"torch.neuron.current_stream().wait_stream(other) or event.record() / event.wait()",
                [current.stack_trace, previous.stack_trace]))
        return outputs

    def _note_copy(self, func: Any, args: tuple, kwargs: dict, outputs: Any, stream: int, seq: int) -> None:
        """Host side of a copy between neuron and CPU memory: pending if non_blocking and pinned, else a sync."""
        if func is aten._to_copy.default:
            src, dst, non_blocking = args[0], outputs, kwargs.get("non_blocking", False)
        elif func is aten.copy_.default:
            dst, src = args[0], args[1]
            non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
        else:
            if func is aten._local_scalar_dense.default:  # .item(): the host waits for the stream
                self.state.sync_stream(stream)
            return
        if not isinstance(dst, torch.Tensor) or not isinstance(src, torch.Tensor):
            return
        to_host = dst.device.type == "cpu" and src.device.type == "neuron"
        from_host = src.device.type == "cpu" and dst.device.type == "neuron"
        if not (to_host or from_host):
            return
        host = dst if to_host else src
        if non_blocking and host.is_pinned():
            key = _storage_key(host)
            if key is not None:
                self.state.pending[key] = _PendingCopy("d2h" if to_host else "h2d", stream, seq, _capture(),
                                                       func._schema.name)
        elif to_host:
            self.state.sync_stream(stream)  # a blocking copy to the host waits for its stream

    def _check_host(self, func: Any, handler: _NeuronArguments) -> None:
        state = self.state
        with self.lock:
            state._forget_finished()
            found = []
            for key, tensor in list(handler.host_read.items()) + list(handler.host_written.items()):
                copy = state.pending.get(key)
                if copy is None:
                    continue
                writing = key in handler.host_written
                if copy.kind == "h2d" and not writing:
                    continue  # reading the source of a copy in flight is safe
                found.append((key, copy, writing))
            for key, copy, writing in found:
                state.pending.pop(key, None)  # one report per copy
                stack = _capture()
                verb = "writing" if writing else "reading"
                if copy.kind == "d2h":
                    self.report(Report(
                        "host-read-before-sync",
                        [_site(stack, f"the host {verb} it in {func._schema.name}"),
                         _site(copy.stack, f"{_describe_stream(copy.stream)} copying into it "
                                           f"({copy.operator}, non_blocking=True)")],
                        "the copy from the device was issued with non_blocking=True into pinned memory and nothing "
                        "since has waited for it: on a device that runs asynchronously the host sees the buffer "
                        "before (or while) the data arrives",
                        "synchronize before using the result: torch.neuron.synchronize(), stream.synchronize(), or "
                        "record an event after the copy and call event.synchronize()",
                        [stack, copy.stack]))
                else:
                    self.report(Report(
                        "pinned-buffer-reused",
                        [_site(stack, f"the host writing it in {func._schema.name}"),
                         _site(copy.stack, f"{_describe_stream(copy.stream)} copying from it "
                                           f"({copy.operator}, non_blocking=True)")],
                        "the pinned buffer is the source of a non_blocking copy to the device that nothing has waited "
                        "for: on a device that runs asynchronously the copy may still be reading it, and sends the "
                        "new contents instead of the old",
                        "record an event after the copy and call event.synchronize() before refilling the buffer, "
                        "or use a fresh (or double) buffer per copy",
                        [stack, copy.stack]))


class _Mode(TorchDispatchMode):
    """The dispatch mode that shows every operator to the sanitizer."""

    def __init__(self, sanitizer: _Sanitizer) -> None:
        super().__init__()
        self.sanitizer = sanitizer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: D105
        return self.sanitizer.on_operator(func, args, kwargs or {})


_active: Optional[_Sanitizer] = None
_previous_tracing = False


def enable(on_report: str = "raise") -> None:
    """Turn the sanitizer on for this thread's operators (and the streams and events made from now on).

    Args:
        on_report: ``"raise"``: raise :class:`NeuronSanitizerError` at the first finding (a finding made
            when memory is freed is raised at the next operator); ``"warn"``: log each finding on the
            ``torchneuron`` logger and go on; ``"record"``: only keep them for :func:`reports`.

    Calling it while it is on changes ``on_report`` and keeps what it has seen.
    """
    global _active, _previous_tracing
    if on_report not in MODES:
        raise ValueError(f"enable_sanitizer: on_report must be one of {', '.join(MODES)}, got {on_report!r}")
    if _active is not None:
        _active.on_report = on_report
        return
    sanitizer = _Sanitizer(on_report)
    torch._C._activate_gpu_trace()  # PyTorch's GPU trace on (for good: it has no off switch)
    torch.ops.torchneuron._trace_allocations(True)  # the caching allocator fires it, until disable()
    registries = _gpu_trace.registries()
    for name, callback in sanitizer.callbacks.items():
        registries[name].add_callback(callback)
    _previous_tracing = streams.set_tracing(True)
    sanitizer.mode.__enter__()
    _active = sanitizer
    log.info("neuron stream sanitizer on (%s)", on_report)


def disable() -> list[Report]:
    """Turn the sanitizer off; returns its reports."""
    global _active
    sanitizer, _active = _active, None
    if sanitizer is None:
        return []
    sanitizer.mode.__exit__(None, None, None)
    torch.ops.torchneuron._trace_allocations(False)
    registries = _gpu_trace.registries()
    for name, callback in sanitizer.callbacks.items():
        _gpu_trace.remove_callback(registries[name], callback)
    streams.set_tracing(_previous_tracing)
    return list(sanitizer.reports)


def is_enabled() -> bool:
    """Whether the sanitizer is on."""
    return _active is not None


def reports() -> list[Report]:
    """The findings so far (empty when the sanitizer is off)."""
    return list(_active.reports) if _active is not None else []
