"""The example NKI kernels (examples/kernels/) on the emulated device against the PyTorch ops they
replace, and what each would take on one NeuronCore of trn1 and trn2 by its cost estimate.

Each round times the kernel and the op once each, alternating, at a fixed thread count; the table
gives medians, the ratio kernel / op on the emulated device and the estimates (projections from the
engines' published rates, not measurements). A kernel is timed in its steady state: traced once and
replayed as one compiled graph (``TORCHNEURON_NKI_REPLAY=early``: compiled at its second call, in the
warm-up; ``--interpret`` times the interpreter instead). Targets: the matmuls within 1.5x of
torch.mm, the elementwise and normalization kernels within 2x of their PyTorch ops.

    python benchmarks/bench_kernels.py [--rounds 15] [--threads 2] [--interpret]
    python benchmarks/bench_kernels.py --validate   # the cost model against AWS's published profile

``--validate`` estimates the matmul kernels of AWS's kernel-optimization guide at its size
(4096x8192 @ 8192x8192, float32, trn2) on fake tensors (no data work, about a minute) and prints
each engine's busy share next to the share the guide's profile reports.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "kernels"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torchneuron  # noqa: E402,F401


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    torch.neuron.synchronize()
    return time.perf_counter() - start


def cases():
    from attention import attention_fwd
    from layernorm import layernorm
    from matmul import matmul_hoisted, matmul_tiled
    from rmsnorm import rmsnorm
    from softmax import softmax
    from tensor_add import tensor_add

    g = torch.Generator().manual_seed(0)
    dev = lambda *shape: torch.randn(*shape, generator=g).to("neuron")  # noqa: E731
    lhsT, rhs = dev(1024, 1024), dev(1024, 1024)
    a, b = dev(1024, 2048), dev(1024, 2048)
    x, w, bias = dev(1024, 1024), dev(1024), dev(1024)
    q, k, v = dev(4, 512, 64), dev(4, 512, 64), dev(4, 512, 64)
    # (name, kernel, its arguments, the PyTorch ops it replaces, target ratio)
    return [
        ("matmul tiled 1024^3 fp32", matmul_tiled, (lhsT, rhs), lambda: torch.mm(lhsT.t(), rhs), 1.5),
        ("matmul hoisted 1024^3 fp32", matmul_hoisted, (lhsT, rhs), lambda: torch.mm(lhsT.t(), rhs), 1.5),
        ("tensor add 1024x2048", tensor_add, (a, b), lambda: a + b, 2.0),
        ("softmax 1024x1024", softmax, (x,), lambda: torch.softmax(x, 1), 2.0),
        ("rmsnorm 1024x1024", rmsnorm, (x, w, 1e-6), lambda: F.rms_norm(x, (1024,), w, 1e-6), 2.0),
        ("layernorm 1024x1024", layernorm, (x, w, bias), lambda: F.layer_norm(x, (1024,), w, bias), 2.0),
        ("attention causal 4x512x64", attention_fwd, (q, k, v, True),
         lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), None),
    ]


# Engine busy shares in the Neuron profiles of AWS's guide (aws-neuron/aws-neuron-sdk@4373fac,
# nki/guides/tutorials/kernel-optimization.rst, "Writing the kernel" and "Analyzing the kernel"), for its
# tiled kernel and for the same with the loads hoisted, 4096x8192 @ 8192x8192 float32 on trn2.
PUBLISHED_BUSY = {"matmul_tiled": {"DMA": 99.93, "TensorE": 87.28}, "matmul_hoisted": {"DMA": 99.73, "TensorE": 99.85}}


def validate() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from matmul import matmul_hoisted, matmul_tiled

    print(f"{'kernel (4096x8192x8192 fp32, trn2)':<36}{'engine':>8}{'estimate busy':>15}{'published busy':>16}"
          f"{'estimate':>11}")
    with FakeTensorMode():
        lhsT, rhs = torch.empty(8192, 4096, device="neuron"), torch.empty(8192, 8192, device="neuron")
        for kernel in (matmul_tiled, matmul_hoisted):
            est = kernel.estimate(lhsT, rhs, target="trn2")
            for engine, published in PUBLISHED_BUSY[kernel.__name__].items():
                busy = 100 * est.engine_seconds[engine] / est.seconds
                print(f"{kernel.__name__:<36}{engine:>8}{busy:>14.2f}%{published:>15.2f}%{est.seconds * 1e3:>9.2f}ms")
    print("busy: an engine's time over the kernel's (the estimate assumes perfect overlap); the guide publishes "
          "no absolute kernel times")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--validate", action="store_true", help="compare the cost model with AWS's published profile")
    parser.add_argument("--interpret", action="store_true", help="time the interpreter (no replay)")
    parser.add_argument("--no-json", action="store_true", help="accepted for run_all.py's interface; this "
                                                               "benchmark writes no JSON")
    args = parser.parse_args(argv)
    os.environ["TORCHNEURON_NKI_REPLAY"] = "0" if args.interpret else "early"
    torch.set_num_threads(args.threads)
    if args.validate:
        validate()
        return 0
    print(f"{'kernel':<30}{'kernel':>11}{'torch ops':>11}{'ratio':>8}{'est. trn1':>12}{'est. trn2':>12}  bound (trn2)  target")
    failed = False
    for name, kernel, kargs, op, target in cases():
        run = lambda: kernel(*kargs)  # noqa: E731
        run(), run(), op()  # warm-up (the second call traces and compiles)
        ks, os_ = [], []
        for _ in range(args.rounds):
            ks.append(_time(run))
            os_.append(_time(op))
        km, om = statistics.median(ks), statistics.median(os_)
        est = {t: kernel.estimate(*kargs, target=t) for t in ("trn1", "trn2")}
        ratio = km / om
        ok = target is None or ratio <= target
        failed |= not ok
        verdict = "-" if target is None else ("<= %.1f ok" % target if ok else "<= %.1f MISSED" % target)
        print(f"{name:<30}{km * 1e3:>9.2f}ms{om * 1e3:>9.2f}ms{ratio:>8.2f}{est['trn1'].seconds * 1e6:>10.2f}us"
              f"{est['trn2'].seconds * 1e6:>10.2f}us  {est['trn2'].bound:<12}  {verdict}")
    print("estimates: projections from the engines' published rates (docs/kernels.md), not measurements")
    if not args.interpret:
        import torchneuron.nki as nki

        print(nki.replay_report())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
