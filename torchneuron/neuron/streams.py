"""Streams and events of neuron devices, as ``torch.cuda.Stream`` and ``torch.cuda.Event``."""

from typing import Any, Optional

import torch

from ._utils import _get_device_index

__all__ = ["Event", "Stream", "StreamContext", "current_stream", "default_stream", "set_stream", "stream"]


class Stream(torch.Stream):
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

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs):
        if kwargs.get("stream_id") is not None:
            return super().__new__(cls, **kwargs)
        with torch.neuron.device(device):
            return super().__new__(cls, device=torch.device("neuron", torch.neuron.current_device()),
                                   priority=priority)

    def wait_event(self, event: "Event") -> None:
        """Make future work on this stream wait for ``event``."""
        event.wait(self)

    def wait_stream(self, stream: torch.Stream) -> None:
        """Make future work on this stream wait for all work queued on ``stream``."""
        self.wait_event(stream.record_event())

    def record_event(self, event: Optional["Event"] = None) -> "Event":
        """Record an event on this stream and return it."""
        event = Event() if event is None else event
        event.record(self)
        return event

    def __eq__(self, other):
        return isinstance(other, torch.Stream) and super().__eq__(other)

    def __hash__(self):
        return hash((self.stream_id, self.device_index, self.device_type))

    def __repr__(self):
        return f"<torch.neuron.Stream device=neuron:{self.device_index} stream_id={self.stream_id}>"


def _wrap(s: torch.Stream) -> Stream:
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


class Event(torch.Event):
    """A marker in a stream, to wait on or to time work with.

    Args:
        enable_timing: whether :meth:`elapsed_time` may be called.
        blocking: accepted for compatibility.
        interprocess: accepted for compatibility; must be False.

    Example::

        >>> start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
        >>> start.record(); y = x @ x; end.record(); end.synchronize()
        >>> start.elapsed_time(end)   # milliseconds
    """

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        if interprocess:
            raise ValueError("interprocess events are not supported on neuron")
        return super().__new__(cls, device="neuron", enable_timing=enable_timing, blocking=blocking)

    def record(self, stream: Optional[torch.Stream] = None) -> None:
        """Record the event on ``stream`` (default: the current stream)."""
        super().record(current_stream() if stream is None else stream)

    def wait(self, stream: Optional[torch.Stream] = None) -> None:
        """Make future work on ``stream`` (default: the current stream) wait for this event."""
        super().wait(current_stream() if stream is None else stream)

    def __repr__(self):
        return f"<torch.neuron.Event {'recorded' if self.event_id else 'uninitialized'}>"


def current_stream(device: Any = None) -> Stream:
    """Return the current stream of a device for this thread.

    Args:
        device: the device (default: the current one).
    """
    return _wrap(torch.accelerator.current_stream(torch.device("neuron", _get_device_index(device))))


def default_stream(device: Any = None) -> Stream:
    """Return the default stream of a device.

    Args:
        device: the device (default: the current one).
    """
    index = _get_device_index(device)
    return Stream(stream_id=0, device_index=index, device_type=torch.device("neuron").type.__len__() and current_stream(index).device_type)


def set_stream(stream: torch.Stream) -> None:
    """Make ``stream`` the current stream of its device for this thread."""
    if stream is not None:
        torch.accelerator.set_stream(stream)


class StreamContext:
    """Context manager that makes a stream current (and its device), then restores both.

    Args:
        stream: the stream; ``None`` makes this a no-op.
    """

    def __init__(self, stream: Optional[torch.Stream]):
        self.stream = stream
        self._prev_stream = None
        self._prev_device = None

    def __enter__(self):
        if self.stream is None:
            return self
        self._prev_device = torch.neuron.current_device()
        torch.neuron.set_device(self.stream.device_index)
        self._prev_stream = current_stream()
        set_stream(self.stream)
        return self

    def __exit__(self, *exc):
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
