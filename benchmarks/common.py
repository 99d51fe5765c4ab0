"""Benchmark harness: times the same case on two devices in one process and reports the ratio."""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"

DEFAULT_DEVICES = ("cpu", "neuron")
DEFAULT_WARMUP = 2
DEFAULT_ROUND_MS = 20.0
QUICK_ROUNDS = 5
QUICK_WARMUP = 1
QUICK_ROUND_MS = 5.0
INSTALL_HINT = ("The neuron device comes from `import torchneuron`; install and build it from the repository "
                "root with `pip install -e .`, or check the harness alone with --devices cpu,cpu.")

Fn = Callable[[], Any]
Sync = Callable[[], None]


@dataclass
class Case:
    """One row of a suite.

    Args:
        name: row label.
        setup: given a torch.device, builds its inputs and returns the zero-argument callable to time.
        target: largest accepted ratio of the second device's time to the first's (see Result.ratio).
        inner: calls per timed round; None picks it so that a round lasts about round_ms.
        skip: reason the case cannot run here; it is then listed but not timed.
    """

    name: str
    setup: Callable[[torch.device], Fn]
    target: float
    inner: int | None = None
    skip: str | None = None


@dataclass
class Result:
    """Timings of one case.

    Args:
        case: the case that was timed.
        labels: one label per device variant, e.g. ("cpu", "neuron").
        inner: calls per round that were used.
        samples: per device variant, the per-call time in ns of each timed round.
    """

    case: Case
    labels: tuple[str, ...]
    inner: int = 0
    samples: list[list[float]] = field(default_factory=list)

    @property
    def skipped(self) -> bool:
        """True when the case was not timed."""
        return bool(self.case.skip)

    @property
    def medians(self) -> list[float]:
        """Median per-call time in ns of each device variant."""
        return [statistics.median(s) for s in self.samples]

    @property
    def ratio(self) -> float | None:
        """Median over rounds of the second device's time divided by the first's in the same round."""
        if self.skipped:
            return None
        return statistics.median(b / a if a > 0 else float("inf") for a, b in zip(*self.samples))

    @property
    def ratio_of_medians(self) -> float | None:
        """Second device's median divided by the first device's median."""
        if self.skipped:
            return None
        base, other = self.medians
        return other / base if base > 0 else float("inf")

    @property
    def ok(self) -> bool | None:
        """Whether the ratio is within the case's target (None when skipped)."""
        ratio = self.ratio
        return None if ratio is None else ratio <= self.case.target

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-serialisable summary including every round's timing."""
        row: dict[str, Any] = {
            "case": self.case.name,
            "target": self.case.target,
            "skipped": self.case.skip,
        }
        if self.skipped:
            return row
        per_device = []
        for label, samples in zip(self.labels, self.samples):
            q1, _, q3 = statistics.quantiles(samples, n=4) if len(samples) > 1 else (samples[0],) * 3
            per_device.append({
                "label": label,
                "median_ns": statistics.median(samples),
                "min_ns": min(samples),
                "q1_ns": q1,
                "q3_ns": q3,
                "rounds_ns": samples,
            })
        row.update({
            "inner": self.inner,
            "devices": per_device,
            "ratio": self.ratio,
            "ratio_of_medians": self.ratio_of_medians,
            "ok": self.ok,
        })
        return row


@dataclass(frozen=True)
class Suite:
    """A named set of cases with its default settings.

    Args:
        name: short name, also the default JSON file name.
        description: one line shown in --help and above the table.
        build_cases: given the parsed options, returns the cases.
        default_threads: value of torch.set_num_threads when --threads is not given.
        default_rounds: timed rounds per device when neither --rounds nor --quick is given.
        add_arguments: adds suite-specific options to a parser.
    """

    name: str
    description: str
    build_cases: Callable[[argparse.Namespace], list[Case]]
    default_threads: int
    default_rounds: int
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None


