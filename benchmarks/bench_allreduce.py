"""all_reduce bandwidth: neuron tensors (the neuron backend) versus CPU tensors (gloo), 2 processes.

    python benchmarks/bench_allreduce.py              # 1 KiB .. 256 MiB
    python benchmarks/bench_allreduce.py --quick      # 1 KiB .. 4 MiB, fewer rounds
    torchrun --nproc-per-node 2 benchmarks/bench_allreduce.py   # under a launcher of your own

Run plainly, the script starts its own worker processes on 127.0.0.1. The
workers open one process group with the ``neuron`` backend, whose gloo serves
both sides: CPU tensors reach it through PyTorch's own c10d kernels, neuron
tensors through the neuron kernels, which hand gloo the device memory itself.
The two sides share gloo's threads and connections, so only the kernels
differ. (``--backend cpu:gloo,neuron:neuron`` gives each side its own gloo
instead; on a busy machine the scheduler may then favour one side's threads
for a while.)

For each size the two alternate in short rounds: a round times ``inner``
float32 ``all_reduce(SUM)`` calls (about ``round_ms`` of work, at least one
call), and rounds come in groups of four, cpu-neuron-neuron-cpu then
neuron-cpu-cpu-neuron, so that each side takes each position equally often
and a steady drift within a group hits both alike. Groups are timed for
``budget`` seconds per size (at least ``rounds`` groups). A small all_reduce
over loopback takes well under a millisecond but swings by hundreds of
microseconds with the machine's load, so the two sides are compared in
thousands of groups a few milliseconds long rather than in a few long rounds:
whatever the load does, it does to both sides of a group. Times are the
slowest rank's, figures are medians over rounds, and the ratio is the median
over groups of neuron bandwidth / CPU bandwidth (target >= 0.95). Bandwidth
is the bus bandwidth of nccl-tests: bytes / time * 2 (n - 1) / n.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
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

TARGET = 0.95
KIB, MIB = 1 << 10, 1 << 20
FULL_MAX, QUICK_MAX = 256 * MIB, 4 * MIB
RESULTS = Path(__file__).resolve().parent / "results" / "bench_allreduce.json"


def _sizes(max_bytes: int) -> list[int]:
    sizes, size = [], KIB
    while size <= max_bytes:
        sizes.append(size)
        size *= 4
    return sizes


def _fmt_size(n: int) -> str:
    return f"{n // MIB} MiB" if n >= MIB else f"{n // KIB} KiB"


def _fmt_time(s: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.2f} {unit}"
    return f"{s * 1e9:.0f} ns"


# ---- worker --------------------------------------------------------------------------------------------

def _time_round(tensor, inner: int) -> float:
    import torch.distributed as dist

    start = time.perf_counter()
    for _ in range(inner):
        dist.all_reduce(tensor)
    return (time.perf_counter() - start) / inner


def _plan(tensor, args: argparse.Namespace) -> tuple[int, int]:
    """Calls per round and timed groups for one size: about round_ms per round and budget per size."""
    per_call = max(statistics.median(_time_round(tensor, 1) for _ in range(5)), 1e-9)
    inner = max(1, min(1000, round(args.round_ms * 1e-3 / per_call)))
    groups = max(args.rounds, min(100_000, int(args.budget / (4 * inner * per_call))))
    return inner, groups


def _measure(tensors: dict, inner: int, groups: int, warmup: int) -> tuple[list[float], list[float]]:
    """Per-round times of each side, timed in groups of 4 rounds: cpu, neuron, neuron, cpu or the reverse.

    Rounds i and i + 1 of a side (i even) belong to the same group."""
    samples: dict[str, list[float]] = {"cpu": [], "neuron": []}
    for g in range(warmup + groups):
        # cpu, neuron, neuron, cpu, then neuron, cpu, cpu, neuron: each side has each position
        # equally often, and a steady drift within a group hits both sides alike.
        first, second = ("cpu", "neuron") if g % 2 == 0 else ("neuron", "cpu")
        for label in (first, second, second, first):
            t = _time_round(tensors[label], inner)
            if g >= warmup:
                samples[label].append(t)
    return samples["cpu"], samples["neuron"]


def _worker(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    import torchneuron  # noqa: F401  (registers the neuron device and backend)

    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("neuron", torch.neuron.current_device())
    rows = []
    for size in _sizes(args.max_bytes):
        n = size // 4
        tensors = {"cpu": torch.zeros(n), "neuron": torch.zeros(n, device=device)}  # sums stay 0
        for t in tensors.values():
            _time_round(t, 2)
        # All ranks must run the same calls: rank 0's plan is everyone's.
        plan = torch.tensor(_plan(tensors["cpu"], args))
        dist.broadcast(plan, 0)
        inner, groups = (int(x) for x in plan)
        cpu_s, neuron_s = _measure(tensors, inner, groups, args.warmup)
        # Each round's time is that of the slowest rank.
        stacked = torch.tensor([cpu_s, neuron_s], dtype=torch.float64)
        dist.all_reduce(stacked, op=dist.ReduceOp.MAX)
        cpu_s, neuron_s = stacked.tolist()
        busbw = lambda s: size / s * 2 * (world - 1) / world / 1e9  # noqa: E731  (GB/s)
        # Neuron bandwidth / cpu bandwidth in each group of 4 rounds (2 per side).
        ratios = [(cpu_s[i] + cpu_s[i + 1]) / (neuron_s[i] + neuron_s[i + 1]) for i in range(0, len(cpu_s), 2)]
        row = {"bytes": size, "inner": inner, "rounds": 2 * groups, "cpu_median_s": statistics.median(cpu_s),
               "neuron_median_s": statistics.median(neuron_s), "cpu_busbw_gbs": busbw(statistics.median(cpu_s)),
               "neuron_busbw_gbs": busbw(statistics.median(neuron_s)), "ratio": statistics.median(ratios),
               "cpu_rounds_s": cpu_s, "neuron_rounds_s": neuron_s}
        row["ok"] = row["ratio"] >= TARGET
        rows.append(row)
        if rank == 0:
            print(f"  {_fmt_size(size)}: cpu {row['cpu_busbw_gbs']:.3f} GB/s  neuron {row['neuron_busbw_gbs']:.3f}"
                  f" GB/s  ratio {row['ratio']:.3f}  ({groups} groups of 4 rounds of {inner} calls)",
                  file=sys.stderr, flush=True)
        del tensors
    if rank == 0:
        table = _table(rows, world)
        print(table, flush=True)
        if not args.no_json:
            _write_json(Path(args.json), rows, args, world)
            print(f"JSON: {args.json}", flush=True)
    dist.destroy_process_group()
    return 1 if args.strict and not all(r["ok"] for r in rows) else 0


def _table(rows: list[dict], world: int) -> str:
    header = ["size", "cpu (gloo) median", "neuron median", "cpu busbw", "neuron busbw", "ratio", "target", "ok"]
    body = [[_fmt_size(r["bytes"]), _fmt_time(r["cpu_median_s"]), _fmt_time(r["neuron_median_s"]),
             f"{r['cpu_busbw_gbs']:.3f} GB/s", f"{r['neuron_busbw_gbs']:.3f} GB/s", f"{r['ratio']:.3f}",
             f">= {TARGET:.2f}", "yes" if r["ok"] else "NO"] for r in rows]
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join([cells[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(cells[1:], widths[1:])])

    passed = sum(r["ok"] for r in rows)
    return "\n".join([f"all_reduce(SUM, float32), {world} processes on 127.0.0.1",
                      line(header), line(["-" * w for w in widths]), *(line(b) for b in body),
                      "ratio = median over groups of 4 adjacent rounds (2 per side) of neuron bandwidth / cpu "
                      "bandwidth; "
                      f"{passed} of {len(rows)} sizes within target."])


def _write_json(path: Path, rows: list[dict], args: argparse.Namespace, world: int) -> None:
    import platform

    import torch

    payload = {
        "suite": "allreduce",
        "description": "all_reduce bus bandwidth, neuron tensors (neuron backend) vs CPU tensors (gloo)",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "settings": {"world_size": world, "backend": args.backend, "rounds": args.rounds, "warmup": args.warmup,
                     "round_ms": args.round_ms, "budget_s": args.budget, "max_bytes": args.max_bytes,
                     "target": TARGET},
        "environment": {"python": platform.python_version(), "torch": torch.__version__,
                        "platform": platform.platform(), "cpu_count": os.cpu_count()},
        "results": rows,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")


# ---- launcher ------------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(argv: list[str], world: int) -> int:
    """Start ``world`` workers of this script on 127.0.0.1 and wait for them."""
    port = str(_free_port())
    procs = []
    for rank in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("TORCHNEURON_NUM_DEVICES", str(max(world, int(os.environ.get("TORCHNEURON_NUM_DEVICES", "2")))))
        procs.append(subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *argv], env=env,
                                      stdout=None if rank == 0 else subprocess.DEVNULL))
    codes = [p.wait() for p in procs]
    return max(codes, key=abs)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help=f"sizes up to {_fmt_size(QUICK_MAX)}, 1 s per size, at least 5 groups")
    parser.add_argument("--max-size", type=str, default=None, help="largest size, e.g. 64MiB (default 256MiB)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="least number of timed groups of 4 rounds per size (default 15, quick 5)")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds of timed groups per size, or as long as --rounds groups take "
                             "(default 4, quick 1)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed groups per size (default 2)")
    parser.add_argument("--round-ms", type=float, default=None,
                        help="target length of a round; a round has at least one call (default 1)")
    parser.add_argument("--backend", default="neuron",
                        help="init_process_group's backend (default neuron: one gloo for both sides)")
    parser.add_argument("--nproc", type=int, default=2, help="worker processes when self-launched (default 2)")
    parser.add_argument("--json", default=str(RESULTS), help=f"JSON output (default {RESULTS})")
    parser.add_argument("--no-json", action="store_true", help="do not write JSON")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a size misses the target")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        return _launch(argv, args.nproc)
    if args.max_size:
        text = args.max_size.strip().lower().replace("ib", "").replace("b", "")
        scale = {"k": KIB, "m": MIB, "g": 1 << 30}.get(text[-1], 1)
        args.max_bytes = int(float(text.rstrip("kmg")) * scale)
    else:
        args.max_bytes = QUICK_MAX if args.quick else FULL_MAX
    args.rounds = args.rounds or (5 if args.quick else 15)
    args.budget = args.budget or (1.0 if args.quick else 4.0)
    args.round_ms = args.round_ms or 1.0
    return _worker(args)


if __name__ == "__main__":
    sys.exit(main())
