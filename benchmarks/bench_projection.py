"""Cost of counting a program for a projection: a real run's step with and without counting, and
the time a fake-mode projection of a 70B model takes.

    python benchmarks/bench_projection.py
    python benchmarks/bench_projection.py --rounds 5 --steps 6 --no-70b

The demo GPT (4 layers, 128 wide, 16x64 tokens, AdamW) trains on the neuron device, one thread. Each round
runs ``steps`` plain training steps, then a ``torchneuron.projection.count()`` block: its first
step counted op by op (the Python dispatch mode), then ``steps`` steps watched through PyTorch's
profiler, which end the block carrying the first step's counts. Plain and counted rounds
alternate; figures are medians over rounds. Rows (ratio = the step's time / the plain step's):

- watched step, names only: what a counted run's steps cost in its steady state (after two
  watched steps allocated alike, the profiler records op names only);
- watched step with shapes: the watched steps before that (the profiler also records shapes,
  and the switch reads that session back);
- step counted op by op: the one step per block that is recorded kernel by kernel;
- whole block: everything from entering ``count()`` to its exit (the profiler's timeline read
  back, steps matched), divided by as many plain steps.

Each figure is taken twice, in wall-clock time and in the CPU time of this process (which other
work on a busy machine disturbs less).

The 70B row counts a Llama-3-70B training step (forward, backward, AdamW; 1x8192 tokens; every
one of its 80 layers) on fake tensors and projects it on three instances, in a fresh process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

if __package__ in (None, ""):
    _root = str(Path(__file__).resolve().parent.parent)
    if _root not in sys.path:
        sys.path.append(_root)

import torch

from benchmarks.common import REPO_ROOT, RESULTS_DIR, demo_gpt_step, environment

THREADS = 1
TARGET = 1.2
SEVENTY_B_TARGET_S = 60.0

_SEVENTY_B = """
import time, torch, torch.nn.functional as F
torch.set_num_threads({threads})
start = time.perf_counter()
from torchneuron import projection
from torchneuron.projection.models import LLAMA_CONFIGS, build
cfg = LLAMA_CONFIGS["llama3-70b"]
with projection.count(fake=True) as p:
    model = build(cfg)
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    p.counter.discard()
    x = torch.zeros(1, 8192, dtype=torch.long, device="meta")
    F.cross_entropy(model(x).flatten(0, 1).float(), x.flatten()).backward()
    opt.step()
    p.step(tokens=8192, samples=1)
counted = time.perf_counter() - start
p.declare(model=model, layers=cfg.n_layers, hidden=cfg.dim)
report = p.project(["trn1.32xlarge", "trn2.48xlarge"], compare=["p5.48xlarge"],
                   parallel=projection.Parallelism(dp=4, tp=8, pp=8, microbatches=64))
