"""NKI-style kernels on the emulated NeuronCore: ``@nki.jit``, the chip's limits, what a kernel costs.

A kernel written for Trainium with AWS's NKI runs here with its imports changed::

    import torchneuron.nki as nki
    import torchneuron.nki.language as nl
    import torchneuron.nki.isa as nisa

    @nki.jit
    def add(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        for m in nl.affine_range(a.shape[0] // 128):
            x = nl.load(a[m * 128:(m + 1) * 128, :])
            y = nl.load(b[m * 128:(m + 1) * 128, :])
            nl.store(out[m * 128:(m + 1) * 128, :], value=nl.add(x, y))
        return out

    c = add(a, b)                    # a, b: neuron tensors; c a neuron tensor
    print(add.estimate(a, b))        # its cost on silicon, per engine, for the target generation

Kernels run on the neuron device's memory, each instruction one vectorized operation over its
tile. Tiles are checked against the target generation's limits (``NEURON_PLATFORM_TARGET_OVERRIDE``:
trn1, trn2 (the default), trn3): at most 128 partitions, SBUF and PSUM capacity per partition and
PSUM banks, matmul tile sizes, dtypes, and reads of elements never written. An error names the
kernel's line. :func:`nki_op` registers a function that calls kernels as a PyTorch custom op.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import itertools
import logging
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from torchneuron import _C

from . import _dtypes, _hardware, _replay
from . import isa  # noqa: F401
from . import language  # noqa: F401
from . import _isa_more, _language_more  # noqa: F401  (the rest of nl's and nisa's names: they add them to nl and nisa)
from . import _isa_constants, _isa_newer, _mx, _views  # noqa: F401  (nisa.constants, the newer NKI's registers and instructions, MX; NkiTensor's view methods)
from . import typing  # noqa: F401  (nki.typing: annotations of tensor parameters)
from ._core import HbmTensor, Tile, TileView, _get, require_defined
from ._numpy import numpy_of as _numpy_of
from ._run import _RUN, Instruction, KernelRun, _fake, annotate

__all__ = ["jit", "nki_op", "is_nki_op", "record_calls", "Kernel", "KernelCall", "Estimate", "TARGETS", "language",
           "isa", "typing", "simulate_kernel", "simulate", "baremetal", "benchmark", "BenchmarkResult", "Latency", "replay_report"]

#: The generations a kernel can target and be estimated for.
TARGETS: Tuple[str, ...] = tuple(_hardware.GENERATIONS)


@dataclasses.dataclass
class Estimate:
    """A kernel's projected time on one NeuronCore of ``target`` (a projection, not a measurement)."""

    target: str
    engine_seconds: Dict[str, float]
    instructions: int
    sbuf_peak_bytes_per_partition: int
    psum_peak_bytes_per_partition: int

    @property
    def seconds(self) -> float:
        """Time with the engines overlapped perfectly: the busiest engine's time."""
        return max(self.engine_seconds.values(), default=0.0)

    @property
    def serial_seconds(self) -> float:
        """Time with no overlap between engines."""
        return sum(self.engine_seconds.values())

    @property
    def bound(self) -> str:
        return max(self.engine_seconds, key=self.engine_seconds.get) if self.engine_seconds else "-"

    def __str__(self) -> str:
        parts = ", ".join(f"{k} {v * 1e6:.2f} us" for k, v in sorted(self.engine_seconds.items(), key=lambda kv: -kv[1]))
        return (f"PROJECTION (not a measurement) on one {self.target} NeuronCore: {self.seconds * 1e6:.2f} us, "
                f"{self.bound}-bound ({parts}; {self.serial_seconds * 1e6:.2f} us with no overlap); "
                f"{self.instructions} instructions; SBUF peak {self.sbuf_peak_bytes_per_partition} B/partition, "
                f"PSUM peak {self.psum_peak_bytes_per_partition} B/partition")


