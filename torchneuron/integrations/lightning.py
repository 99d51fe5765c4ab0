"""PyTorch Lightning on neuron: ``Trainer(accelerator="neuron")``.

Importing this module registers the accelerator ``"neuron"`` with Lightning
(``lightning.pytorch`` and the standalone ``pytorch_lightning``, whichever are
installed), so that::

    import torchneuron.integrations.lightning  # noqa: F401
    import lightning as L

    trainer = L.Trainer(accelerator="neuron", devices=1)                  # neuron:0
    trainer = L.Trainer(accelerator="neuron", devices=2)                  # DDP, rank r on neuron:r
    trainer = L.Trainer(accelerator="neuron", devices=2, strategy="ddp")  # the same, by name

The import may come before or after Lightning's: a namespace not yet imported
is registered as soon as it finishes importing (a finder on ``sys.meta_path``
that looks only at the names ``lightning.pytorch`` and ``pytorch_lightning``),
so a program that never imports Lightning pays a few milliseconds and no Lightning import.

What Lightning offers and what it does not (Lightning 2.6):

* Accelerators are found by name in ``AcceleratorRegistry``, which a third party
  may fill: :class:`NeuronAccelerator` registers itself there as ``"neuron"``.
  Lightning reads no entry point for accelerators or strategies (its only entry
  points are callback factories, read after the accelerator has been chosen), so
  the registration needs this import.
* ``accelerator="auto"`` chooses among TPU, MPS, CUDA and CPU only
  (``_select_auto_accelerator``), with no hook for a registered accelerator: it
  picks the CPU. Write ``accelerator="neuron"``.
* Three Lightning paths have no hook for a third-party accelerator:
  ``strategy="auto"`` with one device builds ``SingleDeviceStrategy`` on the CPU
  for every accelerator but CUDA and MPS; ``DDPStrategy`` wraps the model
  inside ``torch.cuda.stream(torch.cuda.Stream())`` on every device but the
  CPU; mixed precision autocasts on ``"cuda"`` for every accelerator but the
  CPU and MPS. They are changed here in the manner of the CUDA compatibility
  layer: each change is listed in :data:`PATCHES` (for every namespace),
  applied as a :class:`~torchneuron._patch.PatchSet` by :func:`register`,
  undone by :func:`unregister`, and does nothing unless the device is neuron. A strategy subclass put into
  ``StrategyRegistry`` under ``"ddp"`` would avoid the DDP change only for
  strategies given by name, not for ``DDPStrategy(...)`` objects, and would
  change the class every DDP user gets.

The process group is Lightning's default for the device,
``torch.distributed.Backend.default_device_backend_map["neuron"]``: ``"neuron"``.

Under ``TORCHNEURON_TRANSFER_CUDA=1`` a script written for ``accelerator="gpu"``
or ``"cuda"`` runs on neuron without this module: Lightning's CUDA accelerator
asks ``torch.cuda``, which the CUDA compatibility layer answers for neuron.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import logging
import sys
import threading
import warnings
from typing import Any, Callable, Optional, Union

import torch

from .._patch import Patch, PatchSet, attribute

__all__ = [
    "NAMESPACES", "NeuronAccelerator", "PATCHES", "PLNeuronAccelerator", "Patch", "accelerator_class", "is_registered",
    "register", "unregister",
]

log = logging.getLogger("torchneuron")

#: The packages Lightning's Trainer ships in; each has registries of its own.
NAMESPACES = ("lightning.pytorch", "pytorch_lightning")
ACCELERATOR_NAME = "neuron"
# The module attribute each namespace's accelerator class is found under (NeuronAccelerator is
# the one of lightning.pytorch, or of pytorch_lightning when only that is installed).
_CLASS_NAMES = {"lightning.pytorch": "NeuronAccelerator", "pytorch_lightning": "PLNeuronAccelerator"}

_lock = threading.RLock()
_classes: dict[str, type] = {}                           # namespace -> its NeuronAccelerator
_registered: dict[str, tuple[PatchSet, Any, Any]] = {}  # namespace -> (its patches, registry, entry before)
_MISSING = object()



# --------------------------------------------------------------------------------------
# The accelerator
# --------------------------------------------------------------------------------------

def _device_indices(devices: Any) -> list[int]:
    """The neuron device indices a Trainer ``devices`` argument asks for."""
    count = torch.neuron.device_count()
    if isinstance(devices, str):
        text = devices.strip()
        if text == "auto" or text == "-1":
            return list(range(count))
        if "," in text:
            parts = [p.strip() for p in text.split(",") if p.strip()]
            if not all(p.isdigit() for p in parts):
                raise ValueError(f"NeuronAccelerator: devices={devices!r} is not a list of device indices, "
                                 "e.g. '0,1'")
            devices = [int(p) for p in parts]
        elif text.isdigit():
            devices = int(text)
        else:
            raise ValueError(f"NeuronAccelerator: devices={devices!r} is not understood; give a count (2), "
                             "indices ([0, 1] or '0,1'), -1 or 'auto' for all devices")
    if isinstance(devices, bool):
        raise TypeError(f"NeuronAccelerator: devices must be an int, a list of ints or a str, got {devices!r}")
    if isinstance(devices, int):
        if devices == -1:
            indices = list(range(count))
        elif devices < 1:
            raise ValueError(f"NeuronAccelerator: devices={devices} asks for no device; give at least 1, "
                             "or -1 for all")
        else:
            indices = list(range(devices))
    elif isinstance(devices, (list, tuple)):
        if not devices or not all(isinstance(i, int) and not isinstance(i, bool) for i in devices):
            raise ValueError(f"NeuronAccelerator: devices={devices!r} must be a non-empty list of device indices")
        indices = list(devices)
        if len(set(indices)) != len(indices):
            raise ValueError(f"NeuronAccelerator: devices={devices!r} names a device twice")
    else:
        raise TypeError(f"NeuronAccelerator: devices must be an int, a list of ints or a str, got {devices!r}")
    if not indices:
        raise RuntimeError("NeuronAccelerator: no neuron device is available")
    bad = [i for i in indices if not 0 <= i < count]
    if bad:
        raise ValueError(f"NeuronAccelerator: devices={devices!r} asks for neuron device(s) {bad}, but "
                         f"{count} exist (indices 0 to {count - 1}); the emulator's count is set by "
                         "TORCHNEURON_NUM_DEVICES")
    return indices


def _make_accelerator(base: type) -> type:
    """Build ``NeuronAccelerator`` on one namespace's ``Accelerator`` base class."""

    class NeuronAccelerator(base):  # type: ignore[misc, valid-type]
        """Lightning accelerator for neuron devices, registered as ``"neuron"``.

        Example::

            >>> trainer = lightning.Trainer(accelerator="neuron", devices=2)
        """

        def setup_device(self, device: torch.device) -> None:
            """Make ``device`` (``neuron:<local rank>``) this process's current neuron device."""
            if device.type != "neuron":
                raise ValueError(f"NeuronAccelerator: the strategy's device must be a neuron device, got {device}; "
                                 "leave strategy='auto' or give the strategy neuron devices")
            torch.neuron.set_device(device)

        def get_device_stats(self, device: Any) -> dict[str, Any]:
            """The device's allocator statistics, ``torch.neuron.memory_stats(device)``."""
            return dict(torch.neuron.memory_stats(device))

        def teardown(self) -> None:
            """Give cached device memory back, as Lightning's CUDA accelerator does."""
            torch.neuron.empty_cache()

        @staticmethod
        def parse_devices(devices: Union[int, str, list[int]]) -> list[int]:
            """The neuron device indices ``devices`` asks for: a count, a list, ``"0,1"``, ``-1`` or ``"auto"``."""
            return _device_indices(devices)

        @staticmethod
        def get_parallel_devices(devices: Union[int, str, list[int]]) -> list[torch.device]:
            """``neuron:i`` for every index ``devices`` asks for."""
            return [torch.device("neuron", i) for i in _device_indices(devices)]

        @staticmethod
        def auto_device_count() -> int:
            """How many devices ``devices="auto"`` uses: all of them."""
            return torch.neuron.device_count()

        @staticmethod
        def is_available() -> bool:
            """Whether a neuron device exists."""
            return torch.neuron.is_available() and torch.neuron.device_count() > 0

        @staticmethod
        def name() -> str:
            return ACCELERATOR_NAME

        @classmethod
        def register_accelerators(cls, accelerator_registry: Any) -> None:
            accelerator_registry.register(ACCELERATOR_NAME, cls, description="neuron devices (torchneuron)",
                                          override=True)

    return NeuronAccelerator


