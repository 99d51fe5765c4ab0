"""What the CUDA compatibility layer puts in PyTorch's place (see :mod:`torchneuron.migrate.cuda_compat`).

The layer's state (what ``"cuda"`` stands for while it is on), the translation of CUDA devices to
that target, and every replacement the patch table installs. :mod:`~torchneuron.migrate.cuda_compat`
lists the patches and turns the layer on and off; it is the only module that sets the state.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from typing import Any, Callable, Iterator, Optional

import torch

_Device = torch.device
_OrigGenerator = torch.Generator
# Modules whose calls see the truth about CUDA (no device) rather than the layer's answers.
_INTERNAL_PREFIXES = ("torch.", "torchneuron.")
_INTERNAL_NAMES = frozenset({"torch", "torchneuron"})



# --------------------------------------------------------------------------------------
# State
# --------------------------------------------------------------------------------------

_lock = threading.RLock()
_target: Optional[str] = None          # "neuron" or "cpu" while enabled
_host_rng = False
_int_is_cuda = False                   # with the CPU target, device=0 means cuda:0 too
_recorder: Optional[Callable[[str], None]] = None
_str_cache: dict[str, _Device] = {}


def is_enabled() -> bool:
    """Return whether the layer is on."""
    return _target is not None


def target() -> Optional[str]:
    """Return the device type ``"cuda"`` stands for (``"neuron"`` or ``"cpu"``), or None when off."""
    return _target


def set_recorder(recorder: Optional[Callable[[str], None]]) -> Optional[Callable[[str], None]]:
    """Call ``recorder(api)`` each time the program uses a CUDA API the layer translates.

    ``api`` names the use, e.g. ``"torch.cuda.synchronize"`` or ``"Tensor.to('cuda')"``.
    Used by ``torchneuron doctor``. Returns the previous recorder.

    Args:
        recorder: the callback, or None to stop recording.
    """
    global _recorder
    previous, _recorder = _recorder, recorder
    return previous


def _note(api: str) -> None:
    recorder = _recorder
    if recorder is not None:
        recorder(api)


def _module_of_frame(depth: int) -> str:
    """The module name of the frame ``depth`` levels above the caller of the function that asks ("" above the top)."""
    try:
        return sys._getframe(depth + 2).f_globals.get("__name__") or ""
    except ValueError:
        return ""


def _called_from_torch(depth: int) -> bool:
    """Whether the frame ``depth`` levels above the caller belongs to PyTorch or torchneuron."""
    name = _module_of_frame(depth)
    return name in _INTERNAL_NAMES or name.startswith(_INTERNAL_PREFIXES)


# --------------------------------------------------------------------------------------
# Device translation
# --------------------------------------------------------------------------------------

def _is_cuda(d: Any) -> bool:
    cls = d.__class__
    if cls is str:
        return d.startswith("cuda")
    if cls is _Device:
        return d.type == "cuda"
    return cls is int and _int_is_cuda


def _map(d: Any, api: str) -> Any:
    """Translate a CUDA device (str, torch.device or, for the CPU target, int) to the target."""
    if torch.compiler.is_compiling():  # Dynamo is tracing the program: no cache, no notes
        return _translate(_Device("cuda", d) if d.__class__ is int else _Device(d) if d.__class__ is str else d)
    _note(api)
    if d.__class__ is str:
        out = _str_cache.get(d)
        if out is None:
            out = _str_cache[d] = _translate(_Device(d))
        return out
    if d.__class__ is int:
        return _translate(_Device("cuda", d))
    return _translate(d)


def _translate(dev: _Device) -> _Device:
    if _target == "cpu" or dev.type != "cuda":
        return _Device("cpu") if dev.type == "cuda" else dev
    return _Device(_target) if dev.index is None else _Device(_target, dev.index)


def _map_if_cuda(d: Any, api: str) -> Any:
    return _map(d, api) if _is_cuda(d) else d


def _cuda_call_device(device: Any) -> _Device:
    """The device ``Tensor.cuda(device)`` means: None is the current device, an int an index."""
    if _target == "cpu":
        return _Device("cpu")
    if device is None:
        return _Device(_target)
    if isinstance(device, int) and not isinstance(device, bool):
        return _Device(_target, device)
    if _is_cuda(device):
        return _translate(_Device(device) if isinstance(device, str) else device)
    return _Device(device) if isinstance(device, str) else device


def _device_type(device_type: Any, api: str) -> Any:
    """Translate a device *type* string such as autocast's ``device_type``."""
    if device_type.__class__ is str and device_type.startswith("cuda"):
        _note(api)
        return _target
    if isinstance(device_type, _Device) and device_type.type == "cuda":
        _note(api)
        return _target
    return device_type