@dataclasses.dataclass(frozen=True)
class KernelCall:
    """One call of a kernel as it ran: its instructions, each with what it did, which is the same on every
    generation, so :meth:`estimate` gives the call's cost on any target without running it again."""

    name: str
    target: str  # the generation it ran for (its limits were checked against this one)
    instructions: Tuple[Instruction, ...]
    sbuf_peak_bytes_per_partition: int
    psum_peak_bytes_per_partition: int
    #: Why a replay of this call's traced graph would not do what the interpreter does ("" if it would).
    not_replayable: str = ""

    def estimate(self, target: Optional[str] = None) -> Estimate:
        """What the call would cost on one NeuronCore of ``target`` (default: the one it ran for)."""
        gen = _hardware.resolve(target, "target") if target is not None else _hardware.resolve(self.target, "target")
        # Computed once per target: a replayed call returns the traced run's KernelCall (its instructions).
        done = self.__dict__.setdefault("_estimates", {})  # (not a field: equality and the frozen fields stay)
        found = done.get(gen.name)
        if found is None:
            totals: Dict[str, float] = {}
            same = gen.name == self.target
            for i in self.instructions:
                seconds = i.seconds if same else _hardware.instruction_seconds(i.engine, i.work, gen)
                totals[i.engine] = totals.get(i.engine, 0.0) + seconds
            found = done[gen.name] = Estimate(gen.name, totals, len(self.instructions),
                                              self.sbuf_peak_bytes_per_partition, self.psum_peak_bytes_per_partition)
        return Estimate(found.target, dict(found.engine_seconds), found.instructions,
                        found.sbuf_peak_bytes_per_partition, found.psum_peak_bytes_per_partition)


replay_report = _replay.replay_report

# The calls being recorded (record_calls), else None.
_CALLS: contextvars.ContextVar[Optional[List[KernelCall]]] = contextvars.ContextVar("torchneuron_nki_calls",
                                                                                      default=None)


@contextlib.contextmanager
def record_calls() -> Iterator[List[KernelCall]]:
    """Record every kernel call made inside the block (not ``estimate``'s runs), in order::

        with nki.record_calls() as calls:
            y = my_nki_op(x)
        print(sum(c.estimate("trn1").seconds for c in calls))
    """
    calls: List[KernelCall] = []
    token = _CALLS.set(calls)
    try:
        yield calls
    finally:
        _CALLS.reset(token)