@dataclass
class SuiteReport:
    """Outcome of running one suite.

    Args:
        suite: the suite that ran.
        results: one result per case.
        table: the printed table.
        json_path: where the JSON was written, if anywhere.
    """

    suite: Suite
    results: list[Result]
    table: str
    json_path: Path | None

    @property
    def failures(self) -> list[Result]:
        """Results whose ratio exceeds the target."""
        return [r for r in self.results if r.ok is False]


def demo_gpt_step(device: str = "neuron") -> Fn:
    """The demo's GPT training step (4 layers, 128 wide, 16x64 tokens, AdamW), synchronized at its end."""
    import torch.nn.functional as F

    from torchneuron.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.0)
    model = GPT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    x = torch.randint(0, 65, (16, 64), device=device)
    sync = synchronizer(device)

    def step() -> None:
        out = model(x)
        logits = out[0] if isinstance(out, tuple) else out
        F.cross_entropy(logits.flatten(0, 1), x.flatten()).backward()
        opt.step()
        opt.zero_grad()
        if sync is not None:
            sync()

    return step


def synchronizer(device: str | torch.device) -> Sync | None:
    """Return the function that waits for queued work on a device, or None for the CPU.

    Args:
        device: device to synchronise.
    """
    kind = torch.device(device).type
    if kind == "cpu":
        return None
    sync = getattr(getattr(torch, kind, None), "synchronize", None)
    if callable(sync):
        return sync
    return torch.accelerator.synchronize


def time_round(fn: Fn, inner: int, sync: Sync | None = None) -> float:
    """Call fn inner times, synchronise, and return the mean time per call in ns.

    Args:
        fn: zero-argument callable.
        inner: number of calls.
        sync: called once after the calls and before the clock stops.
    """
    start = time.perf_counter_ns()
    for _ in range(inner):
        fn()
    if sync is not None:
        sync()
    return (time.perf_counter_ns() - start) / inner


def measure(fn: Fn, *, warmup: int, rounds: int, inner: int, sync: Sync | None = None) -> list[float]:
    """Time fn on its own and return the per-call time in ns of each round.

    Args:
        fn: zero-argument callable.
        warmup: untimed rounds run first.
        rounds: timed rounds.
        inner: calls per round.
        sync: called at the end of every round, inside the timed region.
    """
    for _ in range(warmup):
        time_round(fn, inner, sync)
    return [time_round(fn, inner, sync) for _ in range(rounds)]


def calibrate(fn: Fn, sync: Sync | None, round_ns: float, max_inner: int = 1_000_000) -> int:
    """Return how many calls of fn make one round last about round_ns.

    Args:
        fn: zero-argument callable, already warmed up.
        sync: synchroniser for fn's device.
        round_ns: wanted duration of one round in ns.
        max_inner: upper bound on the result.
    """
    n = 1
    while True:
        per_call = max(time_round(fn, n, sync), 1.0)
        if per_call * n >= round_ns / 4 or n >= max_inner:
            break
        n *= 4
    return max(1, min(max_inner, round(round_ns / per_call)))


def device_labels(devices: Sequence[str]) -> tuple[str, ...]:
    """Return distinct labels for device variants, numbering repeats ("cpu", "cpu#2").

    Args:
        devices: device strings in comparison order.
    """
    seen: dict[str, int] = {}
    labels = []
    for device in devices:
        seen[device] = seen.get(device, 0) + 1
        labels.append(device if seen[device] == 1 else f"{device}#{seen[device]}")
    return tuple(labels)


