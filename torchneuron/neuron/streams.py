"""Streams and events of neuron devices, as ``torch.cuda.Stream`` and ``torch.cuda.Event``.

``torch.neuron.Stream(...)`` and ``torch.neuron.Event(...)`` build PyTorch's
generic ``torch.Stream`` and ``torch.Event`` on a neuron device, so they are
accepted wherever PyTorch takes a stream or an event; ``isinstance(s,
torch.neuron.Stream)`` holds for any neuron stream.

While tracing is on (:func:`set_tracing`, which the stream sanitizer turns on),
the streams and events this module hands out are subclasses of those
(``_TracedStream``, ``_TracedEvent``) that report their synchronizations to
``torch.neuron._gpu_trace``: event record, wait, synchronize and a completed
``query``; stream synchronize, ``wait_stream``, ``wait_event``; ``elapsed_time``.
"""

import itertools
from typing import Any, Optional

import torch

from . import _gpu_trace
from ._utils import _get_device_index

__all__ = ["Event", "Stream", "StreamContext", "current_stream", "default_stream", "set_stream", "set_tracing",
           "stream", "stream_key"]

_tracing = False


def set_tracing(on: bool) -> bool:
    """Make the streams and events handed out from now on report to ``torch.neuron._gpu_trace``.

    Returns the previous setting.
    """
    global _tracing
    previous, _tracing = _tracing, bool(on)
    return previous


def stream_key(stream: torch.Stream) -> int:
    """One int for a neuron stream (its id and device index), as ``torch.neuron._gpu_trace`` names streams."""
    return (int(stream.stream_id) << 8) | int(stream.device_index)


_wait_events = itertools.count(-1, -1)  # ids of the events wait_stream records (negative: never an object's id)


class _TracedStream(torch.Stream):
    """A neuron stream that reports its synchronizations to ``torch.neuron._gpu_trace``."""

    def synchronize(self) -> None:  # noqa: D102
        super().synchronize()
        _gpu_trace.StreamSynchronizationCallbacks.fire_callbacks(stream_key(self))

    def query(self) -> bool:  # noqa: D102
        done = super().query()
        if done:  # the host knows the stream's work is finished: as good as a synchronize
            _gpu_trace.StreamSynchronizationCallbacks.fire_callbacks(stream_key(self))
        return done

    def wait_event(self, event: torch.Event) -> None:  # noqa: D102
        super().wait_event(event)
        _gpu_trace.EventWaitCallbacks.fire_callbacks(id(event), stream_key(self))

    def wait_stream(self, stream: torch.Stream) -> None:  # noqa: D102
        super().wait_stream(stream)
        event = next(_wait_events)  # what wait_stream does: an event recorded on `stream`, waited on here
        _gpu_trace.EventRecordCallbacks.fire_callbacks(event, stream_key(stream))
        _gpu_trace.EventWaitCallbacks.fire_callbacks(event, stream_key(self))
        _gpu_trace.EventDeletionCallbacks.fire_callbacks(event)

    def record_event(self, event: Optional[torch.Event] = None) -> torch.Event:  # noqa: D102
        if event is None:
            event = _TracedEvent(device=torch.device("neuron", self.device_index))
        event.record(self)
        return event


class _TracedEvent(torch.Event):
    """A neuron event that reports its record, wait and synchronizations to ``torch.neuron._gpu_trace``.

    PyTorch's ``Event.elapsed_time`` accepts only a ``torch.Event`` itself as the end
    event, so a timing event keeps a plain twin recorded at the same points, and
    times are read between twins.
    """

    def __init__(self, device: Any = None, *, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False) -> None:
        self._twin = torch.Event(device=device, enable_timing=True) if enable_timing else None

    def _stream(self, stream: Optional[torch.Stream]) -> torch.Stream:
        return stream if stream is not None else current_stream(self.device)

    def record(self, stream: Optional[torch.Stream] = None) -> None:  # noqa: D102
        stream = self._stream(stream)
        super().record(stream)
        if self._twin is not None:
            self._twin.record(stream)
        _gpu_trace.EventRecordCallbacks.fire_callbacks(id(self), stream_key(stream))

    def wait(self, stream: Optional[torch.Stream] = None) -> None:  # noqa: D102
        stream = self._stream(stream)
        super().wait(stream)
        _gpu_trace.EventWaitCallbacks.fire_callbacks(id(self), stream_key(stream))

    def synchronize(self) -> None:  # noqa: D102
        super().synchronize()
        _gpu_trace.EventSynchronizationCallbacks.fire_callbacks(id(self))

    def query(self) -> bool:  # noqa: D102
        done = super().query()
        if done:
            _gpu_trace.EventSynchronizationCallbacks.fire_callbacks(id(self))
        return done

    def elapsed_time(self, end_event: torch.Event) -> float:  # noqa: D102
        _gpu_trace.EventElapsedTimeCallbacks.fire_callbacks(id(self), id(end_event))
        end = getattr(end_event, "_twin", None) or end_event
        if self._twin is None or not isinstance(end_event, _TracedEvent) or end is end_event:
            return super().elapsed_time(end)
        return self._twin.elapsed_time(end)