class Kernel:
    """A function decorated with ``@nki.jit``; ``kernel[grid](...)`` launches a grid of programs."""

    # Not a test, whatever its name: pytest collects a module's callables named test_* but skips those whose
    # __test__ is false (AWS's samples name kernels test_*; AWS's nki.jit objects are not collected either).
    __test__ = False

    def __init__(self, fn: Callable, grid: Tuple[int, ...] = (), platform_target: Optional[str] = None):
        self.fn, self.grid, self.platform_target = fn, grid, platform_target
        if platform_target is not None:
            _hardware.resolve(platform_target, f"@nki.jit({fn.__name__}) platform_target")
        functools.update_wrapper(self, fn)
        self.last_estimate: Optional[Estimate] = None

    def __getitem__(self, grid) -> "Kernel":
        grid = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
        if not grid or any(int(g) < 1 for g in grid):
            raise ValueError(f"{self.fn.__name__}[{grid}]: a grid is one or more positive sizes")
        return Kernel(self.fn, tuple(int(g) for g in grid), self.platform_target)

    def __call__(self, *args, **kwargs):
        if not self.grid and _RUN.get() is not None:
            # A kernel called by a kernel (AWS's helpers, @nki.jit(mode='trace')): inlined, as NKI traces it
            # into its caller: the caller's program (nl.program_id), tiles, memory and instruction list.
            return self.fn(*args, **kwargs)
        if _numpy_call(args, kwargs):  # AWS's "auto" mode: numpy arrays in, numpy arrays out
            return _run_numpy(self, "nki.jit", args, kwargs)[0]
        token = _hardware.TARGET.set(self.platform_target)
        try:
            result, call = self._run(args, kwargs)
        finally:
            _hardware.TARGET.reset(token)
        self.last_estimate = call.estimate()
        calls = _CALLS.get()
        if calls is not None:
            calls.append(call)
        return result

    def estimate(self, *args, target: Optional[str] = None, **kwargs) -> Estimate:
        """Run the kernel and return what it would cost on ``target`` (default: the kernel's target)."""
        if target is not None:
            _hardware.resolve(target, "target")
        tokens = (_hardware.TARGET.set(target if target is not None else self.platform_target),
                  _hardware._EXPLICIT.set(target is not None))
        try:
            _, call = self._run(args, kwargs)
        finally:
            _hardware._EXPLICIT.reset(tokens[1])
            _hardware.TARGET.reset(tokens[0])
        return call.estimate()

    def _run(self, args, kwargs) -> Tuple[Any, KernelCall]:
        types = self.__dict__.get("_param_types")
        if types is None:
            types = self._param_types = typing.param_types(self.fn)
        typing.check_call(self.fn, self.fn.__name__, args, kwargs, types)
        device = None
        tensors = []
        for a in itertools.chain(args, kwargs.values()):
            if isinstance(a, torch.Tensor):
                if a.device.type != "neuron":
                    raise ValueError(f"{self.fn.__name__}: NKI kernels take tensors on the neuron device, got one on "
                                     f"{a.device} (move it with .to('neuron'))")
                if device is not None and a.device != device:
                    raise ValueError(f"{self.fn.__name__}: tensors on {device} and {a.device}; a kernel runs on one device")
                device = a.device
                tensors.append(a)
        if device is None:
            device = torch.device("neuron", torch.neuron.current_device())
        programs = list(itertools.product(*(range(g) for g in self.grid))) if self.grid else [()]
        gen = _hardware.current()
        # Under torch.profiler the kernel is device work of its own, named for it, on the device's
        # current stream, and each of its instructions one inside it (not for fake tensors: no work).
        fake = any(_fake(t) for t in tensors)
        profiled = torch.autograd._profiler_enabled() and not fake

        def interpret(ts: List[torch.Tensor]) -> Tuple[Any, KernelCall]:
            """The kernel run instruction by instruction on ``ts`` (the call's tensors, in order)."""
            given = iter(ts)
            wrap = lambda a: HbmTensor(next(given)) if isinstance(a, torch.Tensor) else a  # noqa: E731
            wargs = [wrap(a) for a in args]
            wkwargs = {k: wrap(v) for k, v in kwargs.items()}
            shared: list = []
            instructions: List[Instruction] = []
            peaks = [0, 0]
            not_replayable: List[str] = []

            def programs_run(*_tensors):
                result = None
                for program in programs:
                    r = KernelRun(device, self.grid, program, shared)
                    r.profiled = profiled
                    token = _RUN.set(r)
                    try:
                        result = self.fn(*wargs, **wkwargs)
                    finally:
                        _RUN.reset(token)
                    r.finish()  # SBUF/PSUM by liveness: the peaks, a MemoryError over the target's capacity
                    instructions.extend(r.instructions)
                    peaks[0], peaks[1] = max(peaks[0], r.sbuf_peak), max(peaks[1], r.psum_peak)
                    if r.not_replayable:
                        not_replayable.append(r.not_replayable)
                if profiled:
                    annotate(instructions, gen.name, line=False)
                return result

            if profiled:
                result = _C._launch(f"nki:{self.fn.__name__}", device.index, programs_run, *ts)
            else:
                result = programs_run()
            call = KernelCall(self.fn.__name__, gen.name, tuple(instructions), peaks[0], peaks[1],
                              not_replayable[0] if not_replayable else "")
            return _unwrap(result, self.fn.__name__), call

        # The same kernel, key (layouts, constants, grid, target) called again: replayed (_replay).
        key = None if (profiled or fake or not _replay.usable()) else _replay.key(
            self.grid, gen.name, [a for a in args], kwargs)
        if key is None:
            return interpret(tensors)
        table = _replay.entries(self.fn)
        entry = table.get(key)
        if entry is None:
            entry = table[key] = _replay.Entry()
        entry.calls += 1
        if entry.runner is not None:
            entry.replays += 1
            return entry.runner(tensors), entry.call
        if entry.interpret or not _replay.due(entry):
            start = time.perf_counter()
            result, entry.call = interpret(tensors)
            entry.interpreted_seconds += time.perf_counter() - start
            return result, entry.call
        result, entry.call = _replay.trace_and_compile(entry, self.fn.__name__, interpret, tensors)
        return result, entry.call


def _unwrap(x, name: str):
    if isinstance(x, HbmTensor):
        return x.tensor
    if isinstance(x, (tuple, list)):
        return type(x)(_unwrap(v, name) for v in x)
    if isinstance(x, (Tile, TileView)):
        # As AWS's simulator: a returned SBUF/PSUM tile comes back as a tensor of its values (on a device a
        # kernel's outputs are in HBM). Elements never written are an error, as for a store.
        require_defined(x, f"{name}: the tile it returns")
        return _get(x.tile.data, x.index).clone()
    return x


