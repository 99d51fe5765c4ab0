"""``torchneuron doctor``: run a program on neuron and report what it does there.

The program runs in this process with the CUDA compatibility layer on, watched by
two modes (neither patches PyTorch):

- a ``TorchDispatchMode`` that counts and times every op (host time: the emulated
  NeuronCore runs an op before returning) and catches the ops that make the host
  wait for the device: scalar reads (``.item()``, ``float()``, ``bool()``, ``if
  tensor:``), copies to the host (``.cpu()``, ``.tolist()``, ``.numpy()``) and ops
  whose output size depends on the data (``nonzero``, boolean masks, ``unique``);
- a ``TorchFunctionMode`` that catches printing and formatting of device tensors,
  which PyTorch does with dispatch modes off.

Each sync is charged to the first frame of the user's own code on the Python stack.
The report adds the bytes copied each way (``torch.neuron.transfer_stats()``), peak
device memory, ``torch.compile`` graph breaks and recompilations, and the CUDA
APIs the compatibility layer translated, each with its source line.

``--sanitize`` runs the program under the stream sanitizer instead
(:func:`sanitize`) and lists the synchronization bugs it found: races between
streams, host reads of ``non_blocking`` copies before synchronization, frees
without ``record_stream`` and the like, each with the source lines involved.

Example::

    $ torchneuron doctor --json report.json train.py --epochs 1
    $ torchneuron doctor --sanitize train.py --epochs 1
    $ torchneuron doctor --trace trace.json train.py --epochs 1

``--trace FILE`` also runs the program under ``torch.profiler`` with the neuron
device's activity, writes the Chrome trace to FILE and lists the ops by the
device time of the work they launched.
"""

from __future__ import annotations

import contextlib
import json
import linecache
import logging
import os
import sys
import sysconfig
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from .._units import format_bytes
from . import cuda_compat
from .runner import run_script

__all__ = ["diagnose", "format_report", "format_sanitizer_report", "main", "sanitize"]

_aten = torch.ops.aten
_SCALAR = "scalar read (.item(), float(), int(), bool(), if tensor:)"
_TO_HOST = "copy to host (.cpu(), .to('cpu'), .tolist(), .numpy())"
_DATA_DEPENDENT = "data-dependent shape (nonzero, boolean mask, unique, ...)"
_PRINT = "printing/formatting a device tensor"

# Ops whose output size depends on the values of their input: the host must wait for them.
_DATA_DEPENDENT_OPS = {
    getattr(getattr(_aten, name), "default" if overload is None else overload)
    for name, overload in [("nonzero", None), ("masked_select", None), ("_unique", None), ("_unique2", None),
                           ("unique_dim", None), ("unique_consecutive", None), ("repeat_interleave", "Tensor"),
                           ("bincount", None), ("argwhere", None), ("nonzero_numpy", None)]
    if hasattr(_aten, name)
}


@dataclass(frozen=True)
class _Site:
    file: str
    line: int
    function: str


class _UserCode:
    """Finds the innermost frame of the user's own code: under the script's directory, not a library."""

    def __init__(self, script: str):
        self.root = os.path.dirname(os.path.abspath(script)) + os.sep
        libs = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib")}
        libs |= {os.path.dirname(os.path.dirname(torch.__file__)) + os.sep,
                 os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep}
        self.libs = tuple(sorted(p if p.endswith(os.sep) else p + os.sep for p in libs))
        self.script = os.path.abspath(script)
        self._cache: dict[str, bool] = {}

    def is_user(self, filename: str) -> bool:
        mine = self._cache.get(filename)
        if mine is None:
            path = os.path.abspath(filename)
            mine = path == self.script or (path.startswith(self.root) and not path.startswith(self.libs))
            self._cache[filename] = mine
        return mine

    def site(self, skip: int = 2) -> Optional[_Site]:
        frame = sys._getframe(skip)
        fallback = None
        while frame is not None:
            filename = frame.f_code.co_filename
            if self.is_user(filename):
                return _Site(filename, frame.f_lineno, frame.f_code.co_name)
            if fallback is None and not filename.startswith(self.libs) and not filename.startswith("<"):
                fallback = _Site(filename, frame.f_lineno, frame.f_code.co_name)
            frame = frame.f_back
        return fallback


