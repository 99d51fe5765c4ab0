"""The CUDA compatibility layer: programs written for CUDA run on neuron unchanged.

Every patch is an attribute replaced on a PyTorch object, listed in
:data:`PATCHES` and applied as one :class:`~torchneuron._patch.PatchSet` by
:func:`enable`; :func:`disable` undoes it, last applied first, putting back the
very objects it replaced.

What the layer does:

- ``"cuda"``, ``"cuda:N"`` and ``torch.device("cuda", N)`` given where PyTorch takes
  a device (factories such as ``torch.zeros``, ``Tensor.to``, ``Module.to``,
  ``Tensor.new_*``, ``torch.load(map_location=...)``, ``torch.Generator``,
  ``torch.autocast``, ``torch.amp.GradScaler``, ``with torch.device(...)``,
  ``torch.set_default_device``) mean ``neuron`` / ``neuron:N``. Checkpoints
  saved on CUDA load onto neuron without a ``map_location``.
- ``Tensor.cuda()`` moves to neuron; ``Tensor.is_cuda`` is true for neuron tensors.
- ``torch.cuda.*`` (devices, memory, random, streams, events, ``nvtx``) answers
  for neuron; ``torch.cuda.amp`` autocasts and scales on neuron (float16 by
  default, as on CUDA).
- ``init_process_group("nccl")`` (and ``device_id=torch.device("cuda", N)``) uses the ``neuron`` c10d backend when one is
  registered, else ``gloo``.

Inside PyTorch itself (and torchneuron) ``torch.cuda.*`` and ``Tensor.is_cuda``
keep telling the truth, so PyTorch never takes a CUDA-only path by mistake;
only the program and its libraries see a CUDA device.

The objects ``torch.device("cuda")`` builds stay CUDA devices: they are mapped
where they are used, so ``device.type == "cuda"`` still holds for them while
``tensor.device`` reports ``neuron``.

Example::

    >>> import torchneuron.transfer_to_neuron        # or: cuda_compat.enable()
    >>> torch.zeros(2, device="cuda").device
    device(type='neuron', index=0)
    >>> torchneuron.migrate.cuda_compat.disable()    # everything as it was
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from typing import Any, Callable, Iterator, Optional

import torch

from .._patch import Patch, PatchSet, Replacement, attribute
from . import _cuda_replacements as _r
from ._cuda_replacements import (  # noqa: F401  (_map_backend: the tests ask it directly)
    CUDA_CLASSES, CUDA_FUNCTIONS, FACTORIES, FFT_FACTORIES, NVTX_FUNCTIONS, TENSOR_FACTORIES, Generator,
    _cuda_classes, _factory, _lock, _make_autocast_init, _make_autocast_query, _make_backend_taker,
    _make_device_context_init, _make_fork_rng, _make_is_cuda, _make_load, _make_process_group_init,
    _make_scaler_init, _make_tensor_cuda, _map_backend, _NvtxRanges, _routed, _to, is_enabled, set_recorder,
    target,
)

__all__ = ["PATCHES", "Patch", "disable", "enable", "enabled", "is_enabled", "set_recorder", "target"]

log = logging.getLogger("torchneuron")

_patch_set: Optional[PatchSet] = None  # built at the first use (it needs torch.neuron)
_rng_mode: Any = None                  # the host-RNG mode while the layer draws CPU numbers

# --------------------------------------------------------------------------------------
# The patch table
# --------------------------------------------------------------------------------------

def _patch_table() -> list[tuple[Any, str, str, Callable[[Any], Any]]]:
    """Every patch as (owner object, attribute, description, make(original) -> replacement)."""
    import torch.amp.grad_scaler
    import torch.cuda.nvtx
    import torch.distributed as dist
    import torch.utils._device

    T = torch.Tensor
    table: list[tuple[Any, str, str, Callable[[Any], Any]]] = []
    for name in FACTORIES:
        if hasattr(torch, name):
            table.append((torch, name, "device='cuda' means the neuron device",
                          lambda orig, n=name: _factory(orig, f"torch.{n}(device='cuda')")))
    for name in FFT_FACTORIES:
        table.append((torch.fft, name, "device='cuda' means the neuron device",
                      lambda orig, n=name: _factory(orig, f"torch.fft.{n}(device='cuda')")))
    for name in TENSOR_FACTORIES:
        table.append((T, name, "device='cuda' means the neuron device",
                      lambda orig, n=name: _factory(orig, f"Tensor.{n}(device='cuda')")))
    table += [
        (T, "to", "Tensor.to('cuda') moves to neuron", lambda orig: _to(orig, "Tensor.to('cuda')")),
        (T, "cuda", "Tensor.cuda(i) moves to neuron:i", lambda orig: _make_tensor_cuda(torch._C.TensorBase.to)),
        (T, "is_cuda", "true for neuron tensors (false inside PyTorch)",
         lambda orig: _make_is_cuda(torch._C.TensorBase.is_cuda.__get__)),
        (torch.nn.Module, "to", "Module.to('cuda') moves to neuron (Module.cuda() uses Tensor.cuda)",
         lambda orig: _to(orig, "Module.to('cuda')")),
        (torch.nn.Module, "to_empty", "Module.to_empty(device='cuda') allocates on neuron",
         lambda orig: _factory(orig, "Module.to_empty(device='cuda')")),
        (torch, "load", "map_location 'cuda' means neuron; CUDA checkpoints load onto neuron",
         _make_load),
        (torch, "Generator", "torch.Generator('cuda') is a neuron generator", lambda orig: Generator),
        (torch.amp.autocast_mode.autocast, "__init__",
         "torch.autocast('cuda') (and torch.cuda.amp.autocast) autocasts on neuron, float16 by default",
         _make_autocast_init),
        (torch.amp.grad_scaler.GradScaler, "__init__",
         "GradScaler('cuda') (the default, and torch.cuda.amp.GradScaler) scales on neuron",
         _make_scaler_init),
        (torch, "is_autocast_enabled", "'cuda' (or no argument) asks about neuron",
         lambda orig: _make_autocast_query(orig, "torch.is_autocast_enabled('cuda')")),
        (torch, "get_autocast_dtype", "'cuda' asks about neuron",
         lambda orig: _make_autocast_query(orig, "torch.get_autocast_dtype('cuda')")),
        (torch, "get_autocast_gpu_dtype", "answers for neuron",
         lambda orig: functools.wraps(orig)(lambda: torch.get_autocast_dtype(_r._target))),
        (torch.utils._device.DeviceContext, "__init__",
         "with torch.device('cuda') / torch.set_default_device('cuda') use neuron",
         _make_device_context_init),
        (torch.random, "fork_rng", "device_type='cuda' forks neuron's generators", _make_fork_rng),
    ]
    if dist.is_available():
        table += [
            (dist, "init_process_group",
             "backend 'nccl' means 'neuron' if registered, else 'gloo'; device_id=torch.device('cuda', N) "
             "means the neuron (or CPU) device", _make_process_group_init),
            (dist, "new_group", "backend 'nccl' means 'neuron' if registered, else 'gloo'",
             lambda orig: _make_backend_taker(orig, 2)),
        ]
    classes = _cuda_classes()
    for name in CUDA_FUNCTIONS:
        table.append((torch.cuda, name, "answers for neuron (the original inside PyTorch)",
                      lambda orig, n=name: _routed(n, orig)))
    for name in CUDA_CLASSES:
        table.append((torch.cuda, name, "the neuron equivalent", lambda orig, c=classes[name]: c))
    nvtx = _NvtxRanges()
    for name in NVTX_FUNCTIONS:
        table.append((torch.cuda.nvtx, name, "a torch.profiler.record_function range",
                      lambda orig, n=name: getattr(nvtx, n)))
    return table


def _owner_name(owner: Any) -> str:
    public = {torch.Tensor: "torch.Tensor", torch.nn.Module: "torch.nn.Module",
              torch.amp.autocast_mode.autocast: "torch.amp.autocast"}
    if owner in public:
        return public[owner]
    if isinstance(owner, type(sys)):
        return owner.__name__
    if owner.__name__ == "GradScaler":
        return "torch.amp.GradScaler"
    return f"{owner.__module__}.{owner.__qualname__}"


def _known_to_torchscript(replacement: Replacement, name: str) -> Replacement:
    """``replacement`` of ``torch.<name>``, its wrapper also registered with TorchScript, which
    resolves ``torch.<fn>`` by identity."""

    def apply() -> Callable[[], None]:
        undo = replacement.apply()
        wrapper = getattr(torch, name)
        if not getattr(wrapper, "_torchneuron_compat", False):
            return undo
        try:
            torch.jit._builtins._register_builtin(wrapper, f"aten::{name}")
        except BaseException:
            undo()
            raise

        def forget_then_undo() -> None:
            torch.jit._builtins._get_builtin_table().pop(id(wrapper), None)
            undo()

        return forget_then_undo

    return Replacement(replacement.patch, apply)


def _patches() -> PatchSet:
    """The layer's :class:`PatchSet`, built from :func:`_patch_table` at the first use."""
    global _patch_set
    with _lock:
        if _patch_set is None:
            replacements = []
            for owner, attr, what, make in _patch_table():
                r = attribute(owner, attr, make, what, target=f"{_owner_name(owner)}.{attr}")
                replacements.append(_known_to_torchscript(r, attr) if owner is torch else r)
            _patch_set = PatchSet("CUDA compatibility layer", replacements)
        return _patch_set