_MODES = ("auto", "torchxla", "jax", "baremetal", "benchmark", "simulation", "trace")


def jit(fn: Optional[Callable] = None, *, platform_target: Optional[str] = None, mode: str = "auto",
        **options) -> Any:
    """``@nki.jit`` or ``@nki.jit(platform_target="trn1")``: make ``fn`` a kernel called with neuron tensors.

    ``mode`` as AWS's: "auto" (also "torchxla", "jax", "trace" (a kernel traced for the harness): a framework's tensors, here neuron tensors; a call
    with numpy arrays runs as :func:`simulate` does),
    "simulation" and "baremetal" (called with numpy arrays, :func:`simulate`), "benchmark" (numpy arrays
    and a projected latency, :func:`benchmark`). Other options (compiler flags) do not change what runs."""
    if mode not in _MODES:
        raise ValueError(f"nki.jit: mode is one of {list(_MODES)}, got {mode!r}")
    if fn is None:
        return lambda f: jit(f, platform_target=platform_target, mode=mode, **options)
    kernel = Kernel(fn, platform_target=platform_target)
    if mode in ("simulation", "baremetal"):
        return _NumpyKernel(kernel, f"nki.jit(mode={mode!r})")
    if mode == "benchmark":
        return _BenchmarkKernel(kernel, "nki.jit(mode='benchmark')")
    return kernel


def nki_op(name: str, *, mutates_args: Sequence[str] = (), schema: Optional[str] = None) -> Callable:
    """Register a function that calls NKI kernels as the PyTorch custom op ``name`` ("ns::op").

    The function's annotations give the op's schema (as with ``torch.library.custom_op``). The op's
    neuron kernel runs the function; its fake kernel runs it on fake tensors, which finds the
    outputs' shapes without doing the kernels' data work. It works in eager mode, under
    ``torch.compile`` as one graph node, and with ``op.register_autograd``.
    """
    def register(fn: Callable):
        op = torch.library.custom_op(name, fn, mutates_args=tuple(mutates_args), device_types="neuron", schema=schema)
        op.register_fake(fn)
        _OPS.add(name)
        return op

    return register


_OPS: set = set()  # the names of the ops nki_op registered ("ns::op")


def is_nki_op(op: Any) -> bool:
    """Whether ``op`` (an ``OpOverload`` such as ``torch.ops.mylib.rmsnorm.default``, or its name
    ``"mylib::rmsnorm"``) was registered by :func:`nki_op`: its calls run NKI kernels."""
    schema = getattr(op, "_schema", None)
    return (schema.name if schema is not None else str(op)) in _OPS


# ---- the host harness: numpy in, numpy out (AWS's nki.simulate_kernel, nki.baremetal, nki.benchmark) ----

def _as_kernel(kernel, what: str) -> Kernel:
    if isinstance(kernel, Kernel):
        return kernel
    if isinstance(kernel, _NumpyKernel):  # nki.benchmark(nki.simulate(k)) and the like: the kernel inside
        return kernel.kernel
    if callable(kernel):
        return Kernel(kernel)
    raise TypeError(f"{what} takes a kernel (a function, or one decorated with @nki.jit), got "
                    f"{type(kernel).__name__}")


def _numpy_call(args, kwargs) -> bool:
    """Whether a kernel call is given numpy arrays and no torch tensor."""
    values = list(itertools.chain(args, kwargs.values()))
    has_numpy = any(type(v).__module__ == "numpy" and type(v).__name__ == "ndarray" for v in values)
    return has_numpy and not any(isinstance(v, torch.Tensor) for v in values)


