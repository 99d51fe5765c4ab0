"""The ``neuron`` c10d backend: its registration, its creation, and each rank's device.

``torch.distributed.init_process_group("neuron")`` (or with
``device_id=torch.device("neuron", local_rank)``, or
``"cpu:gloo,neuron:neuron"``) creates, per process group, a gloo backend that
the group uses for neuron tensors; the neuron kernels of the c10d operators
(C++, ``csrc/distributed/``) run it on the device memory itself. Registered for both
``neuron`` and ``cpu``: with ``"neuron"`` alone, CPU tensors go to the same
gloo backend as they would with ``"gloo"``.
"""

from __future__ import annotations

import atexit
import copyreg
import itertools
import logging
import os
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroupGloo, _DistributedBackendOptions

from .. import _C, _gloo_exit

__all__ = ["BACKEND_NAME", "register", "register_kernels", "serve_neuron_tensors_with_gloo", "create_backend",
           "select_device"]

BACKEND_NAME = "neuron"
DEVICE_SHARING_ENV = "TORCHNEURON_ALLOW_DEVICE_SHARING"

logger = logging.getLogger("torchneuron")


def _env_int(name: str) -> Optional[int]:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer") from None


def select_device() -> Optional[int]:
    """Make ``neuron:LOCAL_RANK`` this process's current device and return its index.

    Reads ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` (set by torchrun). Without
    ``LOCAL_RANK`` the current device is left as it is and None returned.

    Raises:
        RuntimeError: more ranks run on this machine than it has neuron devices
            and ``TORCHNEURON_ALLOW_DEVICE_SHARING=1`` is not set.
    """
    local_rank = _env_int("LOCAL_RANK")
    if local_rank is None:
        return None
    count = torch.neuron.device_count()
    local_world = max(_env_int("LOCAL_WORLD_SIZE") or 0, local_rank + 1)
    sharing = os.environ.get(DEVICE_SHARING_ENV, "0").strip().lower() in ("1", "true", "yes", "on")
    if count == 0:
        raise RuntimeError("the neuron backend needs a neuron device, but none is present")
    if local_world > count and not sharing:
        raise RuntimeError(
            f"{local_world} ranks run on this machine but it has only {count} neuron device(s), so local rank "
            f"{local_rank} has no device of its own (each rank uses neuron:LOCAL_RANK). Start at most {count} "
            f"processes per machine (torchrun --nproc-per-node {count}), expose more emulated devices with "
            f"TORCHNEURON_NUM_DEVICES, or set {DEVICE_SHARING_ENV}=1 to let ranks share devices "
            f"(rank r then uses neuron:r % {count}).")
    index = local_rank % count
    torch.neuron.set_device(index)
    return index


def register_kernels() -> None:
    """Register the neuron kernels of the c10d operators in place of PyTorch's (once per process).

    They live in C++ (``csrc/distributed/collectives.cpp``): for a gloo backend they hand gloo a CPU
    view of each neuron tensor, and return handles whose results are the neuron tensors.
    """
    _C._register_collectives()


def create_backend(options: _DistributedBackendOptions, pg_options: Any = None) -> ProcessGroupGloo:
    """Create the backend of one process group (called by ``init_process_group`` and ``new_group``).

    Args:
        options: store, rank, size, timeout and group name c10d passes to an extended-API backend.
        pg_options: ``pg_options`` given to ``init_process_group``/``new_group``; a
            ``ProcessGroupGloo._Options`` (devices, threads) is used as is, anything else is ignored.
    """
    register_kernels()
    if options.group_size > 1:  # fused eager: ranks must compile the same groups at the same steps
        _C._fused_config(timing_free=True)
    ranks = list(options.global_ranks_in_group)
    if not ranks:  # the default group: this process's rank picks its device
        device = select_device()
        logger.info("neuron backend: rank %d of %d on neuron:%s", options.group_rank, options.group_size,
                    torch.neuron.current_device() if device is None else device)
    timeout: timedelta = options.timeout
    store = _store_of_this_attempt(options.store)
    if isinstance(pg_options, ProcessGroupGloo._Options) and len(pg_options._devices) > 0:
        pg_options._timeout = timeout
        backend = ProcessGroupGloo(store, options.group_rank, options.group_size, pg_options)
    else:
        if pg_options is not None and not isinstance(pg_options, ProcessGroupGloo._Options):
            logger.warning("neuron backend: ignoring pg_options of type %s", type(pg_options).__name__)
        # Network interfaces as for gloo: GLOO_SOCKET_IFNAME, else the host name's address.
        backend = ProcessGroupGloo(store, options.group_rank, options.group_size, timeout)
    # The default group's ranks are given as [] ("all"); gloo maps split ranks through this list, and
    # only its first instance in a process falls back to 0..size-1 when it is empty.
    backend.options.global_ranks_in_group = ranks or list(range(options.group_size))
    backend.options.group_name = options.group_id
    backend._set_sequence_number_for_group()
    _gloo_exit.track_gloo_backend(backend)  # settled at exit: _settle_gloo_work_at_exit
    return backend