def __getattr__(name: str) -> Any:
    if name == "PATCHES":  # computed on use: the table needs torch.neuron, loaded after this module
        return _patches().patches
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------------------
# enable / disable
# --------------------------------------------------------------------------------------

def enable(device: str = "neuron", *, host_rng: bool = False) -> None:
    """Turn the layer on: from now on CUDA means ``device``.

    Args:
        device: ``"neuron"`` (default), or ``"cpu"`` to run a CUDA program on the CPU
            (the reference run of ``torchneuron parity``).
        host_rng: draw the random numbers of device ops from the CPU generator, and
            make ``torch.cuda.manual_seed`` seed it, so that a neuron run draws exactly
            the numbers a CPU run draws (used by ``torchneuron parity``).

    Calling it again with other arguments re-applies the layer; with the same, does nothing.
    """
    global _rng_mode
    if device not in ("neuron", "cpu"):
        raise ValueError(f"cuda_compat.enable: device must be 'neuron' or 'cpu', got {device!r}")
    with _lock:
        if _r._target is not None:
            if (_r._target, _r._host_rng) == (device, host_rng):
                return
            disable()
        # Build PyTorch's lazy tables from the originals before anything is replaced:
        # TorchScript's builtin table and the factory set of `with torch.device(...)`.
        import torch.jit._builtins
        import torch.utils._device

        torch.jit._builtins._get_builtin_table()
        torch.utils._device._device_constructors()
        _dynamo_tables(build=True)
        patches = _patches()
        _r._set_target(device, host_rng)
        try:
            # The same replacement objects every time: tables that captured them (Dynamo's) stay valid.
            patches.apply()
            if host_rng and device == "neuron":
                from .host_rng import HostRNGMode

                mode = HostRNGMode()
                mode.__enter__()
                _rng_mode = mode  # only once entered: disable() exits it
        except BaseException:
            disable()
            raise
    log.info("CUDA compatibility layer on: cuda -> %s (%d patches)", device, len(patches.replacements))


