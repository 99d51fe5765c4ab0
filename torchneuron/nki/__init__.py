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
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from torchneuron import _C

from . import _hardware
from . import isa  # noqa: F401
from . import language  # noqa: F401
from ._core import _RUN, HbmTensor, Instruction, KernelRun, Tile, TileView, _fake, annotate

__all__ = ["jit", "nki_op", "is_nki_op", "record_calls", "Kernel", "KernelCall", "Estimate", "TARGETS", "language",
           "isa"]

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

    def estimate(self, target: Optional[str] = None) -> Estimate:
        """What the call would cost on one NeuronCore of ``target`` (default: the one it ran for)."""
        gen = _hardware.resolve(target, "target") if target is not None else _hardware.resolve(self.target, "target")
        totals: Dict[str, float] = {}
        same = gen.name == self.target
        for i in self.instructions:
            seconds = i.seconds if same else _hardware.instruction_seconds(i.engine, i.work, gen)
            totals[i.engine] = totals.get(i.engine, 0.0) + seconds
        return Estimate(gen.name, totals, len(self.instructions), self.sbuf_peak_bytes_per_partition,
                        self.psum_peak_bytes_per_partition)


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
        wrap = lambda a: HbmTensor(a) if isinstance(a, torch.Tensor) else a  # noqa: E731
        wargs = [wrap(a) for a in args]
        wkwargs = {k: wrap(v) for k, v in kwargs.items()}
        programs = list(itertools.product(*(range(g) for g in self.grid))) if self.grid else [()]
        shared: list = []
        instructions: List[Instruction] = []
        peaks = [0, 0]
        gen = _hardware.current()
        # Under torch.profiler the kernel is device work of its own, named for it, on the device's
        # current stream, and each of its instructions one inside it (not for fake tensors: no work).
        profiled = torch.autograd._profiler_enabled() and not any(_fake(t) for t in tensors)

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
                instructions.extend(r.instructions)
                peaks[0], peaks[1] = max(peaks[0], r.sbuf_peak), max(peaks[1], r.psum_peak)
            if profiled:
                annotate(instructions, gen.name, line=False)
            return result

        if profiled:
            result = _C._launch(f"nki:{self.fn.__name__}", device.index, programs_run, *tensors)
        else:
            result = programs_run()
        call = KernelCall(self.fn.__name__, gen.name, tuple(instructions), peaks[0], peaks[1])
        return _unwrap(result, self.fn.__name__), call


def _unwrap(x, name: str):
    if isinstance(x, HbmTensor):
        return x.tensor
    if isinstance(x, (tuple, list)):
        return type(x)(_unwrap(v, name) for v in x)
    if isinstance(x, (Tile, TileView)):
        raise TypeError(f"{name}: a kernel returns tensors in HBM (nl.ndarray(..., buffer=nl.shared_hbm)), "
                        f"not an on-chip tile")
    return x


def jit(fn: Optional[Callable] = None, *, platform_target: Optional[str] = None, **options) -> Any:
    """``@nki.jit`` or ``@nki.jit(platform_target="trn1")``: make ``fn`` a kernel called with neuron tensors.
    Other options of AWS's ``nki.jit`` (its compiler's flags, ``mode``) do not change what runs here."""
    if fn is None:
        return lambda f: Kernel(f, platform_target=platform_target)
    return Kernel(fn, platform_target=platform_target)


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
