"""Fused eager against op-by-op eager, torch.compile and native CPU eager.

Four tables:

1. Steps of the model suites (bench_models' MLP and small-GPT AdamW training steps, GPT no-grad
   inference at batch 1 and 32): CPU eager, neuron op mode, neuron fused mode, neuron compiled
   (``torch.compile(backend="neuron")`` of the model, the optimizer step compiled too), timed in the
   same interleaved rounds (a new random order each round), medians. Steady state: the fused groups
   are compiled the second time they are seen (``early``), as the compiled variant is compiled in the
   warm-up rounds. Each neuron step ends with a
   read of the loss (the cut a training loop has anyway).
2. Loops that fusion cannot help: Hugging Face ``generate()`` of a small GPT-2 (random weights) with a
   growing KV cache, and a loop reading ``.item()`` every four ops: op mode against fused mode.
3. The demo's training run end to end (its 200 steps, compiling included) in fresh processes: op mode,
   and fused mode with an empty compile cache and with that cache filled, each with the default
   pay-off rule (a group is compiled once its op-by-op runs have paid for compiling it; op mode and
   these interleaved over 3 rounds, medians) and once with ``TORCHNEURON_FUSED_COMPILE=early``
   (compiled the second time it is seen), and the model under ``torch.compile`` (op mode), with an
   empty cache and a warm one: what compiled code itself costs end to end.
4. The fused report of the demo's training step.

    python benchmarks/bench_fused.py            # everything (about 20 minutes on 2 cores)
    python benchmarks/bench_fused.py --quick    # fewer rounds, the demo with 40 steps
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Callable

if __package__ in (None, ""):
    _root = str(Path(__file__).resolve().parent.parent)
    if _root not in sys.path:
        sys.path.append(_root)

import torch
import torch.nn.functional as F

from benchmarks.bench_models import GPT_INFER_BATCHES, GPT_SHAPE, SEED, gpt_program, load_gpt, mlp_program

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = ("cpu eager", "op", "fused", "compiled")


def _sync(device: str) -> None:
    if device != "cpu":
        torch.neuron.synchronize()


def _train_variants(program) -> dict[str, Callable[[], None]]:
    """One training step per variant, each on its own copy of the model and optimizer."""
    model, batch, loss_fn = program
    out = {}
    for variant in VARIANTS:
        device = "cpu" if variant == "cpu eager" else "neuron"
        m = copy.deepcopy(model).to(device).train()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=False)
        data = tuple(t.to(device) for t in batch)
        forward = torch.compile(m, backend="neuron") if variant == "compiled" else m
        opt_step = torch.compile(opt.step, backend="neuron") if variant == "compiled" else opt.step

        def step(m=m, forward=forward, opt=opt, opt_step=opt_step, data=data):
            loss = loss_fn(forward, data)
            loss.backward()
            opt_step()
            opt.zero_grad(set_to_none=True)
            loss.item()
        out[variant] = step
    return out


def _infer_variants(model, idx) -> dict[str, Callable[[], None]]:
    out = {}
    for variant in VARIANTS:
        device = "cpu" if variant == "cpu eager" else "neuron"
        m = copy.deepcopy(model).to(device).eval()
        forward = torch.compile(m, backend="neuron") if variant == "compiled" else m
        x = idx.to(device)

        def step(forward=forward, x=x):
            with torch.no_grad():
                logits, _ = forward(x)
            logits[0, -1, 0].item()
        out[variant] = step
    return out


def _timed(variant: str, fn: Callable[[], None], inner: int) -> float:
    torch.neuron.set_eager_mode("fused" if variant == "fused" else "op")
    try:
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        return (time.perf_counter() - start) / inner
    finally:
        torch.neuron.set_eager_mode("op")


def compare(fns: dict[str, Callable[[], None]], rounds: int, warmup: int, inner: int) -> dict[str, float]:
    """Median seconds per call of each variant, over interleaved rounds in a new random order each round."""
    for variant, fn in fns.items():
        _timed(variant, fn, warmup)  # compiles (torch.compile; fused groups once seen twice)
    samples: dict[str, list[float]] = {v: [] for v in fns}
    order = list(fns)
    for _ in range(rounds):
        random.shuffle(order)
        for variant in order:
            samples[variant].append(_timed(variant, fns[variant], inner))
    return {v: statistics.median(s) for v, s in samples.items()}


def model_table(args: argparse.Namespace) -> list[dict]:
    gpt = load_gpt()
    rows = []
    cases = [("MLP training step", lambda: _train_variants(mlp_program(torch.Generator().manual_seed(SEED)))),
             ("GPT training step", lambda: _train_variants(gpt_program(torch.Generator().manual_seed(SEED))))]
    for batch in GPT_INFER_BATCHES:
        def infer(batch=batch):
            torch.manual_seed(SEED)
            model = gpt.GPT(gpt.GPTConfig(**GPT_SHAPE))
            idx = torch.randint(0, GPT_SHAPE["vocab_size"], (batch, GPT_SHAPE["block_size"]),
                                generator=torch.Generator().manual_seed(SEED))
            return _infer_variants(model, idx)
        cases.append((f"GPT inference, batch {batch}", infer))
    for name, make in cases:
        torch.manual_seed(SEED)
        times = compare(make(), args.rounds, args.warmup, args.inner)
        rows.append({"workload": name, **{v: times[v] for v in VARIANTS}})
        print(_row(rows[-1]), flush=True)
    return rows


def _row(r: dict) -> str:
    ms = "  ".join(f"{r[v] * 1e3:8.2f}" for v in VARIANTS)
    return (f"| {r['workload']:<26} | {ms} | {r['fused'] / r['compiled']:5.2f} | {r['fused'] / r['op']:5.2f} | "
            f"{r['fused'] / r['cpu eager']:5.2f} |")


def loop_table(args: argparse.Namespace) -> list[dict]:
    rows = []
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(SEED)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=128, vocab_size=512, n_positions=256)).to("neuron")
    hf.eval()
    prompt = torch.randint(0, 512, (1, 16)).to("neuron")

    def generate():
        hf.generate(prompt, max_new_tokens=32, do_sample=False, pad_token_id=0)

    x0 = torch.randn(256, device="neuron")

    def item_loop():
        x = x0
        total = 0.0
        for i in range(64):
            x = (x * 0.9 + 0.1).sin()
            if i % 4 == 3:
                total += x.sum().item()

    for name, fn, inner in (("HF generate(), 32 new tokens", generate, 1), (".item() every 4 ops", item_loop, 5)):
        fns = {"op": fn, "fused": fn}
        times = compare(fns, args.rounds, 2, inner)
        rows.append({"workload": name, "op": times["op"], "fused": times["fused"]})
        print(f"| {name:<30} | {times['op'] * 1e3:8.2f} | {times['fused'] * 1e3:8.2f} | "
              f"{times['op'] / times['fused']:5.2f} |", flush=True)
    return rows


DEMO_SCRIPT = textwrap.dedent("""
    import sys, time, torch, torchneuron
    from torchneuron import demo
    steps = int(sys.argv[1])
    torch.set_num_threads(int(sys.argv[2]))
    text = demo.load_text()
    tok = demo.CharTokenizer(text)
    data = torch.tensor(tok.encode(text), dtype=torch.long)
    config = demo.demo_config(tok.vocab_size)
    start = time.perf_counter()
    run = demo.RunResult(name="device", device="neuron", tokens_per_step=demo.BATCH_SIZE * config.block_size)
    demo._train(run, demo._build_model(config, 0, "neuron"), data, steps, 0, progress=False,
                compile_model=sys.argv[3] == "compile")
    print("SECONDS", time.perf_counter() - start, "LOSS", run.losses[-1])
    if torch.neuron.get_eager_mode() == "fused":
        print(torchneuron.compile.fused_report())