def accelerator_class(namespace: str = "lightning.pytorch") -> type:
    """Return ``NeuronAccelerator`` built on ``namespace``'s ``Accelerator`` (importing that namespace).

    Args:
        namespace: ``"lightning.pytorch"`` or ``"pytorch_lightning"``.
    """
    if namespace not in NAMESPACES:
        raise ValueError(f"accelerator_class: namespace must be one of {NAMESPACES}, got {namespace!r}")
    with _lock:
        cls = _classes.get(namespace)
        if cls is None:
            base = importlib.import_module(f"{namespace}.accelerators").Accelerator
            cls = _classes[namespace] = _make_accelerator(base)
            # Found again by name, so that ddp_spawn can pickle the Trainer's accelerator.
            cls.__module__, cls.__qualname__ = __name__, _CLASS_NAMES[namespace]
            cls.__name__ = "NeuronAccelerator"
        return cls


def __getattr__(name: str) -> Any:
    # The accelerator classes are built on demand: importing this module imports no Lightning.
    if name == "NeuronAccelerator":
        for namespace in NAMESPACES:
            if importlib.util.find_spec(namespace.split(".")[0]) is not None:
                return accelerator_class(namespace)
        raise AttributeError("NeuronAccelerator needs Lightning: pip install lightning")
    if name == _CLASS_NAMES["pytorch_lightning"]:
        return accelerator_class("pytorch_lightning")
    if name == "PATCHES":
        return tuple(Patch(_target(ns, module, owner, attr), what)
                     for ns in NAMESPACES for module, owner, attr, what, _ in _TABLE)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------------------