def compare(
    cases: Sequence[Case],
    devices: Sequence[str] = DEFAULT_DEVICES,
    rounds: int = 20,
    *,
    warmup: int = DEFAULT_WARMUP,
    round_ms: float = DEFAULT_ROUND_MS,
    log: Callable[[str], None] | None = None,
) -> list[Result]:
    """Time every case on each device, interleaving the devices round by round.

    Args:
        cases: cases to run.
        devices: exactly two device strings; the ratio is second / first.
        rounds: timed rounds per device.
        warmup: untimed interleaved rounds per device before the timed ones.
        round_ms: wanted duration of one round, used when a case does not fix inner.
        log: receives one progress line per case.
    """
    if len(devices) != 2:
        raise ValueError(f"compare needs exactly two devices, got {list(devices)}")
    labels = device_labels(devices)
    results = []
    for case in cases:
        if case.skip:
            results.append(Result(case, labels))
            if log:
                log(f"  {case.name}: skipped ({case.skip})")
            continue
        started = time.perf_counter()
        result = _compare_case(case, devices, labels, rounds, warmup, round_ms)
        results.append(result)
        if log:
            medians = "  ".join(f"{lb} {format_ns(m)}" for lb, m in zip(labels, result.medians))
            log(f"  {case.name}: {medians}  ratio {result.ratio:.3f}  "
                f"(inner {result.inner}, {time.perf_counter() - started:.1f}s)")
    return results


def _compare_case(case: Case, devices: Sequence[str], labels: tuple[str, ...],
                  rounds: int, warmup: int, round_ms: float) -> Result:
    """Run one case interleaved across devices and return its result."""
    fns = [case.setup(torch.device(d)) for d in devices]
    syncs = [synchronizer(d) for d in devices]
    for fn, sync in zip(fns, syncs):
        time_round(fn, 1, sync)
    inner = case.inner or calibrate(fns[0], syncs[0], round_ms * 1e6)
    samples: list[list[float]] = [[] for _ in devices]
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for r in range(warmup + rounds):
            for i, (fn, sync) in enumerate(zip(fns, syncs)):
                per_call = time_round(fn, inner, sync)
                if r >= warmup:
                    samples[i].append(per_call)
    finally:
        if gc_was_enabled:
            gc.enable()
    return Result(case, labels, inner, samples)


def format_ns(ns: float) -> str:
    """Format a duration in ns with a readable unit.

    Args:
        ns: duration in nanoseconds.
    """
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.2f} {unit}"
    return f"{ns:.0f} ns"


def format_table(results: Sequence[Result], labels: Sequence[str], title: str = "") -> str:
    """Render results as an aligned plain-text table.

    Args:
        results: results from compare.
        labels: the two device labels, baseline first.
        title: line printed above the table.
    """
    header = ["case", f"{labels[0]} median", f"{labels[1]} median", "ratio", "target", "ok"]
    rows = []
    notes = []
    for r in results:
        target = f"<= {r.case.target:.2f}"
        if r.skipped:
            rows.append([r.case.name, "-", "-", "-", target, "skip"])
            notes.append(f"{r.case.name}: skipped, {r.case.skip}")
            continue
        rows.append([r.case.name, format_ns(r.medians[0]), format_ns(r.medians[1]),
                     f"{r.ratio:.3f}", target, "yes" if r.ok else "NO"])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:]))
        return "  ".join([first, *rest]).rstrip()

    timed = [r for r in results if not r.skipped]
    passed = sum(1 for r in timed if r.ok)
    out = [title] if title else []
    out += [line(header), line(["-" * w for w in widths]), *(line(row) for row in rows)]
    out.append(f"ratio = median over rounds of {labels[1]} / {labels[0]} time per call in the same round; "
               f"{passed} of {len(timed)} cases within target.")
    out += notes
    return "\n".join(out)


def write_json(path: Path, suite: Suite, results: Sequence[Result], settings: dict[str, Any]) -> None:
    """Write the results and the run's settings and environment as JSON.

    Args:
        path: output file; parent directories are created.
        suite: the suite that ran.
        results: results from compare.
        settings: options the run used.
    """
    payload = {
        "suite": suite.name,
        "description": suite.description,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "settings": settings,
        "environment": environment(),
        "results": [r.to_json() for r in results],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")


def environment() -> dict[str, Any]:
    """Return versions and machine facts that affect timings."""
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_num_threads": torch.get_num_threads(),
        "torch_num_interop_threads": torch.get_num_interop_threads(),
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
    }
    torchneuron = sys.modules.get("torchneuron")
    if torchneuron is not None:
        env["torchneuron"] = getattr(torchneuron, "__version__", "unknown")
    return env


