"""Per-call cost of a c10d collective on neuron tensors versus CPU tensors, in one process.

    python benchmarks/bench_c10d_overhead.py
    python benchmarks/bench_c10d_overhead.py --blocks 400 --calls 20

One process opens a group of size 1 with the ``neuron`` backend, whose gloo
serves both sides: CPU tensors reach it through PyTorch's c10d kernels, neuron
tensors through the neuron kernels (gloo on the device memory). With a single
rank nothing crosses a network, so a call costs the Python function, the
dispatcher, the c10d kernel, gloo's queue and the handle: what the neuron
kernel adds shows as the difference. (``--backend cpu:gloo,neuron:neuron``
gives each side a gloo of its own, whose threads a busy machine may treat
differently.) The two devices
alternate block by block (``calls`` calls each); figures are medians over
blocks, and ``extra`` is the median of the per-block differences neuron - cpu,
in wall-clock time and in CPU time of the whole process (gloo's threads
included), which a busy machine disturbs less.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
import warnings
from pathlib import Path

if __package__ in (None, ""):
    _root = str(Path(__file__).resolve().parent.parent)
    if _root not in sys.path:
        sys.path.append(_root)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cases(dist, torch):
    def all_reduce(t, out):
        dist.all_reduce(t)

    def all_reduce_async(t, out):
        dist.all_reduce(t, async_op=True).wait()

    def broadcast(t, out):
        dist.broadcast(t, 0)

    def all_gather_into_tensor(t, out):
        dist.all_gather_into_tensor(out, t)

    return {"all_reduce 1 KiB": all_reduce, "all_reduce 1 KiB async + wait": all_reduce_async,
            "broadcast 1 KiB": broadcast, "all_gather_into_tensor 1 KiB": all_gather_into_tensor}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=300, help="timed blocks per device and case (default 300)")
    parser.add_argument("--calls", type=int, default=20, help="calls per block (default 20)")
    parser.add_argument("--backend", default="neuron",
                        help="init_process_group's backend (default neuron: one gloo for both sides)")
    args = parser.parse_args(argv)

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    import torchneuron  # noqa: F401  (registers the neuron device and backend)

    warnings.filterwarnings("ignore", category=FutureWarning)  # all_gather_into_tensor's deprecation
    torch.set_num_threads(1)
    dist.init_process_group(args.backend, rank=0, world_size=1)
    tensors = {d: (torch.zeros(256, device=d), torch.zeros(256, device=d)) for d in ("cpu", "neuron")}
    print(f"c10d per-call cost, 1 process, {args.blocks} blocks x {args.calls} calls per device")
    print(f"{'':32s}  {'wall clock':^32s}  {'CPU time (all threads)':^32s}")
    print(f"{'case':32s}  " + "  ".join(f"{h:>10s}" for h in ("cpu", "neuron", "extra") * 2))
    for name, fn in _cases(dist, torch).items():
        for d in ("cpu", "neuron"):
            for _ in range(50):
                fn(*tensors[d])
        wall = {"cpu": [], "neuron": []}
        busy = {"cpu": [], "neuron": []}
        for b in range(args.blocks):
            for d in (("cpu", "neuron") if b % 2 == 0 else ("neuron", "cpu")):
                t, out = tensors[d]
                start, start_cpu = time.perf_counter(), time.process_time()
                for _ in range(args.calls):
                    fn(t, out)
                busy[d].append((time.process_time() - start_cpu) / args.calls)
                wall[d].append((time.perf_counter() - start) / args.calls)
        row = [statistics.median(wall["cpu"]), statistics.median(wall["neuron"]),
               statistics.median(n - c for c, n in zip(wall["cpu"], wall["neuron"])),
               statistics.median(busy["cpu"]), statistics.median(busy["neuron"]),
               statistics.median(n - c for c, n in zip(busy["cpu"], busy["neuron"]))]
        print(f"{name:32s}  " + "  ".join(f"{x * 1e6:+8.1f}us" if i % 3 == 2 else f"{x * 1e6:8.1f}us"
                                          for i, x in enumerate(row)), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