def _run_numpy(kernel: Kernel, what: str, args, kwargs, estimate_targets: Sequence[str] = (),
               placeholders: bool = False):
    """Run ``kernel`` on numpy arrays: each is copied to the neuron device, the kernel runs there, the
    arrays it was given are updated with what it wrote to them (outputs the caller allocated), and what
    it returns comes back as numpy arrays. Returns (result, {target: Estimate})."""
    import numpy as np

    device = torch.device("neuron", torch.neuron.current_device())
    pairs = []

    def to_device(name, a):
        if isinstance(a, typing.TensorType):
            if not placeholders:
                raise TypeError(f"{what}({kernel.fn.__name__}): argument {name} is an annotation ({a!r}); only "
                                f"nki.benchmark takes annotations for inputs, the others take numpy arrays")
            return a.placeholder(f"{what}({kernel.fn.__name__}) argument {name}").to(device)
        if isinstance(a, torch.Tensor):
            raise TypeError(f"{what}({kernel.fn.__name__}): argument {name} is a torch.Tensor; this harness takes "
                            f"numpy arrays (call the kernel itself with neuron tensors)")
        if isinstance(a, np.ndarray):
            try:  # ml_dtypes' bfloat16 and fp8 arrays, as AWS's samples use, by their bits
                t = _dtypes.to_torch(a).to(device)
            except TypeError:
                raise TypeError(f"{what}({kernel.fn.__name__}): argument {name} has NumPy dtype {a.dtype}, which "
                                f"has no NKI counterpart") from None
            pairs.append((a, t))
            return t
        return a

    targs = [to_device(str(i), a) for i, a in enumerate(args)]
    tkwargs = {k: to_device(repr(k), v) for k, v in kwargs.items()}
    result = kernel(*targs, **tkwargs)
    estimates = {kernel.last_estimate.target: kernel.last_estimate}
    for target in estimate_targets:
        if target not in estimates:
            estimates[target] = kernel.estimate(*targs, target=target, **tkwargs)
    for a, t in pairs:  # what the kernel wrote into its arguments (nl.store into an output it was given)
        if a.flags.writeable:
            host = _dtypes.to_numpy(t.cpu(), what, like=a.dtype)
            np.copyto(a, host.reshape(a.shape), casting="unsafe")

    def to_numpy(x):
        if isinstance(x, torch.Tensor):
            return _numpy_of(x.cpu(), what)
        if isinstance(x, (tuple, list)):
            return type(x)(to_numpy(v) for v in x)
        return x

    return to_numpy(result), estimates


def simulate_kernel(kernel, *args, **kwargs):
    """``nki.simulate_kernel(kernel, *arrays, **kwargs)``: run ``kernel`` on numpy arrays, return numpy arrays.

    As AWS's ``simulate_kernel``, inputs and outputs are ``numpy.ndarray``; here the kernel runs on the
    emulated NeuronCore (the neuron device) with the same checks as a call with neuron tensors."""
    result, _ = _run_numpy(_as_kernel(kernel, "nki.simulate_kernel"), "nki.simulate_kernel", args, kwargs)
    return result


class _NumpyKernel:
    """A kernel called with numpy arrays (``nki.simulate``, ``nki.baremetal``, ``nki.benchmark``)."""

    __test__ = False  # as Kernel's

    def __init__(self, kernel: Kernel, what: str):
        self.kernel, self.what = kernel, what
        functools.update_wrapper(self, kernel.fn)

    def __call__(self, *args, **kwargs):
        result, _ = _run_numpy(self.kernel, self.what, args, kwargs)
        return result

    def __getitem__(self, grid) -> "_NumpyKernel":
        return type(self)(self.kernel[grid], self.what)


def simulate(kernel=None, **options):
    """``nki.simulate(kernel)(*arrays)``: the kernel as a function of numpy arrays (see :func:`simulate_kernel`)."""
    if kernel is None:
        return lambda k: simulate(k, **options)
    return _NumpyKernel(_as_kernel(kernel, "nki.simulate"), "nki.simulate")


def baremetal(kernel=None, **options):
    """``@nki.baremetal`` / ``@nki.baremetal(save_neff_name=...)``: the kernel called with numpy arrays.

    AWS's compiles and runs it on a local NeuronDevice; here it runs on the emulated one. Its options
    (``save_neff_name``, ``save_trace_name``, ``additional_compile_opt``, ``artifacts_dir``) name compiler
    artifacts that do not exist here: they are accepted and logged, no file is written."""
    if kernel is None:
        return lambda k: baremetal(k, **options)
    if options:
        logging.getLogger("torchneuron").info("nki.baremetal(%s): options %s produce no artifacts on the emulated "
                                              "NeuronCore", getattr(kernel, "__name__", kernel), sorted(options))
    return _NumpyKernel(_as_kernel(kernel, "nki.baremetal"), "nki.baremetal")


_PERCENTILES = (0, 1, 10, 25, 50, 90, 99, 100)