def _map_args(args: tuple, kwargs: dict, api: str) -> tuple[tuple, dict]:
    """Translate every CUDA device among the arguments of a routed ``torch.cuda`` function."""
    if any(_is_cuda(a) for a in args):
        args = tuple(_map(a, api) if _is_cuda(a) else a for a in args)
    for key, value in kwargs.items():
        if _is_cuda(value):
            kwargs[key] = _map(value, api)
    return args, kwargs


# --------------------------------------------------------------------------------------
# Replacements: tensors and modules
# --------------------------------------------------------------------------------------

FACTORIES = (
    "arange", "as_tensor", "asarray", "bartlett_window", "blackman_window", "empty", "empty_like",
    "empty_permuted", "empty_strided", "eye", "full", "full_like", "hamming_window", "hann_window",
    "kaiser_window", "linspace", "logspace", "normal", "ones", "ones_like", "rand", "rand_like",
    "randint", "randint_like", "randn", "randn_like", "randperm", "range", "scalar_tensor",
    "sparse_bsc_tensor", "sparse_bsr_tensor", "sparse_compressed_tensor", "sparse_coo_tensor",
    "sparse_csc_tensor", "sparse_csr_tensor", "tensor", "tril_indices", "triu_indices", "zeros",
    "zeros_like",
)
FFT_FACTORIES = ("fftfreq", "rfftfreq")
TENSOR_FACTORIES = ("new_empty", "new_empty_strided", "new_full", "new_ones", "new_tensor", "new_zeros")


def _factory(orig: Callable, api: str) -> Callable:
    """Wrap a function whose ``device=`` keyword may name CUDA."""

    @functools.wraps(orig)
    def factory(*args, **kwargs):
        if kwargs:
            d = kwargs.get("device")
            if d is not None:
                cls = d.__class__
                if (cls is str and d.startswith("cuda")) or (cls is _Device and d.type == "cuda") or (
                        cls is int and _int_is_cuda):
                    kwargs["device"] = _map(d, api)
        return orig(*args, **kwargs)

    factory._torchneuron_compat = True
    return factory


def _to(orig: Callable, api: str) -> Callable:
    """Wrap ``Tensor.to`` / ``Module.to``: the device may come first or as ``device=``."""

    @functools.wraps(orig)
    def to(self, *args, **kwargs):
        if args:
            d = args[0]
            cls = d.__class__
            if (cls is str and d.startswith("cuda")) or (cls is _Device and d.type == "cuda") or (
                    cls is int and _int_is_cuda):
                args = (_map(d, api),) + args[1:]
        if kwargs:
            d = kwargs.get("device")
            if d is not None and _is_cuda(d):
                kwargs["device"] = _map(d, api)
        return orig(self, *args, **kwargs)

    to._torchneuron_compat = True
    return to


def _make_tensor_cuda(orig_to: Callable) -> Callable:
    def cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
        """Return this tensor on the neuron device standing in for CUDA (see ``torch.Tensor.cuda``)."""
        _note("Tensor.cuda()")
        return orig_to(self, _cuda_call_device(device), non_blocking=non_blocking, memory_format=memory_format)

    return cuda


def _make_is_cuda(orig_get: Callable) -> property:
    def is_cuda(self):
        if orig_get(self):
            return True
        if self.device.type != _target or _called_from_torch(1):
            return False
        _note("Tensor.is_cuda")
        return True

    return property(is_cuda, doc="Is ``True`` if the tensor is on CUDA or on the device standing in for it.")


# --------------------------------------------------------------------------------------
# Replacements: serialization, generators, autocast, scaler, default device
# --------------------------------------------------------------------------------------

def _restore_cuda_location(storage, location: str):
    if location.startswith("cuda"):
        _note("torch.load(CUDA checkpoint)")
        return torch.serialization.default_restore_location(storage, str(_translate(_Device(location))))
    return None


def _map_location(m: Any) -> Any:
    if m is None:
        return _restore_cuda_location
    if _is_cuda(m):
        return _map(m, "torch.load(map_location='cuda')")
    if isinstance(m, dict):
        table = dict(m)

        def restore_mapped(storage, location):
            loc = table.get(location, location)
            loc = str(loc) if isinstance(loc, _Device) else loc
            if loc.startswith("cuda"):
                _note("torch.load(map_location={...})")
                loc = str(_translate(_Device(loc)))
            return torch.serialization.default_restore_location(storage, loc)

        return restore_mapped
    if callable(m) and not isinstance(m, (str, _Device)):
        user = m

        def restore(storage, location):
            result = user(storage, location)
            return _restore_cuda_location(storage, location) if result is None else result

        return restore
    return m