def _traced(stream: torch.Stream) -> torch.Stream:
    if not _tracing or isinstance(stream, _TracedStream):
        return stream
    return _TracedStream(stream_id=stream.stream_id, device_index=stream.device_index,
                         device_type=stream.device_type)


class _OnNeuron(type):
    """Metaclass: instances are PyTorch's generic objects whose device is neuron."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls._generic) and torch.device(obj.device).type == "neuron"


class Stream(metaclass=_OnNeuron):
    """A queue of work on a neuron device; work on one stream runs in order.

    Args:
        device: the device (default: the current one).
        priority: accepted for compatibility; neuron streams have one priority.

    Example::

        >>> s = torch.neuron.Stream()
        >>> with torch.neuron.stream(s):
        ...     y = x * 2
        >>> s.synchronize()
    """

    _generic = torch.Stream

    def __new__(cls, device: Any = None, priority: int = 0) -> torch.Stream:
        made = torch.Stream(device=torch.device("neuron", _get_device_index(device)), priority=priority)
        if _tracing:
            made = _traced(made)
            _gpu_trace.StreamCreationCallbacks.fire_callbacks(stream_key(made))
        return made


class Event(metaclass=_OnNeuron):
    """A marker in a stream, to wait on or to time work with.

    Args:
        enable_timing: whether ``elapsed_time`` may be called.
        blocking: accepted for compatibility.
        interprocess: must be False; neuron events are not shared between processes.

    Example::

        >>> start = torch.neuron.Event(enable_timing=True)
        >>> end = torch.neuron.Event(enable_timing=True)
        >>> start.record(); y = x @ x; end.record(); end.synchronize()
        >>> start.elapsed_time(end)   # milliseconds
    """

    _generic = torch.Event

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> torch.Event:
        if interprocess:
            raise ValueError("interprocess events are not supported on neuron")
        kind = _TracedEvent if _tracing else torch.Event
        return kind(device="neuron", enable_timing=enable_timing, blocking=blocking)


def current_stream(device: Any = None) -> torch.Stream:
    """Return the current stream of a device for this thread.

    Args:
        device: the device (default: the current one).
    """
    return _traced(torch.accelerator.current_stream(torch.device("neuron", _get_device_index(device))))


def default_stream(device: Any = None) -> torch.Stream:
    """Return the default stream of a device.

    Args:
        device: the device (default: the current one).
    """
    current = current_stream(device)
    return _traced(torch.Stream(stream_id=0, device_index=current.device_index, device_type=current.device_type))


def set_stream(stream: Optional[torch.Stream]) -> None:
    """Make ``stream`` the current stream of its device for this thread (``None``: no change)."""
    if stream is not None:
        torch.accelerator.set_stream(stream)


class StreamContext:
    """Context manager that makes a stream current (and its device), then restores both.

    Args:
        stream: the stream; ``None`` makes this a no-op.
    """

    def __init__(self, stream: Optional[torch.Stream]):
        self.stream = stream
        self._prev_stream: Optional[torch.Stream] = None
        self._prev_device: Optional[int] = None

    def __enter__(self) -> "StreamContext":
        if self.stream is not None:
            self._prev_device = torch.neuron.current_device()
            torch.neuron.set_device(self.stream.device_index)
            self._prev_stream = current_stream()
            set_stream(self.stream)
        return self

    def __exit__(self, *exc: Any) -> bool:
        if self.stream is not None:
            set_stream(self._prev_stream)
            torch.neuron.set_device(self._prev_device)
        return False


def stream(stream: Optional[torch.Stream]) -> StreamContext:
    """Return a context manager that makes ``stream`` current.

    Args:
        stream: the stream; ``None`` is accepted and does nothing.
    """
    return StreamContext(stream)