def _cpu_model() -> str:
    """Return the CPU model name, or platform.processor() when it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def busy_cpus(interval: float = 0.25) -> float | None:
    """Return how many CPUs other work kept busy while this process slept, or None off Linux.

    Args:
        interval: sampling time in seconds.
    """
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
        idle = fields[3] + fields[4]
        return sum(fields) - idle, sum(fields)

    try:
        busy0, total0 = sample()
        time.sleep(interval)
        busy1, total1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    if total1 <= total0:
        return None
    return (busy1 - busy0) / (total1 - total0) * (os.cpu_count() or 1)


def require_devices(devices: Sequence[str]) -> None:
    """Exit with a message unless every device can be used, importing torchneuron for "neuron".

    Args:
        devices: device strings to check.
    """
    for device in dict.fromkeys(devices):
        if device.split(":")[0] == "cpu":
            continue
        if device.split(":")[0] == "neuron":
            _import_torchneuron()
        try:
            torch.empty(1, device=device)
        except Exception as exc:  # noqa: BLE001 - any failure means the device is unusable
            current = torch.accelerator.current_accelerator()
            sys.exit(f"error: device {device!r} is not available ({type(exc).__name__}: {exc}).\n"
                     f"Current accelerator: {current}. {INSTALL_HINT}")


def _import_torchneuron() -> None:
    """Import torchneuron, which registers the neuron device, or exit with install instructions."""
    try:
        import torchneuron  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - a broken build raises more than ImportError
        sys.exit("error: the neuron device needs the torchneuron package, which could not be imported "
                 f"({type(exc).__name__}: {exc}).\n{INSTALL_HINT}")


def make_parser(description: str, suites: Sequence[Suite], prog: str | None = None) -> argparse.ArgumentParser:
    """Return the command-line parser shared by the suites.

    Args:
        description: text for --help.
        suites: suites the command runs; their options are added and their defaults described.
        prog: program name for usage lines; None uses sys.argv[0].
    """
    threads = ", ".join(f"{s.name}: {s.default_threads}" for s in suites)
    rounds = ", ".join(f"{s.name}: {s.default_rounds}" for s in suites)
    parser = argparse.ArgumentParser(prog=prog, description=description, allow_abbrev=False)
    parser.add_argument("--devices", default=",".join(DEFAULT_DEVICES),
                        help="two comma-separated devices, baseline first (default: %(default)s); "
                             "cpu,cpu checks the harness without the neuron device")
    parser.add_argument("--threads", type=int, default=None,
                        help=f"torch.set_num_threads value (default per suite, {threads})")
    parser.add_argument("--rounds", type=int, default=None,
                        help=f"timed rounds per device (default per suite, {rounds}; {QUICK_ROUNDS} with --quick)")
    parser.add_argument("--warmup", type=int, default=None,
                        help=f"untimed rounds per device (default {DEFAULT_WARMUP}; {QUICK_WARMUP} with --quick)")
    parser.add_argument("--round-ms", type=float, default=None,
                        help=f"wanted duration of one round in ms, sets the calls per round of fast cases "
                             f"(default {DEFAULT_ROUND_MS:g}; {QUICK_ROUND_MS:g} with --quick)")
    parser.add_argument("--quick", action="store_true", help="few short rounds, for a smoke run")
    parser.add_argument("-k", dest="filter", default=None, metavar="TEXT",
                        help="only run cases whose name contains TEXT")
    if len(suites) == 1:
        parser.add_argument("--json", type=Path, default=None, metavar="PATH",
                            help=f"JSON output file (default: benchmarks/results/{suites[0].name}.json)")
    parser.add_argument("--json-dir", type=Path, default=RESULTS_DIR, metavar="DIR",
                        help="directory for <suite>.json files (default: benchmarks/results)")
    parser.add_argument("--no-json", action="store_true", help="do not write JSON")
    parser.add_argument("--strict", action="store_true",
                        help="exit with status 1 when a case misses its target")
    for suite in suites:
        if suite.add_arguments is not None:
            suite.add_arguments(parser)
    return parser


def parse_devices(text: str) -> tuple[str, str]:
    """Split a --devices value into exactly two device strings, or exit.

    Args:
        text: comma-separated devices such as "cpu,neuron".
    """
    devices = tuple(d.strip() for d in text.split(",") if d.strip())
    if len(devices) != 2:
        sys.exit(f"error: --devices needs two comma-separated devices, got {text!r}")
    return devices  # type: ignore[return-value]


def run_suite(suite: Suite, args: argparse.Namespace) -> SuiteReport:
    """Run one suite with parsed options, print its table and write its JSON.

    Args:
        suite: the suite to run.
        args: options from make_parser.
    """
    devices = parse_devices(args.devices)
    require_devices(devices)
    threads = args.threads or suite.default_threads
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else suite.default_rounds)
    warmup = args.warmup if args.warmup is not None else (QUICK_WARMUP if args.quick else DEFAULT_WARMUP)
    round_ms = args.round_ms or (QUICK_ROUND_MS if args.quick else DEFAULT_ROUND_MS)
    torch.set_num_threads(threads)

    cases = suite.build_cases(args)
    if args.filter:
        cases = [c for c in cases if args.filter in c.name]
    labels = device_labels(devices)
    title = (f"{suite.name}: {suite.description}\n"
             f"devices {labels[0]} vs {labels[1]}, threads {torch.get_num_threads()}, "
             f"rounds {rounds} (+{warmup} warmup), torch {torch.__version__}")
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    log(f"[{suite.name}] {len(cases)} cases on {labels[0]} vs {labels[1]}, threads {torch.get_num_threads()}")
    busy = busy_cpus()
    if busy is not None and busy > 0.5:
        log(f"warning: other processes keep {busy:.1f} of {os.cpu_count()} CPUs busy; timings will be noisy")
    results = compare(cases, devices, rounds, warmup=warmup, round_ms=round_ms, log=log)
    table = format_table(results, labels, title)
    print(table, flush=True)

    json_path = None
    if not args.no_json:
        json_path = getattr(args, "json", None) or args.json_dir / f"{suite.name}.json"
        settings = {
            "devices": list(devices), "labels": list(labels), "threads": torch.get_num_threads(),
            "rounds": rounds, "warmup": warmup, "round_ms": round_ms, "quick": args.quick,
            "filter": args.filter, "argv": sys.argv, "busy_cpus_before_run": busy,
        }
        settings.update({k: v for k, v in vars(args).items() if k not in settings and _plain(v)})
        write_json(json_path, suite, results, settings)
        print(f"results written to {_display_path(json_path)}", flush=True)
    return SuiteReport(suite, results, table, json_path)


def _plain(value: Any) -> bool:
    """True for values that JSON can hold as they are."""
    return value is None or isinstance(value, (bool, int, float, str))


def _display_path(path: Path) -> str:
    """Return path relative to the current directory when it lies below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def main(suites: Sequence[Suite], argv: Sequence[str] | None = None, description: str | None = None,
         prog: str | None = None) -> int:
    """Parse the command line, run the suites in order and return the exit status.

    Args:
        suites: suites to run.
        argv: arguments without the program name; None reads sys.argv.
        description: text for --help; defaults to the only suite's description.
        prog: program name for usage lines; None uses sys.argv[0].
    """
    parser = make_parser(description or suites[0].description, suites, prog)
    args = parser.parse_args(argv)
    reports = []
    for i, suite in enumerate(suites):
        if i:
            print()
        reports.append(run_suite(suite, args))
    if len(reports) > 1:
        print()
        for report in reports:
            timed = [r for r in report.results if not r.skipped]
            print(f"{report.suite.name}: {len(timed) - len(report.failures)} of {len(timed)} cases within target")
    failed = any(report.failures for report in reports)
    return 1 if failed and args.strict else 0