class _Recorder:
    """What the modes and the compatibility layer saw."""

    def __init__(self, user: _UserCode):
        self.user = user
        self.ops: dict[Any, list[int]] = {}           # op -> [calls on neuron, ns on neuron, host calls, host ns]
        self.syncs: Counter[tuple[str, Optional[_Site]]] = Counter()
        self.cuda_calls: Counter[tuple[str, Optional[_Site]]] = Counter()

    def sync(self, kind: str, skip: int = 3) -> None:
        self.syncs[(kind, self.user.site(skip))] += 1

    def cuda_call(self, api: str) -> None:
        self.cuda_calls[(api, self.user.site(3))] += 1


def _on_neuron(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "neuron"


_INDEXING = {_aten.index.Tensor, _aten.index_put_.default, _aten.index_put.default}
_SYNC_CANDIDATES = frozenset({_aten._local_scalar_dense.default, _aten._to_copy.default, _aten.copy_.default,
                              *_DATA_DEPENDENT_OPS, *_INDEXING})
_Tensor = torch.Tensor
_clock = time.perf_counter_ns


class _OpWatch(TorchDispatchMode):
    """Counts and times every op; notes the ones that make the host wait for the device."""

    def __init__(self, rec: _Recorder):
        super().__init__()
        self.rec = rec
        self.ops = rec.ops

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True  # compiled graphs are compiled as usual, then watched as they run

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        start = _clock()
        out = func(*args, **kwargs) if kwargs else func(*args)
        elapsed = _clock() - start
        stat = self.ops.get(func)
        if stat is None:
            stat = self.ops[func] = [0, 0, 0, 0]
        t = args[0] if args and isinstance(args[0], _Tensor) else out
        if not isinstance(t, _Tensor):
            t = t[0] if isinstance(t, (tuple, list)) and t and isinstance(t[0], _Tensor) else None
        if t is not None and not t.is_cpu:
            stat[0] += 1
            stat[1] += elapsed
        else:
            stat[2] += 1
            stat[3] += elapsed
        if func in _SYNC_CANDIDATES:
            kind = _sync_kind(func, args, kwargs or {})
            if kind is not None:
                self.rec.sync(kind)
        return out


def _sync_kind(func, args, kwargs) -> Optional[str]:
    """What kind of host-device sync the op is, or None."""
    if not args:
        return None
    if func is _aten.copy_.default:
        return _TO_HOST if len(args) > 1 and args[0].is_cpu and _on_neuron(args[1]) else None
    if not _on_neuron(args[0]):
        return None
    if func is _aten._local_scalar_dense.default:
        return _SCALAR
    if func is _aten._to_copy.default:
        device = kwargs.get("device")
        return _TO_HOST if device is not None and _device_type(device) == "cpu" else None
    if func in _INDEXING:
        indices = args[1] if len(args) > 1 else ()
        if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices):
            return _DATA_DEPENDENT
        return None
    return _DATA_DEPENDENT


def _device_type(device: Any) -> Optional[str]:
    if device is None:
        return None
    if isinstance(device, torch.device):
        return device.type
    return torch.device(device).type


_PRINTING = frozenset({torch.Tensor.__repr__, torch.Tensor.__str__, torch.Tensor.__format__})


class _PrintWatch(TorchFunctionMode):
    """Notes printing and formatting of device tensors (done with dispatch modes off)."""

    def __init__(self, rec: _Recorder):
        super().__init__()
        self.rec = rec

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _PRINTING and args and _on_neuron(args[0]) and args[0].numel() > 1:
            self.rec.sync(_PRINT)  # one-element tensors are read by .item(), which the op watch sees
        return func(*args, **kwargs) if kwargs else func(*args)


class _RecompileLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _site_dict(site: Optional[_Site]) -> dict[str, Any]:
    if site is None:
        return {"file": None, "line": None, "function": None, "code": None}
    return {"file": site.file, "line": site.line, "function": site.function,
            "code": linecache.getline(site.file, site.line).strip() or None}