# The patches: Lightning paths without a hook
# --------------------------------------------------------------------------------------

def _make_choose_strategy(orig: Callable, namespace: str, accelerator_cls: type) -> Callable:
    single_cls = importlib.import_module(f"{namespace}.strategies").SingleDeviceStrategy

    def _choose_strategy(self):
        chosen = orig(self)
        accelerator = getattr(self, "accelerator", None)
        if (isinstance(accelerator, accelerator_cls) and isinstance(chosen, single_cls)
                and chosen.root_device.type == "cpu"):
            device = self._parallel_devices[0] if self._parallel_devices else torch.device(
                "neuron", torch.neuron.current_device())
            return single_cls(device=device)
        return chosen

    _choose_strategy.__wrapped__ = orig
    _choose_strategy.__doc__ = orig.__doc__
    return _choose_strategy


def _make_setup_model(orig: Callable, namespace: str, accelerator_cls: type) -> Callable:
    from torch.nn.parallel import DistributedDataParallel

    def _setup_model(self, model):
        if self.root_device.type != "neuron":
            return orig(self, model)
        # For CUDA, Lightning builds DDP on a side stream from torch.cuda.Stream(). The neuron
        # process group needs none, and building DDP on the current stream keeps its gradient
        # accumulators on the stream backward runs on.
        return DistributedDataParallel(module=model, device_ids=self.determine_ddp_device_ids(),
                                       **self._ddp_kwargs)

    _setup_model.__wrapped__ = orig
    _setup_model.__doc__ = orig.__doc__
    return _setup_model


def _make_check_and_init_precision(orig: Callable, namespace: str, accelerator_cls: type) -> Callable:
    mixed_cls = importlib.import_module(f"{namespace}.plugins").MixedPrecision

    def _check_and_init_precision(self):
        if not isinstance(getattr(self, "accelerator", None), accelerator_cls):
            return orig(self)
        with warnings.catch_warnings():  # the CUDA GradScaler Lightning builds first, replaced below
            warnings.filterwarnings("ignore", message=".*GradScaler is enabled, but CUDA is not available.*")
            chosen = orig(self)
        if self._precision_plugin_flag is None and type(chosen) is mixed_cls and chosen.device == "cuda":
            # Lightning names "cuda" for every accelerator other than the CPU and MPS.
            return mixed_cls(chosen.precision, "neuron")
        return chosen

    _check_and_init_precision.__wrapped__ = orig
    _check_and_init_precision.__doc__ = orig.__doc__
    return _check_and_init_precision


_CONNECTOR = "trainer.connectors.accelerator_connector"
# (module under the namespace, class, attribute, what the replacement does, make(original, namespace, accelerator))
_TABLE: tuple[tuple[str, str, str, str, Callable[..., Callable]], ...] = (
    (_CONNECTOR, "_AcceleratorConnector", "_choose_strategy",
     "strategy='auto' with one neuron device: SingleDeviceStrategy on that device, not the CPU",
     _make_choose_strategy),
    ("strategies.ddp", "DDPStrategy", "_setup_model",
     "DDP on a neuron device is built without torch.cuda.Stream", _make_setup_model),
    (_CONNECTOR, "_AcceleratorConnector", "_check_and_init_precision",
     "precision='16-mixed' / 'bf16-mixed' on neuron: autocast and GradScaler on neuron, not CUDA",
     _make_check_and_init_precision),
)


def _target(namespace: str, module: str, owner: str, attr: str) -> str:
    return f"{namespace}.{module}.{owner}.{attr}"


def _patches(namespace: str, accelerator_cls: type) -> PatchSet:
    """:data:`PATCHES` of one namespace, made for its ``NeuronAccelerator`` (importing the modules they change)."""
    replacements = []
    for module, owner_name, attr, what, make in _TABLE:
        owner = getattr(importlib.import_module(f"{namespace}.{module}"), owner_name)
        replacements.append(attribute(owner, attr, lambda orig, make=make: make(orig, namespace, accelerator_cls),
                                      what, target=_target(namespace, module, owner_name, attr)))
    return PatchSet(f"Lightning ({namespace}) on neuron", replacements)


