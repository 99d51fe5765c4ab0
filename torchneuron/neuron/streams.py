"""Streams and events of neuron devices, as ``torch.cuda.Stream`` and ``torch.cuda.Event``.

``torch.neuron.Stream(...)`` and ``torch.neuron.Event(...)`` build PyTorch's
generic ``torch.Stream`` and ``torch.Event`` on a neuron device, so they are
accepted wherever PyTorch takes a stream or an event; ``isinstance(s,
torch.neuron.Stream)`` holds for any neuron stream.
"""

from typing import Any, Optional

import torch

from ._utils import _get_device_index

__all__ = ["Event", "Stream", "StreamContext", "current_stream", "default_stream", "set_stream", "stream"]


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
        return torch.Stream(device=torch.device("neuron", _get_device_index(device)), priority=priority)


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
        return torch.Event(device="neuron", enable_timing=enable_timing, blocking=blocking)


def current_stream(device: Any = None) -> torch.Stream:
    """Return the current stream of a device for this thread.

    Args:
        device: the device (default: the current one).
    """
    return torch.accelerator.current_stream(torch.device("neuron", _get_device_index(device)))


def default_stream(device: Any = None) -> torch.Stream:
    """Return the default stream of a device.

    Args:
        device: the device (default: the current one).
    """
    current = current_stream(device)
    return torch.Stream(stream_id=0, device_index=current.device_index, device_type=current.device_type)


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
