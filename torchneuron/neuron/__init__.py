"""``torch.neuron``: the neuron device, name for name like ``torch.cuda``.

Devices, memory, random number generators, streams and events of NeuronCore
accelerators (or their emulation). Reached as ``torch.neuron`` once
torchneuron is loaded, and through ``torch.accelerator`` and
``torch.get_device_module("neuron")``.
"""

from functools import lru_cache
from typing import Any, NamedTuple

import torch

from .. import _C
from . import _lazy, amp
from ._lazy import (  # noqa: F401  (torch.cuda's names, which PyTorch calls on the device module)
    DeferredNeuronCallError, _is_in_bad_fork, _lazy_call, _lazy_init, is_initialized,
)
from ._utils import _get_device_index

#: Whether the device is initialised here (:func:`_lazy_init` ran), as ``torch.cuda._initialized``; PyTorch
#: reads it (checkpointing stashes the device's RNG state only when it is true). ``_lazy`` sets it when
#: it initialises the devices.
_initialized = False


def _mark_initialized() -> None:
    global _initialized
    _initialized = True


_lazy._on_initialized.append(_mark_initialized)


def init() -> None:
    """Initialize the neuron devices, as ``torch.cuda.init``; the calls that need them do it by themselves."""
    _lazy_init()


# The submodules below use _lazy_call and _lazy_init (as torch.cuda's do).
from .memory import (  # noqa: E402
    empty_cache,
    host_memory_stats,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_peak_memory_stats,
)
from .random import (  # noqa: E402
    _get_generator,
    default_generators,
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from . import _gpu_trace  # noqa: E402,F401  (PyTorch's GPU trace fires torch.neuron._gpu_trace's callbacks)
from .streams import Event, Stream, StreamContext, current_stream, default_stream, set_stream, stream  # noqa: E402
from .eager import eager_mode, get_eager_mode, set_eager_mode  # noqa: E402

__all__ = [
    "Event", "OutOfMemoryError", "Stream", "StreamContext", "amp", "current_device", "current_stream",
    "default_generators", "default_stream", "device", "device_count", "device_of", "empty_cache",
    "get_amp_supported_dtype", "get_device_capability", "get_device_name", "get_device_properties",
    "get_rng_state", "get_rng_state_all", "host_memory_stats", "init", "initial_seed",
    "is_available", "is_bf16_supported", "is_initialized", "manual_seed", "manual_seed_all",
    "max_memory_allocated", "max_memory_reserved", "mem_get_info", "memory_allocated",
    "memory_reserved", "memory_stats", "memory_summary", "reset_accumulated_memory_stats",
    "reset_max_memory_allocated", "reset_peak_memory_stats", "seed", "seed_all", "set_device",
    "set_rng_state", "set_rng_state_all", "set_stream", "stream", "synchronize", "transfer_stats",
    "eager_mode", "enable_sanitizer", "get_eager_mode", "set_eager_mode",
    "reset_transfer_stats", "DeferredNeuronCallError",
]

OutOfMemoryError = torch.OutOfMemoryError


def is_available() -> bool:
    """Return whether a neuron device is present (without initialising the devices)."""
    return _C._device_count() > 0


def device_count() -> int:
    """Return the number of neuron devices (``TORCHNEURON_NUM_DEVICES`` for the emulator).

    Does not initialise the devices, so a process may fork after asking.
    """
    return _C._device_count()


def current_device() -> int:
    """Return the index of the current neuron device of this thread."""
    _lazy_init()
    return _C._current_device()


def set_device(device: Any) -> None:
    """Set the current neuron device of this thread.

    Args:
        device: an index, ``"neuron:N"`` or a ``torch.device``.
    """
    index = _get_device_index(device)
    if index >= 0:
        _lazy_init()
        _C._set_device(index)


class device:
    """Context manager that makes ``device`` the current neuron device.

    Args:
        device: an index, ``"neuron:N"``, a ``torch.device``, or ``None`` (no change).

    Example::

        >>> with torch.neuron.device(1):
        ...     x = torch.ones(2, device="neuron")   # on neuron:1
    """

    def __init__(self, device: Any):
        self.idx = -1 if device is None else _get_device_index(device)
        self.prev_idx = -1

    def __enter__(self):
        if self.idx < 0:
            return
        _lazy_init()
        self.prev_idx = _C._current_device()
        if self.idx != self.prev_idx:
            _C._set_device(self.idx)

    def __exit__(self, *exc):
        if self.idx >= 0 and self.prev_idx >= 0 and self.idx != self.prev_idx:
            _C._set_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager that makes the device of tensor ``obj`` current (a no-op for CPU tensors)."""

    def __init__(self, obj: torch.Tensor):
        super().__init__(obj.get_device() if obj.device.type == "neuron" else None)


class _NeuronDeviceProperties(NamedTuple):
    name: str
    total_memory: int
    multi_processor_count: int
    major: int
    minor: int

    def __repr__(self) -> str:
        return (f"_NeuronDeviceProperties(name='{self.name}', total_memory="
                f"{self.total_memory // (1024 * 1024)}MB, multi_processor_count={self.multi_processor_count})")


@lru_cache(maxsize=None)
def _properties(index: int) -> _NeuronDeviceProperties:
    p = _C._device_properties(index)
    return _NeuronDeviceProperties(p["name"], p["total_memory"], p["core_count"], 1, 0)


def get_device_properties(device: Any = None) -> _NeuronDeviceProperties:
    """Return the properties of a neuron device: ``name``, ``total_memory`` and more.

    Args:
        device: the device (default: the current one).
    """
    _lazy_init()
    return _properties(_get_device_index(device))


def get_device_name(device: Any = None) -> str:
    """Return the name of a neuron device.

    Args:
        device: the device (default: the current one).
    """
    return get_device_properties(device).name


def get_device_capability(device: Any = None) -> tuple[int, int]:
    """Return the (major, minor) capability of a neuron device."""
    p = get_device_properties(device)
    return p.major, p.minor


def synchronize(device: Any = None) -> None:
    """Wait for all work on all streams of a neuron device to finish.

    Args:
        device: the device (default: the current one).
    """
    _lazy_init()
    index = _get_device_index(device)
    _C._synchronize(index)
    if _gpu_trace.DeviceSynchronizationCallbacks.callback_list:
        _gpu_trace.DeviceSynchronizationCallbacks.fire_callbacks(index)


def enable_sanitizer(on_report: str = "raise") -> None:
    """Turn the stream sanitizer on (as ``TORCHNEURON_SANITIZER=1``); see :mod:`torchneuron.neuron._sanitizer`.

    Args:
        on_report: ``"raise"`` (stop at the first finding), ``"warn"`` (log each) or ``"record"`` (keep them
            for :func:`torchneuron.neuron._sanitizer.reports`).
    """
    from . import _sanitizer

    _sanitizer.enable(on_report)


def _sleep(cycles: int) -> None:
    """Occupy the current stream for ``cycles`` device clock cycles (at a nominal 1 GHz).

    With asynchronous streams (``TORCHNEURON_ASYNC=1``) the work is queued and the host goes on, as
    with ``torch.cuda._sleep``; otherwise the host waits as well.
    """
    _lazy_init()
    _C._sleep(max(int(cycles), 0))


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """Return whether bfloat16 is supported (it is)."""
    return True


def get_amp_supported_dtype() -> list[torch.dtype]:
    """Return the dtypes ``torch.autocast("neuron")`` accepts."""
    return [torch.bfloat16, torch.float16]


def transfer_stats() -> dict[str, int]:
    """Return counters of host/device traffic since start or the last reset.

    Keys: ``host_to_device_bytes``, ``device_to_host_bytes``,
    ``device_to_device_bytes``, ``host_to_device_copies``,
    ``device_to_host_copies`` and ``scalar_reads`` (``.item()`` and the like).
    """
    return dict(_C._transfer_stats())


def reset_transfer_stats() -> None:
    """Set the counters of :func:`transfer_stats` to zero."""
    _C._reset_transfer_stats()


def __getattr__(name: str) -> Any:
    # Inductor looks these up on torch.neuron at its first compile; loading them then keeps Inductor out of `import torch`.
    # CppWrapperCodegen stays absent: given it too, Inductor would register neuron over torchneuron's own registration.
    if name in ("Scheduling", "PythonWrapperCodegen"):
        from ..compile import inductor, registration  # noqa: F401  (registration: Inductor's, for the device)
        return getattr(inductor, name)
    raise AttributeError(f"module 'torch.neuron' has no attribute {name!r}")


def _sanitizer_from_env() -> None:
    import os

    value = os.environ.get("TORCHNEURON_SANITIZER", "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return
    enable_sanitizer(value if value in ("warn", "record", "raise") else "raise")


_sanitizer_from_env()