def disable() -> None:
    """Turn the layer off, putting back every replaced attribute."""
    global _rng_mode
    with _lock, contextlib.ExitStack() as undo:  # last pushed first, each also when one before failed
        undo.callback(_forget_target)
        if _patch_set is not None:
            undo.callback(_patch_set.reset)
        if _rng_mode is not None:
            undo.callback(_rng_mode.__exit__, None, None, None)
            _rng_mode = None


def _forget_target() -> None:
    _r._set_target(None)
    _dynamo_tables(build=False)


def _dynamo_tables(build: bool) -> None:
    """Build (or forget) Dynamo's table of torch functions, which is keyed by the objects themselves.

    Built from the originals before patching, it makes Dynamo trace through the
    replacements to originals it knows. If Dynamo is first imported while the layer
    is on, it records the replacements instead, which stay the same objects for the
    life of the process; ``disable`` makes it forget them.
    """
    rules = sys.modules.get("torch._dynamo.trace_rules")
    fn = getattr(rules, "get_torch_obj_rule_map", None)
    if fn is None:
        return
    if build:
        fn()
    elif hasattr(fn, "cache_clear"):
        fn.cache_clear()


@contextlib.contextmanager
def enabled(device: str = "neuron", *, host_rng: bool = False) -> Iterator[None]:
    """Context manager: the layer on inside, as it was outside.

    Example::

        >>> with cuda_compat.enabled():
        ...     x = torch.ones(2).cuda()
    """
    previous = (_r._target, _r._host_rng)
    enable(device, host_rng=host_rng)
    try:
        yield
    finally:
        if previous[0] is None:
            disable()
        else:
            enable(previous[0], host_rng=previous[1])


def enable_from_env() -> None:
    """Turn the layer on if ``TORCHNEURON_TRANSFER_CUDA`` asks for it (``1``/``neuron``, or ``cpu``)."""
    import os

    value = os.environ.get("TORCHNEURON_TRANSFER_CUDA", "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return
    enable("cpu" if value == "cpu" else "neuron")