@dataclasses.dataclass
class Latency:
    """``benchmark_result.nc_latency``: the kernel's PROJECTED latency (the cost model's estimate on one
    NeuronCore of ``target``, :meth:`Kernel.estimate`), not a measurement. The model is deterministic, so
    every percentile is the same figure; it excludes the host-device transfers AWS's ``neuron-bench``
    includes."""

    target: str
    estimate: Estimate
    projection: bool = True

    def get_latency_percentile(self, percentile: int) -> float:
        """The projected latency in microseconds (the same for every percentile AWS offers)."""
        if percentile not in _PERCENTILES:
            raise ValueError(f"get_latency_percentile({percentile!r}): the percentiles are {list(_PERCENTILES)}")
        return self.estimate.seconds * 1e6

    def __str__(self) -> str:
        return f"projected latency {self.estimate.seconds * 1e6:.2f} us on {self.target} (PROJECTION, not measured)"


@dataclasses.dataclass
class BenchmarkResult:
    """``kernel.benchmark_result``: the projection for the kernel's target (``nc_latency``) and for every
    generation (``estimates``, target -> :class:`Estimate`)."""

    nc_latency: Latency
    estimates: Dict[str, Estimate]
    warmup: int
    iters: int


class _BenchmarkKernel(_NumpyKernel):
    def __init__(self, kernel: Kernel, what: str, warmup: int = 10, iters: int = 100):
        super().__init__(kernel, what)
        self.warmup, self.iters = warmup, iters
        self.benchmark_result: Optional[BenchmarkResult] = None

    def __call__(self, *args, **kwargs):
        result, estimates = _run_numpy(self.kernel, self.what, args, kwargs, TARGETS, placeholders=True)
        own = self.kernel.last_estimate
        self.benchmark_result = BenchmarkResult(Latency(own.target, own), estimates, self.warmup, self.iters)
        log = logging.getLogger("torchneuron")
        for target, e in estimates.items():
            log.info("nki.benchmark(%s): %s", self.kernel.fn.__name__, e)
        return result

    def __getitem__(self, grid) -> "_BenchmarkKernel":
        return _BenchmarkKernel(self.kernel[grid], self.what, self.warmup, self.iters)


def benchmark(kernel=None, *, warmup: int = 10, iters: int = 100, **options):
    """``@nki.benchmark(warmup=10, iters=100)``: the kernel called with numpy arrays; after a call,
    ``kernel.benchmark_result.nc_latency.get_latency_percentile(50)`` is its latency in microseconds.

    There is no NeuronDevice to time here: the latency is the cost model's PROJECTION for one NeuronCore
    of the kernel's target (:meth:`Kernel.estimate`; ``benchmark_result.estimates`` has every generation),
    labelled as such, and unlike AWS's the kernel's outputs are computed (from the inputs given). As
    with AWS's, an input may be given as an annotation (``nt.tensor[[128, 512], nl.bfloat16]``): it
    stands for zeros of that shape and dtype.
    ``warmup`` and ``iters`` are recorded; the projection does not depend on them."""
    for name, v in (("warmup", warmup), ("iters", iters)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"nki.benchmark: {name} is a non-negative int, got {v!r}")
    if kernel is None:
        return lambda k: benchmark(k, warmup=warmup, iters=iters, **options)
    return _BenchmarkKernel(_as_kernel(kernel, "nki.benchmark"), "nki.benchmark", warmup, iters)


# ---- AWS's import names (opt-in) and nki.compiler ------------------------------------------------------

from . import compiler  # noqa: E402,F401  (nki.compiler: the compiler's directives, no-ops here)
# ncc.jit and the like are this package's (nki.compiler builds on nothing above _core: no import circle).
compiler.jit, compiler.benchmark, compiler.baremetal, compiler.simulate_kernel = jit, benchmark, baremetal, simulate_kernel
from ._alias import aliased, install_alias, uninstall_alias  # noqa: E402,F401

#: ``nki.trace``: AWS's name of a kernel traced for the host harness (``nki.simulate_kernel(nki.trace(k), ...)``);
#: here the same as :func:`jit`.
trace = jit
#: ``nki.tensor``: the annotation of a kernel's tensor parameters (``nki.typing.tensor``).
tensor = typing.tensor

__all__ += ["compiler", "install_alias", "uninstall_alias", "aliased", "trace", "tensor"]
