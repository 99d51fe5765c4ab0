"""What torch.compile did to a program: graphs, graph breaks and recompiles, with reasons and source lines.

:func:`report` reads Dynamo's own records: ``torch._dynamo.utils.counters``, the
compilation metrics Dynamo keeps per compiled frame, and the graph-break reasons
with their user stacks that Dynamo keeps for ``torch._dynamo.explain``
(``torch._dynamo.utils.graph_break_reasons``). No log text is parsed. With
``TORCHNEURON_COMPILE_LOG=1`` every compile, graph break and recompile is also
logged as it happens, through ``logging.getLogger("torchneuron")``.

Nothing here imports Dynamo until a report is asked for or a compile starts.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CompileReport", "GraphBreak", "Recompile", "install", "report", "reset"]

log = logging.getLogger("torchneuron")

ENV_LOG = "TORCHNEURON_COMPILE_LOG"
_RESUME = re.compile(r"^torch_dynamo_resume_in_(?P<fn>.+)_at_(?P<line>\d+)$")
_METRICS_LIMIT = 100_000

_lock = threading.Lock()
_installed = False
_breaks_logged = 0  # how many of Dynamo's graph-break reasons the live log has told


@dataclass
class GraphBreak:
    """One kind of graph break: why, how often, and where in the user's code."""

    reason: str
    count: int
    locations: list[str] = field(default_factory=list)
    explanation: str = ""

    def __str__(self) -> str:
        where = f" at {', '.join(self.locations)}" if self.locations else ""
        why = f"\n      {self.explanation}" if self.explanation else ""
        return f"{self.count}x {self.reason}{where}{why}"


@dataclass
class Recompile:
    """A frame compiled again because a guard of an earlier compile failed."""

    frame: str
    location: str
    compile_id: str
    reason: str

    def __str__(self) -> str:
        return f"{self.frame} ({self.location}) [{self.compile_id}]: {self.reason}"


@dataclass
class CompileReport:
    """Summary of what torch.compile did since the program started or :func:`reset`.

    Attributes:
        graphs: graphs compiled (Dynamo's ``unique_graphs``).
        frames: frame compilations (first compiles, resumes after graph breaks and recompiles).
        graph_breaks: graph breaks grouped by reason, with source locations.
        recompiles: recompilations with the guard that failed.
        failures: compilations that raised, as "frame (file:line): error".
        compile_seconds: wall time spent compiling frames.
    """

    graphs: int = 0
    frames: int = 0
    graph_breaks: list[GraphBreak] = field(default_factory=list)
    recompiles: list[Recompile] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    compile_seconds: float = 0.0

    @property
    def num_graph_breaks(self) -> int:
        """Total number of graph breaks."""
        return sum(b.count for b in self.graph_breaks)

    @property
    def num_recompiles(self) -> int:
        """Total number of recompilations."""
        return len(self.recompiles)

    def __str__(self) -> str:
        lines = [f"torch.compile: {self.graphs} graph(s), {self.num_graph_breaks} graph break(s), "
                 f"{self.num_recompiles} recompile(s), {self.frames} frame compile(s) in "
                 f"{self.compile_seconds:.1f} s"]
        if self.graph_breaks:
            lines.append("graph breaks:")
            lines += [f"  {b}" for b in self.graph_breaks]
        if self.recompiles:
            lines.append("recompiles:")
            lines += [f"  {r}" for r in self.recompiles]
        if self.failures:
            lines.append("failed compiles:")
            lines += [f"  {f}" for f in self.failures]
        return "\n".join(lines)


