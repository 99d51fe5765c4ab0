"""``torchneuron parity``: run a program on the CPU and on neuron and compare its losses.

The same program runs twice, side by side, each in a fresh interpreter with the
CUDA compatibility layer on: once with CUDA standing for the CPU (the reference),
once for neuron. Both runs draw their random numbers from the CPU generator (see
:mod:`torchneuron.migrate.host_rng`), so a correct backend gives the same numbers.

Losses are collected without touching the program: every ``backward()`` on a
one-element tensor records its value (divided back by the scale when a
``GradScaler`` scaled it). A program that never calls ``backward()`` is compared
on the losses it prints: the first ``loss=<float>`` or ``loss: <float>`` of each
line of its output.

Two losses agree when ``|neuron - cpu| <= atol + rtol * |cpu|``. The defaults are
tight (``rtol=1e-4``, ``atol=1e-5``): neuron runs PyTorch's CPU kernels, so float32
programs agree to the last bit. Mixed precision is looser by nature (the CPU's and
neuron's autocast op lists differ), so when the program autocasts the defaults are
``rtol=2e-2``, ``atol=1e-3``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from .runner import command, parse_printed_losses

__all__ = ["ParityResult", "compare", "format_result", "main", "run_parity"]

FP32_TOLERANCE = (1e-4, 1e-5)
AMP_TOLERANCE = (2e-2, 1e-3)


@dataclass
class _Run:
    device: str
    exit_code: int
    losses: list[float]
    printed: list[float]
    stdout: str
    stderr: str
    wall_time_s: float
    autocast: bool


@dataclass
class ParityResult:
    """The outcome of a parity run.

    Attributes:
        ok: both runs finished and every loss agrees.
        source: ``"backward"`` or ``"printed"``: which losses were compared.
        cpu, neuron: the compared losses of each run.
        first_divergence: index of the first loss that disagrees (or the first one
            missing from a run), else None.
        rtol, atol: the tolerance used.
        runs: per-device exit code, time and output tail.
    """

    ok: bool
    source: str
    cpu: list[float]
    neuron: list[float]
    first_divergence: Optional[int]
    rtol: float
    atol: float
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    message: str = ""


def _close(a: float, b: float, rtol: float, atol: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= atol + rtol * abs(b)


def compare(cpu: Sequence[float], neuron: Sequence[float], rtol: float, atol: float) -> Optional[int]:
    """Index of the first pair that disagrees, or of the first loss only one run has; None if all agree."""
    for i, (a, b) in enumerate(zip(neuron, cpu)):
        if not _close(a, b, rtol, atol):
            return i
    if len(cpu) != len(neuron):
        return min(len(cpu), len(neuron))
    return None


def _start(device: str, script: str, argv: Sequence[str]) -> tuple[subprocess.Popen, str]:
    fd, record = tempfile.mkstemp(suffix=".json", prefix=f"torchneuron-parity-{device}-")
    os.close(fd)
    env = dict(os.environ, PYTHONUNBUFFERED="1", TORCHNEURON_TRANSFER_CUDA="0")
    proc = subprocess.Popen(command("--device", device, "--host-rng", "--record", record, script, *argv),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return proc, record


def _finish(device: str, proc: subprocess.Popen, record: str, timeout: Optional[float]) -> _Run:
    try:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
            stderr += f"\ntorchneuron parity: the {device} run took longer than {timeout} s and was stopped"
        try:
            with open(record) as f:
                data = json.load(f)
        except (OSError, ValueError):
            data = {}
    finally:
        os.unlink(record)
    return _Run(device, proc.returncode, data.get("losses", []), parse_printed_losses(stdout), stdout, stderr,
                data.get("wall_time_s", 0.0), bool(data.get("autocast")))


def run_parity(script: str, argv: Sequence[str] = (), *, rtol: Optional[float] = None,
               atol: Optional[float] = None, timeout: Optional[float] = None) -> ParityResult:
    """Run ``script argv...`` with CUDA on the CPU and on neuron, and compare the losses.

    Args:
        script: the program.
        argv: its arguments.
        rtol, atol: the tolerance (default: see the module docstring).
        timeout: seconds allowed for each run.
    """
    started = {device: _start(device, script, argv) for device in ("cpu", "neuron")}  # side by side
    cpu, neuron = (_finish(device, *started[device], timeout) for device in ("cpu", "neuron"))
    amp = cpu.autocast or neuron.autocast
    default_rtol, default_atol = AMP_TOLERANCE if amp else FP32_TOLERANCE
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    if cpu.losses or neuron.losses:
        source, a, b = "backward", cpu.losses, neuron.losses
    else:
        source, a, b = "printed", cpu.printed, neuron.printed
    runs = {r.device: {"exit_code": r.exit_code, "wall_time_s": r.wall_time_s, "autocast": r.autocast,
                       "stdout_tail": r.stdout[-2000:], "stderr_tail": r.stderr[-4000:]} for r in (cpu, neuron)}
    result = ParityResult(False, source, a, b, None, rtol, atol, runs)
    failed = [r for r in (cpu, neuron) if r.exit_code != 0]
    if failed:
        result.message = "; ".join(f"the {r.device} run failed (exit code {r.exit_code})" for r in failed)
        result.first_divergence = compare(a, b, rtol, atol)
        return result
    if not a and not b:
        result.message = ("no losses found: the program called backward() on no scalar and printed no "
                          "'loss=<float>' lines")
        return result
    result.first_divergence = compare(a, b, rtol, atol)
    result.ok = result.first_divergence is None
    return result


def format_result(r: ParityResult, script: str, show: int = 10) -> str:
    """The result as text for a terminal."""
    lines = [f"torchneuron parity: {os.path.basename(script)}: CPU vs neuron, "
             f"{len(r.cpu)} vs {len(r.neuron)} losses ({'at backward()' if r.source == 'backward' else 'printed'}), "
             f"tolerance rtol={r.rtol:g} atol={r.atol:g}"
             + (" (mixed precision)" if any(run["autocast"] for run in r.runs.values()) else "")]
    lines.append(f"  {'step':>5} {'cpu':>16} {'neuron':>16} {'abs diff':>10} {'rel diff':>10}")
    n = max(len(r.cpu), len(r.neuron))
    shown = list(range(min(n, show)))
    if r.first_divergence is not None and r.first_divergence >= show:
        shown += [r.first_divergence]
    for i in shown:
        a = r.cpu[i] if i < len(r.cpu) else None
        b = r.neuron[i] if i < len(r.neuron) else None
        if a is not None and b is not None:
            diff = abs(a - b)
            rel = diff / abs(a) if a else float("inf") if diff else 0.0
            mark = "  <- first divergence" if i == r.first_divergence else ""
            lines.append(f"  {i:>5} {a:>16.8g} {b:>16.8g} {diff:>10.2e} {rel:>10.2e}{mark}")
        else:
            lines.append(f"  {i:>5} {a if a is not None else '-':>16} {b if b is not None else '-':>16}"
                         + ("  <- first divergence" if i == r.first_divergence else ""))
    if n > len(shown):
        lines.append(f"  ... {n - len(shown)} more")
    for device, run in r.runs.items():
        lines.append(f"  {device}: exit code {run['exit_code']}, {run['wall_time_s']:.2f} s")
        if run["exit_code"] != 0 and run["stderr_tail"]:
            lines += ["    " + line for line in run["stderr_tail"].rstrip().splitlines()[-8:]]
    if r.ok:
        lines.append(f"PASS: all {len(r.cpu)} losses agree")
    elif r.message:
        lines.append(f"FAIL: {r.message}")
    else:
        i = r.first_divergence
        lines.append(f"FAIL: first divergence at loss {i}" + (
            f": cpu {r.cpu[i]:.8g} vs neuron {r.neuron[i]:.8g}" if i < min(len(r.cpu), len(r.neuron))
            else ": one run has fewer losses"))
    return "\n".join(lines) + "\n"


def main(script: str, script_args: Sequence[str], rtol: Optional[float] = None, atol: Optional[float] = None,
         json_path: Optional[str] = None) -> int:
    """``torchneuron parity [--rtol R] [--atol A] [--json FILE] script.py [args...]``.

    Returns 0 when the losses agree, 1 when they diverge, 2 when a run failed or no losses were found.
    """
    from .doctor import split_tool_args

    args, found = split_tool_args(script_args, {"--json": True, "--rtol": True, "--atol": True})
    json_path = found.get("--json", json_path)
    rtol = float(found["--rtol"]) if "--rtol" in found else rtol
    atol = float(found["--atol"]) if "--atol" in found else atol
    result = run_parity(script, args, rtol=rtol, atol=atol)
    print(format_result(result, script), end="")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result.__dict__, f, indent=1)
    if result.ok:
        return 0
    return 2 if result.message else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
