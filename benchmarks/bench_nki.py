"""NKI-style kernels on the emulated NeuronCore against the PyTorch op they replace, on the device.

Each round times the kernel and the op once each, alternating, at a fixed thread count; the table
gives medians and the ratio kernel / op (issue target: the tiled matmul within 3x of torch.mm).

    python benchmarks/bench_nki.py [--rounds 15] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import torch  # noqa: E402

import torchneuron  # noqa: E402,F401


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    torch.neuron.synchronize()
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    import test_nki as k  # the tutorial kernels

    g = torch.Generator().manual_seed(0)
    lhsT, rhs = (torch.randn(1024, 1024, generator=g).to("neuron") for _ in range(2))
    a, b = (torch.randn(1024, 2048, generator=g).to("neuron") for _ in range(2))
    x = torch.randn(1024, 1024, generator=g).to("neuron")
    w = torch.randn(1024, generator=g).to("neuron")
    cases = [
        ("matmul tiled 1024x1024x1024 fp32", lambda: k.matmul_tiled(lhsT, rhs), lambda: torch.mm(lhsT.t(), rhs), 3.0),
        ("tensor add 1024x2048", lambda: k.tensor_add(a, b), lambda: a + b, None),
        ("softmax 1024x1024", lambda: k.softmax(x), lambda: torch.softmax(x, 1), None),
        ("rmsnorm 1024x1024", lambda: k.rmsnorm(x, w), lambda: x * torch.rsqrt(x.square().mean(1, keepdim=True)) * w,
         None),
    ]
    print(f"{'case':<36}{'kernel':>12}{'torch op':>12}{'ratio':>8}  target")
    failed = False
    for name, kernel, op, target in cases:
        kernel(), op()  # warm-up
        ks, os_ = [], []
        for _ in range(args.rounds):
            ks.append(_time(kernel))
            os_.append(_time(op))
        km, om = statistics.median(ks), statistics.median(os_)
        ratio = km / om
        ok = target is None or ratio <= target
        failed |= not ok
        print(f"{name:<36}{km * 1e3:>10.2f}ms{om * 1e3:>10.2f}ms{ratio:>8.2f}  "
              f"{'-' if target is None else ('<= %.1f ok' % target if ok else '<= %.1f MISSED' % target)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