def diagnose(script: str, argv: Sequence[str] = (), trace: Optional[str] = None) -> dict[str, Any]:
    """Run ``script argv...`` on neuron with the CUDA compatibility layer and return the report.

    Args:
        script: the program.
        argv: its arguments.
        trace: also run it under ``torch.profiler`` (host ops and the device's activity) and write
            the Chrome trace there; the report then lists the ops by device time (``device_ops``).

    Returns:
        A JSON-ready dict: ``script``, ``argv``, ``exit_code``, ``error``,
        ``wall_time_s``, ``ops``, ``syncs``, ``transfers``, ``peak_memory_bytes``,
        ``compile`` and ``cuda_calls``; see ``docs/migration.md``.
    """
    import torch._dynamo.utils
    from torch._logging._internal import log_state

    user = _UserCode(script)
    rec = _Recorder(user)
    was_enabled = cuda_compat.is_enabled()
    if not was_enabled:
        cuda_compat.enable("neuron")
    previous_recorder = cuda_compat.set_recorder(rec.cuda_call)

    # Dynamo's counters are left as they are (torchneuron.compile.report() and the program read
    # them); the report takes what the program added.
    counters = torch._dynamo.utils.counters
    counters_before = {key: Counter(values) for key, values in counters.items()}
    recompile_log = _RecompileLog()
    recompile_loggers = [logging.getLogger(n) for n in ("torch._dynamo.guards.__recompiles",
                                                         "torch._dynamo.guards.__recompiles_verbose")]
    recompiles_was_on = log_state.is_artifact_enabled("recompiles")
    log_state.enable_artifact("recompiles")  # Dynamo then logs each recompilation's reason
    saved_logger_state = []
    for lg in recompile_loggers:
        saved_logger_state.append((lg, lg.propagate, lg.level))
        lg.addHandler(recompile_log)
        lg.propagate = False
        lg.setLevel(logging.DEBUG)

    devices = range(torch.neuron.device_count())
    for i in devices:
        torch.neuron.synchronize(i)
        torch.neuron.reset_peak_memory_stats(i)
    transfers_before = torch.neuron.transfer_stats()
    profiler = _trace_profiler() if trace else None
    try:
        # The devices are synchronized inside the profile, so that it holds all the program's work.
        with _PrintWatch(rec), _OpWatch(rec), profiler or contextlib.nullcontext():
            result = run_script(script, argv)
            for i in devices:
                torch.neuron.synchronize(i)
    finally:
        cuda_compat.set_recorder(previous_recorder)
        if not was_enabled:
            cuda_compat.disable()
        for lg, propagate, level in saved_logger_state:
            lg.removeHandler(recompile_log)
            lg.propagate = propagate
            lg.setLevel(level)
        if not recompiles_was_on:
            log_state.artifact_names.discard("recompiles")
    transfers_after = torch.neuron.transfer_stats()

    ops = []
    for func, (n, ns, host_n, host_ns) in rec.ops.items():
        name = str(func._overloadpacket) if hasattr(func, "_overloadpacket") else str(func)
        ops.append({"op": name.replace("aten.", "aten::", 1), "overload": str(func),
                    "calls": n, "time_ms": ns / 1e6, "host_calls": host_n, "host_time_ms": host_ns / 1e6})
    merged: dict[str, dict[str, Any]] = {}
    for o in ops:
        m = merged.setdefault(o["op"], {"op": o["op"], "calls": 0, "time_ms": 0.0, "host_calls": 0,
                                        "host_time_ms": 0.0})
        for k in ("calls", "time_ms", "host_calls", "host_time_ms"):
            m[k] += o[k]
    op_list = sorted(merged.values(), key=lambda o: (-o["time_ms"], -o["calls"], o["op"]))

    syncs = [{"kind": kind, "count": count, **_site_dict(site)} for (kind, site), count in rec.syncs.items()]
    syncs.sort(key=lambda s: (-s["count"], s["file"] or "", s["line"] or 0))
    cuda_calls = [{"api": api, "count": count, **_site_dict(site)} for (api, site), count in rec.cuda_calls.items()]
    cuda_calls.sort(key=lambda c: (c["file"] or "", c["line"] or 0, c["api"]))

    def added(key: str) -> Counter[str]:
        return Counter(counters.get(key, {})) - counters_before.get(key, Counter())

    graph_breaks: Counter[str] = Counter()
    for key in ("graph_break", "unimplemented"):  # Dynamo files its graph breaks under both
        graph_breaks.update(added(key))
    stats = dict(added("stats"))
    frames = dict(added("frames"))
    compiled = bool(frames) or bool(stats)
    report = {
        "script": os.path.abspath(script),
        "argv": list(argv),
        "exit_code": result.exit_code,
        "error": result.error,
        "wall_time_s": result.wall_time_s,
        "ops": op_list,
        "syncs": syncs,
        "transfers": {k: transfers_after[k] - transfers_before.get(k, 0) for k in transfers_after},
        "peak_memory_bytes": {f"neuron:{i}": torch.neuron.max_memory_allocated(i) for i in devices},
        "compile": {
            "used": compiled,
            "graphs": stats.get("unique_graphs", 0),
            "frames_compiled": frames.get("ok", 0),
            "graph_breaks": sum(graph_breaks.values()),
            "graph_break_reasons": dict(graph_breaks),
            "recompiles": len(recompile_log.messages),
            "recompile_reasons": recompile_log.messages,
        },
        "cuda_calls": cuda_calls,
    }
    if profiler is not None:
        profiler.export_chrome_trace(trace)
        report["trace"] = os.path.abspath(trace)
        report["device_ops"] = _device_ops(profiler)
    return report