# --------------------------------------------------------------------------------------
# register / unregister
# --------------------------------------------------------------------------------------

def is_registered(namespace: str = "lightning.pytorch") -> bool:
    """Return whether ``"neuron"`` is registered with ``namespace``'s Trainer."""
    return namespace in _registered


def register(namespace: Optional[str] = None) -> list[str]:
    """Register the ``"neuron"`` accelerator with Lightning and apply :data:`PATCHES`.

    Args:
        namespace: ``"lightning.pytorch"`` or ``"pytorch_lightning"``; None means every one
            of them that is installed.

    Returns:
        the namespaces registered now or before. Calling it again does nothing.
    """
    names = NAMESPACES if namespace is None else (namespace,)
    done = []
    with _lock:
        for ns in names:
            if ns not in NAMESPACES:
                raise ValueError(f"register: namespace must be one of {NAMESPACES}, got {ns!r}")
            if ns in _registered:
                done.append(ns)
                continue
            if namespace is None and importlib.util.find_spec(ns.split(".")[0]) is None:
                continue
            if namespace is None and ns == "lightning.pytorch" and importlib.util.find_spec(ns) is None:
                continue
            cls = accelerator_class(ns)
            registry = importlib.import_module(f"{ns}.accelerators").AcceleratorRegistry
            patches = _patches(ns, cls)
            before = dict.get(registry, ACCELERATOR_NAME, _MISSING)
            try:
                cls.register_accelerators(registry)
                patches.apply()  # undoes those it applied if one fails
            except BaseException:
                _put_back(registry, before)
                raise
            _registered[ns] = (patches, registry, before)
            done.append(ns)
            log.info("Lightning (%s): accelerator %r registered, %d patches", ns, ACCELERATOR_NAME,
                     len(patches.replacements))
    return done


def _put_back(registry: dict, entry: Any) -> None:
    """Give ``registry`` back the entry it had under ``"neuron"`` before :func:`register` (or none)."""
    if entry is _MISSING:
        registry.pop(ACCELERATOR_NAME, None)
    else:
        registry[ACCELERATOR_NAME] = entry


def unregister(namespace: Optional[str] = None) -> None:
    """Remove ``"neuron"`` from Lightning's registry and put back what :func:`register` replaced.

    Args:
        namespace: one namespace, or None for all.
    """
    with _lock:
        for ns in (NAMESPACES if namespace is None else (namespace,)):
            if ns in _registered:
                patches, registry, before = _registered.pop(ns)
                try:
                    patches.reset()  # last applied first
                finally:
                    _put_back(registry, before)


# --------------------------------------------------------------------------------------
# Registration when Lightning is imported later
# --------------------------------------------------------------------------------------

class _LoaderThenRegister(importlib.abc.Loader):
    """Runs a namespace's own loader, then :func:`register` for it."""

    def __init__(self, loader: Any, namespace: str) -> None:
        self._loader, self._namespace = loader, namespace

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        try:
            register(self._namespace)
        except Exception:  # Lightning itself imported fine; say why neuron is missing, do not break it
            log.exception("torchneuron could not register the neuron accelerator with %s", self._namespace)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


# What register() needs of a namespace; a namespace whose import was under way when this module
# was imported (torchneuron imported from inside Lightning's own imports) is registered once these are.
_NEEDED = ("accelerators", "plugins", "strategies.ddp", _CONNECTOR)


def _loaded(name: str) -> bool:
    module = sys.modules.get(name)
    return module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False)


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """On ``sys.meta_path``: when a Lightning namespace is imported, registers neuron with it."""

    def __init__(self) -> None:
        self.pending: set[str] = set()  # namespaces whose import was under way when the finder came
        self._busy = False

    def find_spec(self, fullname, path, target=None):
        if self.pending and not self._busy:
            self._register_pending()
        if fullname not in NAMESPACES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _LoaderThenRegister(spec.loader, fullname)
                return spec
        return None

    def _register_pending(self) -> None:
        for ns in sorted(self.pending):
            if all(_loaded(f"{ns}.{name}") for name in _NEEDED):
                self.pending.discard(ns)
                self._busy = True
                try:
                    register(ns)
                except Exception:
                    log.exception("torchneuron could not register the neuron accelerator with %s", ns)
                finally:
                    self._busy = False


_finder = _RegisterOnImport()


def _register_now_or_on_import() -> None:
    """Register with the Lightning namespaces already imported; the others when they are."""
    for ns in NAMESPACES:
        if _loaded(ns):
            register(ns)
        elif ns in sys.modules:  # its import is under way: registered once what register() needs is loaded
            _finder.pending.add(ns)
    if _finder not in sys.meta_path and not all(ns in _registered for ns in NAMESPACES):
        sys.meta_path.insert(0, _finder)


_register_now_or_on_import()
