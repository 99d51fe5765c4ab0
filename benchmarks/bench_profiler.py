"""Cost of torch.profiler on neuron: a GPT training step profiled against the same step unprofiled.

    python benchmarks/bench_profiler.py
    python benchmarks/bench_profiler.py --rounds 5 --steps 4
    python benchmarks/bench_profiler.py --case linears --threads 1 --no-memory

The demo's GPT (4 layers, 128 wide, 16x64 tokens, AdamW) trains on the neuron device with a
fixed thread count (``--case linears``: inference through 20 Linear(64, 64) layers on a 32x64
batch instead). Each round runs ``steps`` plain steps, then ``steps`` steps inside
``torch.profiler.profile(activities=[CPU, PrivateUse1])`` (device activity on, every kernel a
device event), unless --no-memory the same with ``profile_memory=True``, and ``steps`` steps
inside the legacy profiler ``torch.autograd.profiler.profile(use_device="neuron")`` (each op
timed on the device by a pair of events); the kinds alternate round by round and figures are
medians over rounds. Rows (ratio = the step's time / the plain step's):

- profiled step: a step while the profile records;
- profiled step, memory: the same with profile_memory=True;
- legacy profiler step: a step while the legacy profile records;
- whole profile: entering the profile, the steps, and leaving it (when PyTorch reads the
  trace back, links device events to ops and builds its events), per step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

if __package__ in (None, ""):
    _root = str(Path(__file__).resolve().parent.parent)
    if _root not in sys.path:
        sys.path.append(_root)

import torch
from torch.autograd.profiler import profile as legacy_profile
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import RESULTS_DIR, demo_gpt_step, environment

THREADS = 2
TARGET = 1.5


def linears_step() -> Callable[[], None]:
    """Inference through 20 Linear(64, 64) layers on a 32x64 batch, synchronized at its end."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(20)]).to("neuron")
    x = torch.randn(32, 64, device="neuron")

    def step() -> None:
        with torch.no_grad():
            model(x)
        torch.neuron.synchronize()

    return step


def open_profile(kind: str):
    if kind == "legacy":
        return legacy_profile(use_device="neuron")
    return profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], profile_memory=kind == "memory")


def measure(rounds: int, steps: int, memory: bool, case: str = "gpt") -> dict:
    """Interleaved rounds; per-step medians in seconds and median ratios to the plain step."""
    step = demo_gpt_step() if case == "gpt" else linears_step()
    for _ in range(3):
        step()
    kinds = ["profiled"] + (["memory"] if memory else []) + ["legacy"]
    plain: list[float] = []
    inside: dict[str, list[float]] = {k: [] for k in kinds}
    whole: dict[str, list[float]] = {k: [] for k in kinds}
    events = 0
    for r in range(rounds + 1):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        t_plain = (time.perf_counter() - t0) / steps
        results = {}
        for kind in kinds:
            t0 = time.perf_counter()
            with open_profile(kind) as prof:
                t1 = time.perf_counter()
                for _ in range(steps):
                    step()
                t2 = time.perf_counter()
            prof.key_averages()  # what PyTorch builds from the profile (its events, once) for the table and exports
            t3 = time.perf_counter()
            results[kind] = ((t2 - t1) / steps, (t3 - t0) / steps)
            if kind == "profiled":
                events = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1)
        if r == 0:  # warm-up round
            continue
        plain.append(t_plain)
        for kind in kinds:
            inside[kind].append(results[kind][0])
            whole[kind].append(results[kind][1])
    ratio = lambda xs: statistics.median(x / p for x, p in zip(xs, plain))  # noqa: E731
    out = {"plain_s": statistics.median(plain), "rounds": rounds, "steps": steps,
           "device_events_per_step": events // steps}
    for kind in kinds:
        out[f"{kind}_s"] = statistics.median(inside[kind])
        out[f"{kind}_ratio"] = ratio(inside[kind])
        out[f"{kind}_whole_ratio"] = ratio(whole[kind])
    out["legacy_over_profiled"] = statistics.median(a / b for a, b in zip(inside["legacy"], inside["profiled"]))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds (default 7, after one warm-up round)")
    parser.add_argument("--steps", type=int, default=5, help="steps per round and kind (default 5)")
    parser.add_argument("--no-memory", action="store_true", help="skip the profile_memory=True rows")
    parser.add_argument("--case", choices=("gpt", "linears"), default="gpt",
                        help="gpt: the demo GPT's training step (default); linears: 20 Linear layers' inference")
    parser.add_argument("--threads", type=int, default=THREADS, help=f"torch threads (default {THREADS})")
    parser.add_argument("--json", type=Path, default=None,
                        help="where to write the JSON (default results/profiler.json, results/profiler_linears.json)")
    args = parser.parse_args(argv)

    import torchneuron  # noqa: F401  (registers the neuron device)

    torch.set_num_threads(args.threads)
    r = measure(args.rounds, args.steps, memory=not args.no_memory, case=args.case)
    label = "GPT train step" if args.case == "gpt" else "20 Linear layers"
    # The linears' ops are a few microseconds each: a profiler's cost per op is a large part of
    # such a step, and only the two profilers' costs are compared there.
    target = TARGET if args.case == "gpt" else None
    rows = [(f"{label} (plain)", r["plain_s"], 1.0, None)]
    rows.append(("profiled step", r["profiled_s"], r["profiled_ratio"], target))
    if "memory_s" in r:
        rows.append(("profiled step, profile_memory=True", r["memory_s"], r["memory_ratio"], target))
    rows.append(("legacy profiler step (use_device)", r["legacy_s"], r["legacy_ratio"], target))
    rows.append(("legacy step / torch.profiler step", None, r["legacy_over_profiled"], TARGET))
    rows.append(("whole profile, per step", None, r["profiled_whole_ratio"], None))
    rows.append(("whole legacy profile, per step", None, r["legacy_whole_ratio"], None))
    print(f"torch.profiler on neuron: {args.threads} threads, {r['rounds']} rounds x {r['steps']} steps, "
          f"{r['device_events_per_step']} device events per step (medians)")
    print(f"{'row':40s} {'step ms':>9s} {'ratio':>7s} {'target':>7s}")
    failed = False
    for name, seconds, ratio, target in rows:
        ms = f"{seconds * 1e3:9.2f}" if seconds is not None else f"{'':9s}"
        mark = "" if target is None else (f"{target:6.2f}x" + (" FAIL" if ratio > target else ""))
        failed = failed or (target is not None and ratio > target)
        print(f"{name:40s} {ms} {ratio:6.2f}x {mark}")
    if args.json is None:
        args.json = RESULTS_DIR / ("profiler.json" if args.case == "gpt" else f"profiler_{args.case}.json")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"date": datetime.now(timezone.utc).isoformat(), "environment": environment(),
                                     "threads": args.threads, "case": args.case, "results": r}, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