def _trace_profiler() -> torch.profiler.profile:
    """The profiler ``--trace`` runs the program under: host ops and the neuron device's activity."""
    from torch.profiler import ProfilerActivity

    return torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1])


def _device_ops(profiler: torch.profiler.profile) -> list[dict[str, Any]]:
    """The ops that ran work on the device, by the device time of that work (most first)."""
    ops = []
    for e in profiler.key_averages():
        if e.self_device_time_total <= 0 or e.device_type == torch.autograd.DeviceType.PrivateUse1:
            continue  # the kernels' own rows; their ops carry their time
        ops.append({"op": e.key, "calls": e.count, "device_time_ms": e.self_device_time_total / 1e3,
                    "host_time_ms": e.cpu_time_total / 1e3})
    ops.sort(key=lambda o: (-o["device_time_ms"], o["op"]))
    return ops


def _bytes(n: float) -> str:
    return format_bytes(n, digits=1)


def _where(d: dict[str, Any], base: str) -> str:
    if d["file"] is None:
        return "(unknown)"
    path = os.path.relpath(d["file"], base) if d["file"].startswith(base) else d["file"]
    return f"{path}:{d['line']}"


def format_report(report: dict[str, Any], top: int = 15) -> str:
    """The report as text for a terminal."""
    base = os.path.dirname(report["script"]) + os.sep
    lines = []
    status = "ok" if report["exit_code"] == 0 else f"exit code {report['exit_code']}"
    lines.append(f"torchneuron doctor: {os.path.basename(report['script'])} ({status}, "
                 f"{report['wall_time_s']:.2f} s)")
    if report["error"]:
        lines.append("  the program failed:")
        lines += ["    " + line for line in report["error"].rstrip().splitlines()[-6:]]

    device_ops = [o for o in report["ops"] if o["calls"]]
    total_calls = sum(o["calls"] for o in device_ops)
    total_ms = sum(o["time_ms"] for o in device_ops)
    lines.append("")
    lines.append(f"Ops on neuron: {total_calls:,} calls of {len(device_ops)} ops, {total_ms:.1f} ms")
    if device_ops:
        lines.append(f"  {'op':<40} {'calls':>8} {'time ms':>10} {'share':>7}")
        for o in device_ops[:top]:
            share = 100 * o["time_ms"] / total_ms if total_ms else 0.0
            lines.append(f"  {o['op']:<40} {o['calls']:>8,} {o['time_ms']:>10.2f} {share:>6.1f}%")
        if len(device_ops) > top:
            lines.append(f"  ... {len(device_ops) - top} more in the JSON report")

    if "device_ops" in report:
        device_time = sum(o["device_time_ms"] for o in report["device_ops"])
        lines.append("")
        lines.append(f"Device time by op (torch.profiler): {device_time:.1f} ms; trace: {report['trace']}")
        lines.append(f"  {'op':<40} {'calls':>8} {'device ms':>10} {'share':>7}")
        for o in report["device_ops"][:top]:
            share = 100 * o["device_time_ms"] / device_time if device_time else 0.0
            lines.append(f"  {o['op']:<40} {o['calls']:>8,} {o['device_time_ms']:>10.2f} {share:>6.1f}%")

    syncs = report["syncs"]
    lines.append("")
    n_syncs = sum(s["count"] for s in syncs)
    lines.append(f"Host-device syncs: {n_syncs} (the host waits for the device each time)")
    for s in syncs[:top]:
        lines.append(f"  {_where(s, base):<28} {s['count']:>6}x  {s['kind']}")
        if s["code"]:
            lines.append(f"  {'':<28}          {s['code']}")
    if len(syncs) > top:
        lines.append(f"  ... {len(syncs) - top} more sites in the JSON report")

    t = report["transfers"]
    lines.append("")
    lines.append(f"Copies: host->device {_bytes(t.get('host_to_device_bytes', 0))} in "
                 f"{t.get('host_to_device_copies', 0)} copies, device->host "
                 f"{_bytes(t.get('device_to_host_bytes', 0))} in {t.get('device_to_host_copies', 0)} copies, "
                 f"device->device {_bytes(t.get('device_to_device_bytes', 0))}; "
                 f"{t.get('scalar_reads', 0)} scalar reads")
    peaks = ", ".join(f"{d} {_bytes(b)}" for d, b in report["peak_memory_bytes"].items() if b) or "none"
    lines.append(f"Peak device memory: {peaks}")

    c = report["compile"]
    lines.append("")
    if c["used"]:
        lines.append(f"torch.compile: {c['graphs']} graph(s), {c['graph_breaks']} graph break(s), "
                     f"{c['recompiles']} recompilation(s)")
        for reason, count in sorted(c["graph_break_reasons"].items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"  {count:>4}x break: {reason.splitlines()[0][:110]}")
        for reason in c["recompile_reasons"][:top]:
            lines.append("  recompiled: " + " | ".join(r.strip() for r in reason.splitlines()[:3])[:130])
    else:
        lines.append("torch.compile: not used")

    calls = report["cuda_calls"]
    lines.append("")
    if calls:
        lines.append(f"CUDA-specific calls translated by the compatibility layer: {len(calls)} sites "
                     "(`torchneuron migrate` rewrites most of them)")
        for cc in calls[:top * 2]:
            lines.append(f"  {_where(cc, base):<28} {cc['count']:>6}x  {cc['api']}")
    else:
        lines.append("CUDA-specific calls: none")
    return "\n".join(lines) + "\n"


