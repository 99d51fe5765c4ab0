"""Callbacks on neuron device activity, in the structure of ``torch.cuda._gpu_trace``.

PyTorch's GPU trace (``c10::impl::GPUTrace``, on after ``torch._C._activate_gpu_trace()``)
fires ``torch.<device>._gpu_trace.<registry>.fire_callbacks`` from C++; for the
neuron device the caching allocator fires the memory registries. Neuron
streams and events made while tracing is on (:func:`torchneuron.neuron.streams.set_tracing`)
fire the stream and event registries from Python. Stream ids are
:func:`torchneuron.neuron.streams.stream_key` (stream id and device index in
one int); event ids are the ids of the event objects.

``EventElapsedTimeCallbacks`` has no CUDA counterpart: it hears ``Event.elapsed_time(end)``
(start and end event ids) before the time is read.
"""

from collections.abc import Callable

from torch._utils import CallbackRegistry

__all__ = [
    "DeviceSynchronizationCallbacks", "EventCreationCallbacks", "EventDeletionCallbacks",
    "EventElapsedTimeCallbacks", "EventRecordCallbacks", "EventSynchronizationCallbacks", "EventWaitCallbacks",
    "MemoryAllocationCallbacks", "MemoryDeallocationCallbacks", "StreamCreationCallbacks",
    "StreamSynchronizationCallbacks", "registries",
]

EventCreationCallbacks: "CallbackRegistry[int]" = CallbackRegistry("neuron event creation")
EventDeletionCallbacks: "CallbackRegistry[int]" = CallbackRegistry("neuron event deletion")
EventRecordCallbacks: "CallbackRegistry[int, int]" = CallbackRegistry("neuron event record")
EventWaitCallbacks: "CallbackRegistry[int, int]" = CallbackRegistry("neuron event wait")
EventElapsedTimeCallbacks: "CallbackRegistry[int, int]" = CallbackRegistry("neuron event elapsed time")
MemoryAllocationCallbacks: "CallbackRegistry[int]" = CallbackRegistry("neuron memory allocation")
MemoryDeallocationCallbacks: "CallbackRegistry[int]" = CallbackRegistry("neuron memory deallocation")
StreamCreationCallbacks: "CallbackRegistry[int]" = CallbackRegistry("neuron stream creation")
DeviceSynchronizationCallbacks: "CallbackRegistry[int]" = CallbackRegistry("neuron device synchronization")
StreamSynchronizationCallbacks: "CallbackRegistry[int]" = CallbackRegistry("neuron stream synchronization")
EventSynchronizationCallbacks: "CallbackRegistry[int]" = CallbackRegistry("neuron event synchronization")


def registries() -> dict[str, "CallbackRegistry"]:
    """Every registry of this module by name."""
    return {name: value for name, value in globals().items() if isinstance(value, CallbackRegistry)}


def remove_callback(registry: "CallbackRegistry", cb: Callable) -> None:
    """Take ``cb`` out of ``registry`` (PyTorch's registry has no remove)."""
    registry.callback_list[:] = [c for c in registry.callback_list if c is not cb]
