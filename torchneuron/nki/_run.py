"""The kernel being run: where its instructions are (the kernel's line), what they cost, and the
tiles it made (their live intervals, :mod:`._limits`).

Every NKI instruction runs inside a :class:`KernelRun`, one per program of a kernel call.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import os
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from . import _hardware as hw
from . import _limits

_HERE = os.path.dirname(os.path.abspath(__file__))


def kernel_line() -> str:
    """'file:line' of the innermost frame outside this package: the kernel's line that is running."""
    frame = sys._getframe(1)
    while frame is not None and _inside(frame.f_code.co_filename):
        frame = frame.f_back
    return "?" if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"


_INSIDE: Dict[str, bool] = {}


def _inside(filename: str) -> bool:
    inside = _INSIDE.get(filename)
    if inside is None:
        inside = _INSIDE[filename] = os.path.dirname(os.path.abspath(filename)) == _HERE
    return inside


def fail(kind: type, message: str):
    """Raise ``kind`` (ValueError, TypeError, RuntimeError, NotImplementedError) naming the kernel's line."""
    raise kind(f"{message} (at {kernel_line()}, target {hw.current().name})")


def _fake(t: torch.Tensor) -> bool:
    global _FakeTensor
    if _FakeTensor is None:  # (imported at the first call: every kernel call asks)
        from torch._subclasses.fake_tensor import FakeTensor as _FakeTensor
    return isinstance(t, _FakeTensor) or t.is_meta


_FakeTensor = None


# ---- the kernel being run -----------------------------------------------------------------------

@dataclasses.dataclass
class Instruction:
    """One instruction a kernel ran: its engine, what it did (``work``, see
    :func:`_hardware.instruction_seconds`), and its time on the target it ran for."""

    name: str
    engine: str
    seconds: float
    line: str
    work: tuple


class KernelRun:
    """One call of a kernel: its device, grid position, live on-chip memory and instruction costs."""

    def __init__(self, device: torch.device, grid: Tuple[int, ...] = (), program: Tuple[int, ...] = (),
                 shared_hbm: Optional[list] = None):
        self.device, self.grid, self.program = device, grid, program
        # The grid's nl.shared_hbm tensors, in allocation order (one list for all its programs).
        self.shared_hbm = [] if shared_hbm is None else shared_hbm
        self.shared_slot = 0
        self.gen = hw.current()
        # Ticks as each instruction (or tile assignment) starts and again as it ends; each tile's
        # Allocation records the tick it was made at and the tick of its last use (_limits).
        self.clock = 0
        self.allocations: List[_limits.Allocation] = []
        self.sbuf_peak = self.psum_peak = 0  # bytes per partition, by liveness (set by finish())
        self.instructions: List[Instruction] = []
        # Under torch.profiler each instruction runs as device work named for it (see instruction()).
        self.profiled = False
        self.in_instruction = False
        # nl.rand / nl.dropout / nisa's random numbers: the program's generator (_language_more._generator).
        self.generator: Optional[torch.Generator] = None
        # VectorE's accumulator register of reduce_cmd (nisa.select_reduce, tensor_scalar_cumulative ...).
        self.accumulator: Optional[torch.Tensor] = None
        # Why this run cannot be replayed from a traced graph (_replay), or "".
        self.not_replayable = ""

    def charge(self, name: str, engine: str, work: tuple) -> None:
        seconds = hw.instruction_seconds(engine, work, self.gen)
        self.instructions.append(Instruction(name, engine, seconds, kernel_line(), work))

    def allocate(self, buffer: str, shape, dtype, per_partition: int, banks: int) -> _limits.Allocation:
        a = _limits.Allocation(buffer, shape, dtype, per_partition, banks, kernel_line(), self.clock, self.clock)
        self.allocations.append(a)
        return a

    def finish(self) -> None:
        """The program ended: its SBUF and PSUM peaks by liveness, and the capacity check (MemoryError)."""
        peaks = _limits.check(self.allocations, self.gen)
        self.sbuf_peak, self.psum_peak = peaks.sbuf_bytes, peaks.psum_bytes


_RUN: contextvars.ContextVar[Optional[KernelRun]] = contextvars.ContextVar("torchneuron_nki_run", default=None)


def run() -> KernelRun:
    r = _RUN.get()
    if r is None:
        fail(RuntimeError, "NKI instructions run inside a kernel: call a function decorated with @nki.jit")
    return r


def annotate(instructions: Sequence[Instruction], target: str, line: bool = True) -> None:
    """Says, on the profiler's event of the device work running now, what ``instructions`` would cost on
    silicon: their engines' busy time on ``target`` and the busiest engine (and, for one instruction
    called by the kernel, its line)."""
    from torchneuron import _C

    busy: Dict[str, float] = {}
    for i in instructions:
        busy[i.engine] = busy.get(i.engine, 0.0) + i.seconds
    if not busy:
        return
    bound = max(busy, key=busy.get)
    _C._annotate_launch("estimate", f"{busy[bound] * 1e6:.3f} us on {target} (projection, not a measurement)")
    _C._annotate_launch("bound engine", bound)
    _C._annotate_launch("engines", ", ".join(f"{k} {v * 1e6:.3f} us" for k, v in sorted(busy.items())))
    if line and instructions[0].line:
        _C._annotate_launch("kernel line", instructions[0].line)


def instruction(fn: Callable, name: Optional[str] = None) -> Callable:
    """``fn`` (an ``nl``/``nisa`` function) as an instruction: while torch.profiler records, the
    kernel's call of it runs as device work named ``nki.<name>`` on the kernel's stream, through the
    runtime's launch like every kernel, so that its time is an event of the device's lane. An
    instruction called by another (``nl.matmul``'s ``nc_matmul``) is part of the outer one's event."""
    event = "nki." + (name or fn.__name__)

    @functools.wraps(fn)
    def run_instruction(*args, **kwargs):
        r = _RUN.get()
        if r is None:
            return fn(*args, **kwargs)
        r.clock += 1  # what the instruction reads, writes and makes is used at this tick ...
        if not r.profiled or r.in_instruction:
            result = fn(*args, **kwargs)
            r.clock += 1  # ... and what comes after it, later
            return result
        from torchneuron import _C

        def body():
            start = len(r.instructions)
            result = fn(*args, **kwargs)
            annotate(r.instructions[start:], r.gen.name)
            return result

        r.in_instruction = True
        try:
            return _C._launch(event, r.device.index, body)
        finally:
            r.in_instruction = False
            r.clock += 1

    return run_instruction