def _store_of_this_attempt(store: dist.Store) -> dist.Store:
    """The group's store, under a prefix of torchrun's restart count.

    torchrun (``--max-restarts``) restarts the workers with the same agent store: its keys from the
    failed attempt are still there, and gloo's connection setup then reads the addresses the dead
    ranks published, is refused, and fails the restart (plain gloo on CPU tensors does the same).
    Each attempt's keys under their own prefix leave the old ones unread.
    """
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    return store if attempt is None else dist.PrefixStore(f"torchneuron/attempt{attempt}", store)


_copied_devices: dict[int, list] = {}
_copies = itertools.count()


def _gloo_options(timeout: timedelta, threads: int, devices_key: int) -> ProcessGroupGloo._Options:
    devices = _copied_devices.pop(devices_key, None)
    if devices is None:
        raise RuntimeError("gloo's process group options can be copied, but not carried to another process")
    copy = ProcessGroupGloo._Options()
    copy._timeout, copy._threads, copy._devices = timeout, threads, devices
    return copy


def _reduce_gloo_options(opts: ProcessGroupGloo._Options) -> tuple:
    # copy.deepcopy() copies the arguments returned here, and gloo's network devices cannot be
    # copied: they stay aside (shared by the copy, as gloo shares them between groups) under a key.
    key = next(_copies)
    _copied_devices[key] = list(opts._devices)
    return _gloo_options, (opts._timeout, opts._threads, key)


def serve_neuron_tensors_with_gloo() -> None:
    """Make every gloo process group serve neuron tensors too, as gloo serves CUDA tensors.

    PyTorch lists the device types each backend serves in ``Backend.backend_capability``; gloo's
    is ``["cpu", "cuda"]``, so ``init_process_group("gloo")`` registers its one gloo backend for
    both device types, and a CPU program whose default device mesh or DTensor state lands on the
    accelerator (``torch._C._get_accelerator()``: FSDP2's default mesh, DTensor's random-state
    broadcast) runs there. With ``"neuron"`` on that list, the same gloo backend is registered for
    neuron tensors as well, and the neuron kernels of the c10d operators, registered here for every
    process group, hand gloo host views of the device memory (``csrc/distributed/collectives.cpp``).
    """
    devices = dist.Backend.backend_capability.setdefault(dist.Backend.GLOO, ["cpu"])
    if "neuron" not in devices:
        devices.append("neuron")
    register_kernels()


def _settle_gloo_work_at_exit() -> None:
    """Before the interpreter finalises: no gloo worker thread releases a collective's tensors after this.

    A gloo worker lets go of each collective's work after it ended. Releasing a tensor made in Python
    takes the GIL; a worker that starts waiting for it while the main thread holds it into the
    interpreter's finalisation is ended there by Python, inside PyTorch's noexcept release, and the
    process aborts ("terminate called without an active exception") after the program finished. Every
    process group outlives ``destroy_process_group()`` while DDP, FSDP or a DeviceMesh holds it, and
    lives to the end when the program never calls it. This waits until no worker is releasing anything
    and keeps the works they still hold to the process's end (``csrc/distributed/exit.cpp``).
    """
    # The groups still registered (plain gloo ones too); the neuron backend's own are remembered
    # already, also once destroy_process_group() let go of them while something else holds them.
    for pg in list(getattr(dist.distributed_c10d._world, "pg_map", {})):
        for device in getattr(pg, "_device_types", []):
            try:
                _gloo_exit.track_gloo_backend(pg._get_backend(device))
            except Exception:  # a backend this process cannot pass to C++: not gloo's
                logger.debug("neuron backend: the %s backend of group %s is not tracked at exit", device,
                             getattr(pg, "group_name", "?"), exc_info=True)
    kept = _gloo_exit.settle_gloo_work_at_exit()
    if kept < 0:
        logger.warning("neuron backend: a gloo backend's worker state is not laid out as this torchneuron was "
                       "built for; its collectives may still end during the interpreter's finalisation")
    elif kept:
        logger.debug("neuron backend: at exit, gloo's worker threads still held %d work(s); they are kept to "
                     "the process's end", kept)


_exit_hook_registered = False


def register() -> None:
    """Register the ``neuron`` backend with ``torch.distributed`` (done by ``import torchneuron``)."""
    # split_group() (DeviceMesh of 2+ dimensions once init_process_group got a device_id) deep-copies
    # the parent backend's options, which gloo's cannot be: copyreg teaches copy how.
    copyreg.pickle(ProcessGroupGloo._Options, _reduce_gloo_options)
    global _exit_hook_registered
    if not _exit_hook_registered:
        # Registered at import: exit hooks run last-registered first, so this one runs after those a
        # program registers later (which may still run collectives), just before finalisation.
        atexit.register(_settle_gloo_work_at_exit)
        _exit_hook_registered = True
    serve_neuron_tensors_with_gloo()
    if dist.Backend.default_device_backend_map.get("neuron") == BACKEND_NAME:
        return
    # "cpu" too, so that init_process_group("neuron") and device_id=neuron:N also serve CPU tensors
    # (object collectives, checkpoint metadata); the CPU default stays gloo.
    dist.Backend.register_backend(BACKEND_NAME, create_backend, extended_api=True, devices=["neuron", "cpu"])