print(counted, time.perf_counter() - start, int(report.counted["ops"]))
"""


def measure_counting(rounds: int, steps: int) -> dict:
    """Interleaved rounds of plain and counted steps; per-step medians in seconds."""
    from torchneuron import projection

    step = demo_gpt_step()
    for _ in range(3):
        step()
    out = {}
    unmatched = 0
    for clock_name, clock in (("wall", time.perf_counter), ("cpu", time.process_time)):
        plain, steady, first, full, block, once = [], [], [], [], [], []
        for r in range(rounds + 1):
            t0 = clock()
            for _ in range(steps):
                step()
            t_plain = (clock() - t0) / steps
            times, switched_after = [], None
            t0 = clock()
            with projection.count(full_steps=1) as p:
                for i in range(steps + 1):
                    t = clock()
                    step()
                    p.step(tokens=1024)
                    times.append(clock() - t)
                    if switched_after is None and p.counter._switched:
                        switched_after = i
                t_exit = clock()
            t_end = clock()
            unmatched += p.counter.unmatched_steps
            if r == 0:  # warm-up round
                continue
            if switched_after is None or switched_after >= steps:
                raise RuntimeError("the watch never switched to names only; raise --steps")
            plain.append(t_plain)
            full.append(times[0])
            first.append(sum(times[1:switched_after + 1]) / switched_after)
            steady.append(sum(times[switched_after + 1:]) / (steps - switched_after))
            block.append((t_end - t0) / (steps + 1))
            # What a block costs beyond its steps at the plain step's time: entering, the step
            # counted op by op, the watched steps with shapes, the switch, reading back at exit.
            once.append((t_end - t0) - (steps + 1) * t_plain)
            del t_exit
        ratios = lambda xs: statistics.median(x / p for x, p in zip(xs, plain))  # noqa: E731
        out[clock_name] = {
            "plain_s": statistics.median(plain), "steady_s": statistics.median(steady),
            "first_watched_s": statistics.median(first), "full_s": statistics.median(full),
            "block_per_step_s": statistics.median(block), "once_s": statistics.median(once),
            "steady_ratio": ratios(steady), "first_watched_ratio": ratios(first), "full_ratio": ratios(full),
            "block_ratio": ratios(block), "switched_after": switched_after,
        }
    out.update(unmatched_steps=unmatched, rounds=rounds, steps=steps)
    return out


def measure_70b() -> dict:
    """Count and project a Llama-3-70B training step on fake tensors in a fresh process."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _SEVENTY_B.format(threads=THREADS)], cwd=REPO_ROOT,
                         capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    counted, projected, ops = out.stdout.split()[-3:]
    return {"process_s": wall, "count_s": float(counted), "count_and_project_s": float(projected), "ops": int(ops)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds (default 7, after one warm-up round)")
    parser.add_argument("--steps", type=int, default=8, help="plain and watched steps per round (default 8)")
    parser.add_argument("--no-70b", action="store_true", help="skip the 70B fake-mode row")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "projection.json", help="where to write the JSON")
    args = parser.parse_args(argv)

    import torchneuron  # noqa: F401  (registers the neuron device)

    torch.set_num_threads(THREADS)
    c = measure_counting(args.rounds, args.steps)
    ms = lambda s: f"{s * 1e3:.2f} ms"  # noqa: E731
    print(f"counting a real run: demo GPT training step on neuron, {THREADS} threads, "
          f"{c['rounds']} interleaved rounds of {c['steps']} steps per clock, medians")
    print(f"{'case':<44}{'clock':>6}{'plain step':>12}{'counted':>12}{'ratio':>8}{'target':>8}")
    for clock in ("wall", "cpu"):
        k = c[clock]
        n = k["switched_after"]
        rows = [(f"watched step, names only (steps {n + 2}-{c['steps'] + 1})", k["steady_s"], k["steady_ratio"],
                 f"<= {TARGET}"),
                (f"watched step with shapes (steps 2-{n + 1})", k["first_watched_s"], k["first_watched_ratio"], "-"),
                ("step counted op by op (step 1)", k["full_s"], k["full_ratio"], "-"),
                (f"whole block of {c['steps'] + 1} steps, per step", k["block_per_step_s"], k["block_ratio"], "-")]
        for name, t, ratio, target in rows:
            print(f"{name:<44}{clock:>6}{ms(k['plain_s']):>12}{ms(t):>12}{ratio:>8.2f}{target:>8}")
        print(f"{'  one-time cost of a block beyond its steps':<44}{clock:>6}{'':>12}{ms(k['once_s']):>12}")
    if c["unmatched_steps"]:
        print(f"warning: {c['unmatched_steps']} watched step(s) did not repeat the counted step")
    result = {"counting": c}
    if not args.no_70b:
        b = measure_70b()
        result["llama3_70b_fake"] = b
        print(f"Llama-3-70B training step, fake mode, {b['ops']:,} ops: counted in {b['count_s']:.1f} s, "
              f"counted and projected in {b['count_and_project_s']:.1f} s ({b['process_s']:.1f} s with the "
              f"process start; target < {SEVENTY_B_TARGET_S:.0f} s)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"suite": "projection", "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                     "environment": environment(), "results": result}, indent=2) + "\n")
    ok = c["wall"]["steady_ratio"] <= TARGET and not c["unmatched_steps"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