def _make_load(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def load(f, map_location=None, *args, **kwargs):
        return orig(f, _map_location(map_location), *args, **kwargs)

    return load


class _GeneratorMeta(type):
    """``torch.Generator`` stand-in: builds real generators, with CUDA devices translated."""

    def __call__(cls, device: Any = "cpu") -> torch.Generator:
        return _OrigGenerator(_map_if_cuda(device, "torch.Generator('cuda')"))

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, _OrigGenerator)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, _OrigGenerator)

    def __getattr__(cls, name: str) -> Any:
        return getattr(_OrigGenerator, name)


class Generator(metaclass=_GeneratorMeta):
    __doc__ = _OrigGenerator.__doc__


def _make_autocast_init(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        mapped = _device_type(device_type, "torch.autocast('cuda')")
        if mapped is not device_type and dtype is None:
            dtype = torch.float16  # CUDA's default, whatever the target's is
        orig(self, mapped, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    return __init__


def _make_scaler_init(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def __init__(self, device="cuda", *args, **kwargs):
        orig(self, _device_type(device, "torch.amp.GradScaler('cuda')"), *args, **kwargs)

    return __init__


def _make_device_context_init(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def __init__(self, device):
        orig(self, _map_if_cuda(device, "torch.device('cuda') as default device"))

    return __init__


def _make_fork_rng(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def fork_rng(*args, **kwargs):
        device_type = kwargs.get("device_type")
        if device_type is not None and _is_cuda(device_type):
            _note("torch.random.fork_rng(device_type='cuda')")
            if _target == "cpu" or _host_rng:
                kwargs.pop("device_type")
                kwargs["devices"] = []
            else:
                kwargs["device_type"] = _target
        return orig(*args, **kwargs)

    return fork_rng


def _make_autocast_query(orig: Callable, api: str) -> Callable:
    @functools.wraps(orig)
    def query(*args, **kwargs):
        if "device_type" in kwargs:
            kwargs["device_type"] = _device_type(kwargs["device_type"], api)
        elif not args:  # the old no-argument form asks about CUDA
            return orig(_target)
        else:
            args = (_device_type(args[0], api),) + args[1:]
        return orig(*args, **kwargs)

    query._torchneuron_compat = True
    return query


# --------------------------------------------------------------------------------------
# Replacements: torch.distributed
# --------------------------------------------------------------------------------------

def _backend_for_nccl() -> str:
    if _target == "cpu":
        return "gloo"
    import torch.distributed as dist

    return "neuron" if "neuron" in dist.Backend.backend_list else "gloo"


def _map_backend(backend: Any) -> Any:
    if not isinstance(backend, str) or "nccl" not in backend.lower():
        return backend
    _note("init_process_group('nccl')")
    chosen = _backend_for_nccl()
    if ":" not in backend:
        return chosen
    pairs: dict[str, str] = {}
    for item in backend.split(","):
        dev, _, name = item.partition(":")
        dev = _target if dev.strip() == "cuda" else dev.strip()
        name = chosen if name.strip().lower() == "nccl" else name.strip()
        pairs.setdefault(dev, name)
    return ",".join(f"{d}:{b}" for d, b in pairs.items())


def _make_process_group_init(orig: Callable) -> Callable:
    """``init_process_group`` with 'nccl' mapped as below and a CUDA ``device_id`` as the target's device."""
    call = _make_backend_taker(orig, 0)
    device_position = 8  # init_process_group(backend, init_method, timeout, world_size, rank, store,
    #                                         group_name, pg_options, device_id)

    @functools.wraps(orig)
    def init(*args, **kwargs):
        if "device_id" in kwargs:
            kwargs["device_id"] = _map_if_cuda(kwargs["device_id"], "init_process_group(device_id=cuda)")
        elif len(args) > device_position:
            args = args[:device_position] + (_map_if_cuda(args[device_position], "init_process_group(device_id=cuda)"),) \
                + args[device_position + 1:]
        return call(*args, **kwargs)

    return init


def _make_backend_taker(orig: Callable, position: int) -> Callable:
    @functools.wraps(orig)
    def call(*args, **kwargs):
        if len(args) > position:
            args = args[:position] + (_map_backend(args[position]),) + args[position + 1:]
        if "backend" in kwargs:
            kwargs["backend"] = _map_backend(kwargs["backend"])
        return orig(*args, **kwargs)

    return call


# --------------------------------------------------------------------------------------
# torch.cuda routed to torch.neuron (or to the CPU)
# --------------------------------------------------------------------------------------

CUDA_FUNCTIONS = (
    "current_device", "current_stream", "default_stream", "device_count", "empty_cache",
    "get_device_capability", "get_device_name", "get_device_properties", "get_rng_state",
    "get_rng_state_all", "init", "initial_seed", "is_available", "is_bf16_supported", "is_initialized",
    "manual_seed", "manual_seed_all", "max_memory_allocated", "max_memory_reserved", "mem_get_info",
    "memory_allocated", "memory_reserved", "memory_stats", "memory_summary",
    "reset_accumulated_memory_stats", "reset_max_memory_allocated", "reset_peak_memory_stats", "seed",
    "seed_all", "set_device", "set_rng_state", "set_rng_state_all", "set_stream", "stream", "synchronize",
)
CUDA_CLASSES = ("Event", "Stream", "StreamContext", "device", "device_of")
NVTX_FUNCTIONS = ("mark", "range", "range_end", "range_pop", "range_push", "range_start")


def _cpu_standins() -> dict[str, Callable]:
    """What ``torch.cuda.<name>`` does when CUDA stands for the CPU.

    Questions about the device get neuron's answers, so the program takes the same
    paths as on neuron; work and randomness are the CPU's.
    """
    neuron = torch.neuron
    zero = lambda *a, **k: 0  # noqa: E731
    nothing = lambda *a, **k: None  # noqa: E731
    return {
        "current_device": lambda: 0,
        "device_count": neuron.device_count,
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "init": nothing,
        "set_device": nothing,
        "synchronize": nothing,
        "empty_cache": nothing,
        "get_device_capability": lambda device=None: neuron.get_device_capability(),
        "get_device_name": lambda device=None: neuron.get_device_name(),
        "get_device_properties": lambda device=None: neuron.get_device_properties(),
        "is_bf16_supported": neuron.is_bf16_supported,
        "mem_get_info": lambda device=None: neuron.mem_get_info(),
        "memory_allocated": zero, "max_memory_allocated": zero,
        "memory_reserved": zero, "max_memory_reserved": zero,
        "memory_stats": lambda *a, **k: {},
        "memory_summary": lambda *a, **k: "",
        "reset_accumulated_memory_stats": nothing, "reset_max_memory_allocated": nothing,
        "reset_peak_memory_stats": nothing,
        **_host_random(),
        "current_stream": lambda device=None: neuron.current_stream(),
        "default_stream": lambda device=None: neuron.default_stream(),
        "set_stream": nothing,
        "stream": lambda s: contextlib.nullcontext(),
    }


def _host_random() -> dict[str, Callable]:
    """``torch.cuda`` random functions acting on the CPU generator (the CPU target and ``host_rng``)."""

    def manual_seed(seed: int) -> None:
        torch.random.manual_seed(seed)

    def seed() -> None:
        torch.random.seed()

    def get_rng_state(device: Any = "cuda") -> torch.Tensor:
        return torch.random.get_rng_state()

    def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
        torch.random.set_rng_state(new_state)

    def set_rng_state_all(new_states: Any) -> None:
        for state in new_states:
            torch.random.set_rng_state(state)

    return {
        "manual_seed": manual_seed, "manual_seed_all": manual_seed, "seed": seed, "seed_all": seed,
        "initial_seed": torch.random.initial_seed, "get_rng_state": get_rng_state,
        "get_rng_state_all": lambda: [torch.random.get_rng_state()], "set_rng_state": set_rng_state,
        "set_rng_state_all": set_rng_state_all,
    }


# torch.cuda questions whose answers are constant: folded into graphs under torch.compile.
_QUERIES = frozenset({"current_device", "device_count", "get_device_capability", "get_device_name",
                      "get_device_properties", "is_available", "is_bf16_supported", "is_initialized"})


def _routed(name: str, orig: Callable) -> Callable:
    """``torch.cuda.<name>``: the target's answer for the program, the original inside PyTorch.

    Under ``torch.compile`` the program's calls are answered too: Dynamo either
    traces this function (``is_compiling()`` is then true) or, taking it for PyTorch's
    own, calls it from ``torch._dynamo.variables`` to fold its result into the graph.
    No ``__wrapped__`` is set, so Dynamo does not see through to the original.
    """
    api = f"torch.cuda.{name}"

    def current(*args, **kwargs):
        return _cuda_replacement(name)(*args, **kwargs)

    if name in _QUERIES:
        # What torch.compiler.assume_constant_result does, without importing Dynamo (1-2 s) at enable().
        current._dynamo_marked_constant = True
    folded = current

    def routed(*args, **kwargs):
        if torch.compiler.is_compiling():
            return folded(*args, **kwargs)
        if _called_from_torch(1) and not _called_from_dynamo_folding(1):
            return orig(*args, **kwargs)
        _note(api)
        if _target != "cpu":
            args, kwargs = _map_args(args, kwargs, api)
        return _cuda_replacement(name)(*args, **kwargs)

    routed.__name__, routed.__qualname__, routed.__doc__ = orig.__name__, orig.__qualname__, orig.__doc__
    routed.__module__ = orig.__module__
    routed._torchneuron_compat = True
    return routed


def _called_from_dynamo_folding(depth: int) -> bool:
    """Whether the caller is Dynamo evaluating, on behalf of traced code, a function it takes for PyTorch's."""
    return _module_of_frame(depth).startswith("torch._dynamo.variables")


def _index(device: Any) -> Any:
    """A device argument of a ``torch.cuda`` class, translated for ``torch.neuron``."""
    if _target == "cpu" or device is None:
        return None
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    return _map_if_cuda(device, "torch.cuda device argument")


def _cuda_classes() -> dict[str, Any]:
    neuron = torch.neuron
    on_neuron = type(neuron.Stream)

    class Stream(metaclass=on_neuron):
        """``torch.cuda.Stream`` standing for a stream of the neuron device."""

        _generic = torch.Stream

        def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> torch.Stream:
            _note("torch.cuda.Stream")
            return neuron.Stream(_index(device), priority=priority)

    class Event(metaclass=on_neuron):
        """``torch.cuda.Event`` standing for an event of the neuron device."""

        _generic = torch.Event

        def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                    **kwargs: Any) -> torch.Event:
            _note("torch.cuda.Event")
            return neuron.Event(enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)

    class device(neuron.device):
        """``torch.cuda.device``: makes a neuron device current."""

        def __init__(self, device: Any):
            _note("torch.cuda.device")
            super().__init__(_index(device))

    class device_of(neuron.device):
        """``torch.cuda.device_of``: makes the device of a tensor current."""

        def __init__(self, obj: torch.Tensor):
            _note("torch.cuda.device_of")
            super().__init__(obj.get_device() if obj.device.type == "neuron" else None)

    class StreamContext(neuron.StreamContext):
        """``torch.cuda.StreamContext`` on neuron streams."""

    return {"Stream": Stream, "Event": Event, "device": device, "device_of": device_of,
            "StreamContext": StreamContext}


class _NvtxRanges:
    """``torch.cuda.nvtx`` as ``torch.profiler.record_function`` ranges (seen by the profiler)."""

    def __init__(self) -> None:
        self._stack: list[Any] = []

    def range_push(self, msg: str) -> int:
        rf = torch.profiler.record_function(msg)
        rf.__enter__()
        self._stack.append(rf)
        return len(self._stack) - 1

    def range_pop(self) -> int:
        if not self._stack:
            return -1
        self._stack.pop().__exit__(None, None, None)
        return len(self._stack)

    def range_start(self, msg: str) -> int:
        return self.range_push(msg)

    def range_end(self, range_id: int) -> None:
        self.range_pop()

    def mark(self, msg: str) -> None:
        with torch.profiler.record_function(msg):
            pass

    @contextlib.contextmanager
    def range(self, msg: str, *args: Any, **kwargs: Any) -> Iterator[None]:
        with torch.profiler.record_function(msg.format(*args, **kwargs) if (args or kwargs) else msg):
            yield


_replacements: dict[str, Callable] = {}


def _cuda_replacement(name: str) -> Callable:
    """What ``torch.cuda.<name>`` does for the program with the current target."""
    fn = _replacements.get(name)
    if fn is None:
        if _target == "cpu":
            fn = _cpu_standins()[name]
        elif _host_rng and name in _HOST_RANDOM_NAMES:
            fn = _host_random()[name]
        else:
            fn = getattr(torch.neuron, name)
        _replacements[name] = fn
    return fn


_HOST_RANDOM_NAMES = frozenset({"manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed",
                                "get_rng_state", "get_rng_state_all", "set_rng_state", "set_rng_state_all"})



def _set_target(device: Optional[str], host_rng: bool = False) -> None:
    """Set what ``"cuda"`` stands for (None: the layer is off), forgetting what was cached for the previous target."""
    global _target, _host_rng, _int_is_cuda
    _target, _host_rng, _int_is_cuda = device, host_rng if device else False, device == "cpu"
    _str_cache.clear()
    _replacements.clear()
