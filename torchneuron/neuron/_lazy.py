"""Lazy initialisation of the neuron devices and fork poisoning, as ``torch.cuda``'s (``torch.neuron``'s
``_lazy_init``, ``_lazy_call``, ``is_initialized`` and ``_is_in_bad_fork``; the package re-exports them).

The submodules that queue calls or need the devices (``random``) import them from here, so that no
module of ``torch.neuron`` imports the package it belongs to.
"""

import threading
import traceback
from typing import Any, Callable

from torch._utils import _LazySeedTracker

from .. import _C

# ---- lazy initialisation and fork poisoning, as torch.cuda's ------------------------------------------
#
# Importing torch or torchneuron creates no device state. The devices are initialised at their first
# use: a tensor, an allocation, a stream, an event or a generator on a device, or a torch.neuron call
# that needs them (_lazy_init; PyTorch's Python bindings call it before they make a tensor on the
# device). Calls made before that which only set state (manual_seed, set_rng_state) wait in a queue
# (_lazy_call) and run at initialisation, so `import torch; torch.manual_seed(0)` leaves the devices
# alone. A process forked after the initialisation cannot use the devices: its first use raises
# RuntimeError("Cannot re-initialize neuron in forked subprocess. ..."), from Python and from C++
# alike (csrc/aten/device_init.cpp keeps the state and registers the fork handlers). A process forked
# before it initialises the devices itself, and a forked child that never uses them (a DataLoader
# worker) is unaffected.

_lazy_init_done = False
_on_initialized: list[Callable[[], None]] = []  # told when _lazy_init has run (the package's _initialized)
_tls = threading.local()
_initialization_lock = threading.Lock()
_queued_calls: list[tuple[Callable[[], None], list[str]]] = []  # run at initialisation
_lazy_seed_tracker = _LazySeedTracker()

_BAD_FORK_MESSAGE = (
    "Cannot re-initialize neuron in forked subprocess. To use neuron with multiprocessing, you must use the "
    "'spawn' start method"
)


class DeferredNeuronCallError(Exception):
    """A call queued before initialisation (:func:`_lazy_call`) failed when it ran."""


def _is_in_bad_fork() -> bool:
    """Return whether this process was forked after its parent initialised the neuron devices."""
    return _C._is_in_bad_fork()


def is_initialized() -> bool:
    """Return whether this process has initialised the neuron devices (not inherited across a fork)."""
    return (_lazy_init_done or _C._is_initialized()) and not _is_in_bad_fork()


def _lazy_call(callable: Callable[[], Any], **kwargs: Any) -> None:
    """Run ``callable`` now if the devices are initialised, else at their initialisation.

    Args:
        callable: what to run.
        seed: a ``manual_seed`` of one device (only the latest is kept), as ``torch.cuda._lazy_call``.
        seed_all: a ``manual_seed_all`` (only the latest is kept).
    """
    if not _lazy_init_done and _C._is_initialized() and not _is_in_bad_fork():
        _lazy_init()  # the devices were first used from C++: the queued calls run first, in order
    with _initialization_lock:
        if _lazy_init_done and not _is_in_bad_fork():
            callable()
        elif kwargs.get("seed_all", False):
            _lazy_seed_tracker.queue_seed_all(callable, traceback.format_stack())
        elif kwargs.get("seed", False):
            _lazy_seed_tracker.queue_seed(callable, traceback.format_stack())
        else:
            _queued_calls.append((callable, traceback.format_stack()))


def _lazy_init() -> None:
    """Initialise the neuron devices if they are not yet; raise in a process forked after they were."""
    global _lazy_init_done, _queued_calls
    if (_lazy_init_done and not _is_in_bad_fork()) or hasattr(_tls, "is_initializing"):
        return
    with _initialization_lock:
        if _lazy_init_done and not _is_in_bad_fork():
            return
        if _is_in_bad_fork():
            raise RuntimeError(_BAD_FORK_MESSAGE)
        _C._init()
        # Queued calls may call _lazy_init() again: they return at once. Other threads wait on the lock.
        _tls.is_initializing = True
        _queued_calls.extend(calls for calls in _lazy_seed_tracker.get_calls() if calls)
        try:
            for queued_call, orig_traceback in _queued_calls:
                try:
                    queued_call()
                except Exception as e:
                    msg = (f"neuron call failed lazily at initialization with error: {e}\n\n"
                           f"neuron call was originally invoked at:\n\n{''.join(orig_traceback)}")
                    raise DeferredNeuronCallError(msg) from e
        finally:
            delattr(_tls, "is_initializing")
            _queued_calls = []
            _lazy_seed_tracker.__init__()
        _lazy_init_done = True
        for hook in _on_initialized:
            hook()