def split_tool_args(args: Sequence[str], options: dict[str, bool]) -> tuple[list[str], dict[str, Any]]:
    """Take the tool's own options out of the words after the script.

    ``torchneuron doctor train.py --epochs 1 --json r.json`` gives ``--json`` to
    doctor; after a ``--`` every word is the program's.

    Args:
        args: the words after the script.
        options: the tool's option names, mapped to whether each takes a value.
    """
    script_args: list[str] = []
    found: dict[str, Any] = {}
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            script_args += args[i + 1:]
            break
        name, eq, value = word.partition("=")
        if name in options:
            if options[name]:
                if not eq:
                    if i + 1 >= len(args):
                        raise SystemExit(f"torchneuron: {name} needs a value")
                    value = args[i + 1]
                    i += 1
                found[name] = value
            else:
                found[name] = True
        else:
            script_args.append(word)
        i += 1
    return script_args, found


def sanitize(script: str, argv: Sequence[str] = ()) -> dict[str, Any]:
    """Run ``script argv...`` on neuron under the stream sanitizer and return what it found.

    The CUDA compatibility layer is on, as for :func:`diagnose`. The sanitizer
    (:mod:`torchneuron.neuron._sanitizer`) records every finding and lets the
    program go on; it is turned off when the program ends, before the program's
    own objects are freed (their frees at exit are no bug).

    Returns:
        A JSON-ready dict: ``script``, ``argv``, ``exit_code``, ``error``,
        ``wall_time_s`` and ``findings``, each finding with ``kind``, ``title``,
        ``count`` (identical findings are counted once), ``detail``, ``fix`` and
        ``sites`` (file, line, code and what happened there; the current access first).
    """
    import runpy
    import traceback

    from ..neuron import _sanitizer

    if _sanitizer.is_enabled():
        raise RuntimeError("torchneuron doctor --sanitize: the sanitizer is already on in this process "
                           "(TORCHNEURON_SANITIZER is set?); unset it and run again")
    path = os.path.abspath(script)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"torchneuron doctor --sanitize: no such program: {script}")
    found: list[Any] = []
    saved_argv, saved_path = sys.argv, list(sys.path)
    was_enabled = cuda_compat.is_enabled()
    error = None
    start = time.perf_counter()
    kept = None
    if not was_enabled:
        cuda_compat.enable("neuron")
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(path))
    _sanitizer.enable("record")
    try:
        try:
            kept = runpy.run_path(path, run_name="__main__")  # its globals live until the sanitizer is off
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # noqa: BLE001 - the program's failure is a result, not ours
            found = _sanitizer.disable()
            error = traceback.format_exc()
            code = 1
    finally:
        found = found or _sanitizer.disable()
        elapsed = time.perf_counter() - start
        sys.argv = saved_argv
        sys.path[:] = saved_path
        if not was_enabled:
            cuda_compat.disable()
    del kept
    groups: dict[tuple, dict[str, Any]] = {}
    for report in found:
        key = (report.kind, tuple((site.filename, site.lineno) for site in report.sites))
        if key in groups:
            groups[key]["count"] += 1
            continue
        groups[key] = {
            "kind": report.kind, "title": report.title, "count": 1, "detail": report.detail, "fix": report.fix,
            "sites": [{"file": site.filename, "line": site.lineno, "code": site.line, "what": site.what}
                      for site in report.sites],
        }
    return {"script": script, "argv": list(argv), "exit_code": code, "error": error,
            "wall_time_s": round(elapsed, 3), "findings": list(groups.values())}