def _first_line(text: str) -> str:
    """The headline of a Dynamo message, skipping its "Encountered graph break when ..." preamble."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].startswith("Encountered graph break"):
        lines = lines[1:]
    return lines[0] if lines else "unknown reason"


def _explanation(text: str) -> str:
    for line in (text or "").splitlines():
        if line.strip().startswith("Explanation:"):
            return line.strip()[len("Explanation:"):].strip()
    return ""


def _frame(m: Any) -> tuple[str, str]:
    """Name and location of the frame a compilation metrics record is about."""
    if (m.co_filename or "").replace("\\", "/").endswith("torch/_dynamo/external_utils.py"):
        # torch.compile(module) compiles Dynamo's wrapper around module.__call__.
        return "a compiled nn.Module", "its forward"
    return m.co_name or "?", _location(m.co_filename, m.co_firstlineno)


def _location(filename: str | None, lineno: int | None) -> str:
    if not filename:
        return "?"
    try:
        relative = os.path.relpath(filename)
        if not relative.startswith(".."):
            filename = relative
    except ValueError:
        pass
    return f"{filename}:{lineno}"


def _live() -> bool:
    return os.environ.get(ENV_LOG, "0") not in ("", "0", "false", "False")


def _listen(logger: logging.Logger, handler: logging.Handler, level: int) -> None:
    """Add handler to one of PyTorch's loggers, enabling it at level without making PyTorch print more."""
    if handler not in logger.handlers:
        logger.addHandler(handler)
    if logger.getEffectiveLevel() > level:
        logger.setLevel(level)
        logger.propagate = False  # PyTorch prints these only when TORCH_LOGS asks for them


def _attach_handlers() -> None:
    if _live():
        _listen(logging.getLogger("torch._utils_internal"), _metrics_handler, logging.INFO)


class _MetricsHandler(logging.Handler):
    """Receives each frame's compilation metrics as Dynamo records them, and logs the event."""

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        metrics = args[0] if len(args) == 1 else None
        if type(metrics).__name__ == "CompilationMetrics":
            try:
                _log_compile(metrics)
            except Exception:  # noqa: BLE001 - a log handler must not raise
                pass
        elif record.levelno >= logging.WARNING:
            logging.getLogger("torch").handle(record)  # what PyTorch would have shown anyway


_metrics_handler = _MetricsHandler(level=logging.INFO)


def _on_compile_end(args: Any) -> None:
    _attach_handlers()  # torch._logging.set_logs() may have reset PyTorch's loggers
    if _live():
        _log_new_graph_breaks()


def _graph_break_reasons() -> list[Any]:
    from torch._dynamo.utils import graph_break_reasons

    return list(graph_break_reasons)


def _break_location(reason: Any) -> str:
    """Where in the user's code a graph break happened: the innermost frame of its user stack."""
    stack = getattr(reason, "user_stack", None) or []
    return _location(stack[-1].filename, stack[-1].lineno) if stack else "?"


def _log_new_graph_breaks() -> None:
    global _breaks_logged
    reasons = _graph_break_reasons()
    with _lock:
        start = _breaks_logged if _breaks_logged <= len(reasons) else 0  # torch._dynamo.reset() cleared them
        _breaks_logged = len(reasons)
    for r in reasons[start:]:
        explanation = _explanation(r.reason)
        log.info("torch.compile graph break at %s: %s%s", _break_location(r), _first_line(r.reason),
                 f" ({explanation})" if explanation else "")


def _log_compile(m: Any) -> None:
    if m.is_forward is False or m.compile_id is None:
        return
    name, where = _frame(m)
    if m.fail_type:
        log.info("torch.compile [%s] %s (%s) failed: %s", m.compile_id, name, where, _first_line(m.fail_reason or ""))
    elif m.recompile_reason:
        log.info("torch.compile [%s] recompiled %s (%s): %s", m.compile_id, name, where, m.recompile_reason.strip())
    else:
        log.info("torch.compile [%s] compiled %s (%s): %s ops", m.compile_id, name, where, m.graph_op_count)


