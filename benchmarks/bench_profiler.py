"""Cost of torch.profiler on neuron: a GPT training step profiled against the same step unprofiled.

    python benchmarks/bench_profiler.py
    python benchmarks/bench_profiler.py --rounds 5 --steps 4

The demo's GPT (4 layers, 128 wide, 16x64 tokens, AdamW) trains on the neuron device with a
fixed thread count. Each round runs ``steps`` plain steps, then ``steps`` steps inside
``torch.profiler.profile(activities=[CPU, PrivateUse1])`` (device activity on, every kernel a
device event), and, unless --no-memory, the same with ``profile_memory=True``; the kinds
alternate round by round and figures are medians over rounds. Rows (ratio = the step's time /
the plain step's):

- profiled step: a step while the profile records;
- profiled step, memory: the same with profile_memory=True;
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

if __package__ in (None, ""):
    _root = str(Path(__file__).resolve().parent.parent)
    if _root not in sys.path:
        sys.path.append(_root)

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import RESULTS_DIR, demo_gpt_step, environment

THREADS = 2
TARGET = 1.5


def measure(rounds: int, steps: int, memory: bool) -> dict:
    """Interleaved rounds; per-step medians in seconds and median ratios to the plain step."""
    step = demo_gpt_step()
    for _ in range(3):
        step()
    kinds = ["profiled"] + (["memory"] if memory else [])
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
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                         profile_memory=kind == "memory") as prof:
                t1 = time.perf_counter()
                for _ in range(steps):
                    step()
                t2 = time.perf_counter()
            prof.events()  # what key_averages() and export read, built once
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
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds (default 7, after one warm-up round)")
    parser.add_argument("--steps", type=int, default=5, help="steps per round and kind (default 5)")
    parser.add_argument("--no-memory", action="store_true", help="skip the profile_memory=True rows")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "profiler.json", help="where to write the JSON")
    args = parser.parse_args(argv)

    import torchneuron  # noqa: F401  (registers the neuron device)

    torch.set_num_threads(THREADS)
    r = measure(args.rounds, args.steps, memory=not args.no_memory)
    rows = [("GPT train step (plain)", r["plain_s"], 1.0, None)]
    rows.append(("profiled step", r["profiled_s"], r["profiled_ratio"], TARGET))
    if "memory_s" in r:
        rows.append(("profiled step, profile_memory=True", r["memory_s"], r["memory_ratio"], TARGET))
    rows.append(("whole profile, per step", None, r["profiled_whole_ratio"], None))
    print(f"torch.profiler on neuron: {THREADS} threads, {r['rounds']} rounds x {r['steps']} steps, "
          f"{r['device_events_per_step']} device events per step (medians)")
    print(f"{'row':40s} {'step ms':>9s} {'ratio':>7s} {'target':>7s}")
    failed = False
    for name, seconds, ratio, target in rows:
        ms = f"{seconds * 1e3:9.2f}" if seconds is not None else f"{'':9s}"
        mark = "" if target is None else (f"{target:6.2f}x" + (" FAIL" if ratio > target else ""))
        failed = failed or (target is not None and ratio > target)
        print(f"{name:40s} {ms} {ratio:6.2f}x {mark}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"date": datetime.now(timezone.utc).isoformat(), "environment": environment(),
                                     "threads": THREADS, "results": r}, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
