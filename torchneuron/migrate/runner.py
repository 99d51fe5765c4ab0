"""Running a user's program inside this process, and recording its losses.

:func:`run_script` runs ``python script.py args...`` in the current interpreter
(so tools can watch it); :class:`LossRecorder` notes the value of every scalar
``backward()``. ``python -m torchneuron.migrate.runner`` runs a program with the
CUDA compatibility layer on and writes what it recorded as JSON: the child
process of ``torchneuron parity``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import runpy
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["LossRecorder", "ScriptResult", "command", "parse_printed_losses", "run_script", "main"]


@dataclass
class ScriptResult:
    """How a program run by :func:`run_script` ended.

    Attributes:
        exit_code: what ``python script.py`` would have exited with.
        error: the traceback if the program raised, else None.
        wall_time_s: time spent running the program (not starting Python or importing torch).
    """

    exit_code: int
    error: Optional[str] = None
    wall_time_s: float = 0.0


def run_script(path: str, argv: Sequence[str] = ()) -> ScriptResult:
    """Run a Python program as ``python path argv...`` would, in this process.

    ``sys.argv`` and ``sys.path[0]`` are the program's while it runs; its
    ``SystemExit`` becomes the exit code and an exception a traceback, not a crash.

    Args:
        path: the program.
        argv: its arguments.
    """
    path = os.path.abspath(path)
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(path))
    start = time.perf_counter()
    error = None
    try:
        runpy.run_path(path, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the program's failure is a result, not ours
        error = traceback.format_exc()
        code = 1
    finally:
        elapsed = time.perf_counter() - start
        sys.argv = saved_argv
        sys.path[:] = saved_path
    return ScriptResult(code, error, elapsed)


def _is_power_of_two(x: float) -> bool:
    return x > 0 and math.isfinite(x) and math.frexp(x)[0] == 0.5


def loss_value(t: torch.Tensor) -> float:
    """The value of a scalar loss about to be back-propagated, unscaled if a GradScaler scaled it.

    ``GradScaler.scale(loss)`` is ``loss * scale`` with ``scale`` a one-element
    tensor holding a power of two; that product is divided back.
    """
    value = t.detach().float().item()
    fn = t.grad_fn
    if fn is not None and fn.name() == "MulBackward0":
        other = getattr(fn, "_saved_other", None)
        if isinstance(other, torch.Tensor) and other.numel() == 1 and not other.requires_grad:
            scale = other.detach().float().item()
            if _is_power_of_two(scale) and scale >= 1:
                value /= scale
    return value


class LossRecorder(TorchFunctionMode):
    """Records the value of every scalar tensor ``backward()`` is called on, in order.

    Example::

        >>> with LossRecorder() as rec:
        ...     train()
        >>> rec.losses
        [2.31, 2.28, ...]
    """

    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is _BACKWARD and args and isinstance(args[0], torch.Tensor) and args[0].numel() == 1:
            self.losses.append(loss_value(args[0]))
        return func(*args, **(kwargs or {}))


_BACKWARD = torch.Tensor.backward

# "loss=1.23", "loss: 1.23", "Loss 1.23e-02", "train_loss = 0.5"
_LOSS_RE = re.compile(r"\bloss\b\s*[=:]?\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)", re.IGNORECASE)


def parse_printed_losses(text: str) -> list[float]:
    """The losses a program printed: the first ``loss=<float>`` (or ``loss: <float>``) of each line."""
    out = []
    for line in text.splitlines():
        m = _LOSS_RE.search(line)
        if m:
            out.append(float(m.group(1)))
    return out


@dataclass
class RunRecord:
    """What the runner child writes: exit code, timing and losses."""

    device: str
    exit_code: int
    error: Optional[str]
    wall_time_s: float
    losses: list[float] = field(default_factory=list)
    autocast: bool = False


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m torchneuron.migrate.runner [--device D] [--host-rng] [--record FILE] script [args...]``."""
    parser = argparse.ArgumentParser(prog="python -m torchneuron.migrate.runner",
                                     description="Run a CUDA program with the CUDA compatibility layer on.")
    parser.add_argument("--device", choices=["neuron", "cpu"], default="neuron",
                        help="what 'cuda' stands for (default: neuron)")
    parser.add_argument("--host-rng", action="store_true",
                        help="draw the random numbers of neuron ops from the CPU generator")
    parser.add_argument("--no-compat", action="store_true",
                        help="leave the CUDA compatibility layer off (for programs already device-agnostic)")
    parser.add_argument("--record", metavar="FILE", help="write exit code, time and losses to FILE as JSON")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    opts = parser.parse_args(argv)

    from . import cuda_compat

    rng_mode = None
    if not opts.no_compat:
        cuda_compat.enable(opts.device, host_rng=opts.host_rng)
    elif opts.host_rng:
        from .host_rng import HostRNGMode

        rng_mode = HostRNGMode()
        rng_mode.__enter__()
    apis: set[str] = set()
    cuda_compat.set_recorder(apis.add)
    recorder = LossRecorder()
    with recorder:
        result = run_script(opts.script, opts.args)
    cuda_compat.set_recorder(None)
    if rng_mode is not None:
        rng_mode.__exit__(None, None, None)
    if result.error:
        sys.stderr.write(result.error)
    sys.stdout.flush()
    if opts.record:
        autocast = any("autocast" in api or "GradScaler" in api for api in apis)
        record = RunRecord(opts.device, result.exit_code, result.error, result.wall_time_s, recorder.losses,
                           autocast)
        with open(opts.record, "w") as f:
            json.dump(record.__dict__, f)
    return result.exit_code


def command(*args: str) -> list[str]:
    """The command line running :func:`main` with ``args`` in a fresh interpreter.

    torch is imported first: it loads torchneuron itself, which ``python -m
    torchneuron...`` would otherwise import half-way through torch's own import.
    """
    code = "import sys, torch; from torchneuron.migrate.runner import main; sys.exit(main(sys.argv[1:]))"
    return [sys.executable, "-c", code, *args]


if __name__ == "__main__":
    sys.exit(main())