def install() -> None:
    """Start recording graph breaks with their source lines (and log events live under TORCHNEURON_COMPILE_LOG=1).

    Called by the neuron registration and backend; call it yourself before the
    first compile to get source lines for graph breaks of every backend.
    Imports Dynamo.
    """
    global _installed
    if _installed:
        return
    with _lock:
        if _installed:
            return
        _installed = True
    from torch._dynamo import callback
    from torch._dynamo.utils import set_compilation_metrics_limit

    set_compilation_metrics_limit(_METRICS_LIMIT)
    if _live():
        _enable_live_logging()
    _attach_handlers()
    callback.on_compile_end(_on_compile_end)


def _enable_live_logging() -> None:
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[torchneuron] %(message)s"))
        log.addHandler(handler)


def report(log_it: bool = False) -> CompileReport:
    """Return how many graphs, graph breaks and recompiles the program had, with reasons and source lines.

    Counts everything since the start of the program or the last :func:`reset`
    (and ``torch._dynamo.reset()``), on any device and with any backend.

    Args:
        log_it: also log the report at INFO level through ``logging.getLogger("torchneuron")``.

    Example::

        >>> model = torch.compile(model)
        >>> ...
        >>> print(torchneuron.compile.report())
        torch.compile: 2 graph(s), 1 graph break(s), 1 recompile(s), 3 frame compile(s) in 4.2 s
        graph breaks:
          1x Failed to trace builtin operator at train.py:42
        recompiles:
          forward (model.py:17) [0/1]: 0/0: tensor 'x' size mismatch at index 0. expected 8, actual 4
    """
    from torch._dynamo.utils import counters, get_compilation_metrics

    install()
    metrics = [m for m in get_compilation_metrics() if m.is_forward is not False and m.compile_id]
    result = CompileReport(graphs=int(counters["stats"].get("unique_graphs", 0)), frames=len(metrics))

    resume_lines: dict[str, list[str]] = {}
    for m in metrics:
        if m.start_time_us and m.end_time_us:
            result.compile_seconds += (m.end_time_us - m.start_time_us) / 1e6
        name, where = _frame(m)
        resumed = _RESUME.match(m.co_name or "")
        if resumed and not m.recompile_reason:
            resume_lines.setdefault(resumed.group("fn"), []).append(
                _location(m.co_filename, int(resumed.group("line"))))
        if m.fail_type:
            result.failures.append(f"{name} ({where}) [{m.compile_id}]: {m.fail_type}: "
                                   f"{_first_line(m.fail_reason or '')}")
        if m.recompile_reason:
            result.recompiles.append(Recompile(name, where, m.compile_id, m.recompile_reason.strip()))

    seen: dict[str, list[str]] = {}
    for r in _graph_break_reasons():
        seen.setdefault(_first_line(r.reason), []).append(_break_location(r))
    for full_reason, count in counters["graph_break"].items():
        reason = _first_line(full_reason)
        locations = list(dict.fromkeys(seen.pop(reason, [])))
        result.graph_breaks.append(GraphBreak(reason, int(count), locations, _explanation(full_reason)))
    if not any(b.locations for b in result.graph_breaks) and resume_lines:
        # Dynamo names the code after a graph break "torch_dynamo_resume_in_<fn>_at_<line>".
        located = [loc for locs in resume_lines.values() for loc in locs]
        if len(result.graph_breaks) == 1:
            result.graph_breaks[0].locations = list(dict.fromkeys(located))
        elif not result.graph_breaks:
            result.graph_breaks.append(GraphBreak("unknown reason", len(located), list(dict.fromkeys(located))))
    if log_it:
        log.info("%s", result)
    return result


def reset() -> None:
    """Forget what :func:`report` counts so far (clears Dynamo's counters, compilation metrics and graph-break reasons)."""
    global _breaks_logged
    from torch._dynamo.utils import clear_compilation_metrics, counters, graph_break_reasons

    counters.clear()
    clear_compilation_metrics()
    graph_break_reasons.clear()
    with _lock:
        _breaks_logged = 0