""")


def _demo_run(args: argparse.Namespace, mode: str, rule: str, cache: str, how: str = "eager"
              ) -> tuple[float, float, str]:
    env = dict(os.environ, TORCHNEURON_EAGER=mode, TORCHNEURON_CACHE_DIR=cache, TORCHNEURON_FUSED_COMPILE=rule)
    out = subprocess.run([sys.executable, "-c", DEMO_SCRIPT, str(args.demo_steps), str(args.threads), how],
                         env=env, capture_output=True, text=True, check=True).stdout
    seconds = float(out.split("SECONDS", 1)[1].split()[0])
    loss = float(out.split("LOSS", 1)[1].split()[0])
    return seconds, loss, out.split("\n", 1)[1]


def demo_table(args: argparse.Namespace) -> tuple[list[dict], str]:
    """The demo end to end in fresh processes. ``early`` runs once each: with an empty cache (which
    fills it) and then warm. The default rule's runs and op mode are interleaved over ``demo_rounds``
    rounds (a new empty cache for each cold run), medians."""
    rows = []
    report = ""
    with tempfile.TemporaryDirectory() as warm:
        once = {}
        for label in ("fused, cold, early", "fused, warm, early"):  # the first fills the cache
            once[label] = _demo_run(args, "fused", "early", warm)
        report = once["fused, warm, early"][2]
        with tempfile.TemporaryDirectory() as compiled:  # torch.compile(model), as the demo's compiled run
            for label in ("torch.compile, cold", "torch.compile, warm"):
                once[label] = _demo_run(args, "op", "payoff", compiled, "compile")
        samples: dict[str, list[tuple[float, float, str]]] = {"op mode": [], "fused, cold cache": [],
                                                             "fused, warm cache": []}
        for _ in range(args.demo_rounds):
            samples["op mode"].append(_demo_run(args, "op", "payoff", warm))
            with tempfile.TemporaryDirectory() as cold:
                samples["fused, cold cache"].append(_demo_run(args, "fused", "payoff", cold))
            samples["fused, warm cache"].append(_demo_run(args, "fused", "payoff", warm))
        op = statistics.median(s[0] for s in samples["op mode"])
        for label, runs in samples.items():
            seconds = statistics.median(s[0] for s in runs)
            rows.append({"run": label, "seconds": seconds, "runs": [s[0] for s in runs], "final loss": runs[0][1]})
        for label, (seconds, loss, _) in once.items():
            rows.append({"run": label, "seconds": seconds, "runs": [seconds], "final loss": loss})
        for r in rows:
            print(f"| {r['run']:<18} | {r['seconds']:7.1f} s | {r['seconds'] / op:5.2f} | "
                  f"{' '.join(f'{x:.1f}' for x in r['runs'])} | {r['final loss']:.4f} |", flush=True)
        report = samples["fused, cold cache"][-1][2] + "\n" + report
    return rows, report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--inner", type=int, default=3)
    parser.add_argument("--demo-steps", type=int, default=200)
    parser.add_argument("--demo-rounds", type=int, default=3, help="interleaved rounds of the demo's default-rule runs")
    parser.add_argument("--quick", action="store_true", help="3 rounds, the demo with 40 steps")
    parser.add_argument("--skip", nargs="*", default=[], choices=["models", "loops", "demo"])
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.inner, args.demo_steps, args.demo_rounds = 3, 2, 40, 1
    torch.set_num_threads(args.threads)
    import torchneuron  # noqa: F401

    results: dict = {"threads": args.threads, "rounds": args.rounds}
    if "models" not in args.skip:
        torchneuron._C._fused_config(payoff=False)  # the steady state
        print(f"\n| workload | {'  '.join(f'{v:>8}' for v in VARIANTS)} (ms) | fused/compiled | fused/op | "
              f"fused/cpu |")
        results["models"] = model_table(args)
        torchneuron._C._fused_config(payoff=True)
    if "loops" not in args.skip:
        print("\n| loop | op (ms) | fused (ms) | op/fused (speed) |")
        results["loops"] = loop_table(args)
    if "demo" not in args.skip:
        print(f"\n| demo, {args.demo_steps} steps | time (median) | /op | runs (s) | final loss |")
        results["demo"], report = demo_table(args)
        print("\n" + report)
        results["demo_report"] = report
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_fused.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