def format_sanitizer_report(report: dict[str, Any]) -> str:
    """The text of a :func:`sanitize` report."""
    base = os.path.dirname(os.path.abspath(report["script"]))
    findings = report["findings"]
    lines = [f"torchneuron doctor --sanitize: {report['script']} (exit code {report['exit_code']}, "
             f"{report['wall_time_s']:.1f} s)"]
    if report["error"]:
        lines.append("The program failed:")
        lines += ["  " + line for line in report["error"].rstrip().splitlines()[-4:]]
    if not findings:
        lines.append("Stream sanitizer: no synchronization bug found.")
        return "\n".join(lines) + "\n"
    lines.append(f"Stream sanitizer: {len(findings)} synchronization bug(s) found "
                 "(a race between streams: the result depends on when each stream's work runs):")
    for i, finding in enumerate(findings, 1):
        times = f" ({finding['count']}x)" if finding["count"] > 1 else ""
        lines.append("")
        lines.append(f"{i}. {finding['title'].replace(base + os.sep, '')}{times}")
        lines.append(f"   {finding['detail']}")
        for label, site in zip(("here", "against"), finding["sites"]):
            where = os.path.relpath(site["file"], base) if site["file"].startswith(base) else site["file"]
            lines.append(f"   {label}: {where}:{site['line']}: {site['code']}")
            lines.append(f"         {site['what']}")
        lines.append(f"   fix: {finding['fix']}")
    return "\n".join(lines) + "\n"


def main(script: str, script_args: Sequence[str], json_path: Optional[str] = None, sanitize_only: bool = False,
         trace_path: Optional[str] = None) -> int:
    """``torchneuron doctor [--json FILE] [--trace FILE] [--sanitize] script.py [args...]``: print the report.

    With ``--json`` it also writes the report as JSON; with ``--trace`` the profiler's Chrome trace.

    Returns the program's exit code; with ``--sanitize``, 1 if the program
    succeeded but the sanitizer found a bug.
    """
    args, found = split_tool_args(script_args, {"--json": True, "--sanitize": False, "--trace": True})
    json_path = found.get("--json", json_path)
    trace_path = found.get("--trace", trace_path)
    if sanitize_only or found.get("--sanitize"):
        report = sanitize(script, args)
        sys.stdout.flush()
        print("\n" + format_sanitizer_report(report), end="")
        if json_path:
            with open(json_path, "w") as f:
                json.dump(report, f, indent=1)
            print(f"\nJSON report: {json_path}")
        return report["exit_code"] or (1 if report["findings"] else 0)
    report = diagnose(script, args, trace=trace_path)
    sys.stdout.flush()
    print("\n" + format_report(report), end="")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1)
        print(f"\nJSON report: {json_path}")
    return report["exit_code"]
