"""Cost of the runtime's modes: the GPT training step with asynchronous streams, in strict mode and under the sanitizer.

    python benchmarks/bench_modes.py
    python benchmarks/bench_modes.py --rounds 5 --steps 8

Asynchronous streams (TORCHNEURON_ASYNC=1), strict mode (TORCHNEURON_STRICT=1, which implies
asynchronous streams) and the sanitizer (TORCHNEURON_SANITIZER=warn) are chosen when a process
starts, so each round runs the demo's GPT training step (4 layers, 128 wide, 16x64 tokens, AdamW;
1 thread) in one fresh process per mode, the modes in turn; a process times ``steps`` steps after
two of warm-up and reports their median. A timed step ends with ``torch.neuron.synchronize()``, so
in the asynchronous modes it includes the work still queued when the host is done (in the default
mode the call has nothing to wait for). Figures are medians over rounds; ratio = the mode's step /
the default mode's step of the same round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

if __package__ in (None, ""):
    _root = str(Path(__file__).resolve().parent.parent)
    if _root not in sys.path:
        sys.path.append(_root)

from benchmarks.common import REPO_ROOT, RESULTS_DIR, environment

MODES = {
    "default": {},
    "async (TORCHNEURON_ASYNC=1)": {"TORCHNEURON_ASYNC": "1"},
    "strict (TORCHNEURON_STRICT=1)": {"TORCHNEURON_STRICT": "1"},
    "sanitizer (TORCHNEURON_SANITIZER=warn)": {"TORCHNEURON_SANITIZER": "warn"},
}

SCRUBBED = ("TORCHNEURON_STRICT", "TORCHNEURON_ASYNC", "TORCHNEURON_SANITIZER")

_STEP = """
import statistics, sys, time, torch
sys.path.insert(0, {root!r})
import torchneuron
from benchmarks.common import demo_gpt_step
torch.set_num_threads(1)
step = demo_gpt_step()
for _ in range(2):
    step()
times = []
for _ in range({steps}):
    start = time.perf_counter()
    step()
    torch.neuron.synchronize()
    times.append(time.perf_counter() - start)
print(statistics.median(times))
"""


def run_mode(env_extra: dict[str, str], steps: int) -> float:
    """The median step time in seconds of a fresh process in one mode."""
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", _STEP.format(root=str(REPO_ROOT), steps=steps)], cwd=REPO_ROOT,
                         env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each a process per mode (default 3)")
    parser.add_argument("--steps", type=int, default=6, help="timed steps per process (default 6)")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "modes.json", help="where to write the JSON")
    args = parser.parse_args(argv)

    times: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(args.rounds):
        for mode, env in MODES.items():
            times[mode].append(run_mode(env, args.steps))
    base = times["default"]
    print(f"GPT training step by mode: {args.rounds} rounds x {args.steps} steps, 1 thread (medians)")
    print(f"{'mode':42s} {'step ms':>9s} {'ratio':>7s}")
    results = {}
    for mode, ts in times.items():
        ratio = statistics.median(t / b for t, b in zip(ts, base))
        results[mode] = {"step_s": statistics.median(ts), "ratio": ratio}
        print(f"{mode:42s} {statistics.median(ts) * 1e3:9.2f} {ratio:6.2f}x")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"date": datetime.now(timezone.utc).isoformat(), "environment": environment(),
                                     "rounds": args.rounds, "steps": args.steps, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
