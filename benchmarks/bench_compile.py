"""torch.compile: MLP, CNN and small-GPT training steps and inference, compiled and eager, neuron versus CPU.

Each workload runs in five variants, timed in the same interleaved rounds (in a
new random order each round, so load drift hits all of them alike and no variant
always runs after the same one):

  CPU eager, CPU compiled (``torch.compile``, PyTorch's default backend Inductor),
  neuron eager, neuron compiled with the default backend, neuron compiled with
  ``backend="neuron"``.

The main table gives, like the other suites, ratios neuron / CPU of the same
program: eager vs eager, default backend vs default backend, and
``backend="neuron"`` vs the CPU's default backend. A second table gives each
device's speed-up of compiled over eager, also taken round by round. Training
steps compile the optimizer step too (``torch.compile`` of a function calling
``opt.step()``). Each compiled variant calls its model and optimizer through
functions with code objects of their own, so Dynamo's cache for them holds that
variant only (see :func:`_own_code`). A third table (skip it with ``--no-compile-times``) gives cold
and warm compile times of the training steps, measured in fresh processes with an
empty and then a filled cache directory.

    python benchmarks/bench_compile.py                 # everything (about 20 minutes on 2 cores, cold cache)
    python benchmarks/bench_compile.py -k mlp --quick  # smoke run
    python benchmarks/bench_compile.py --compile-ratio # cold/warm compile time, neuron vs CPU Inductor only
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

if __package__ in (None, ""):
    _root = str(Path(__file__).resolve().parent.parent)
    if _root not in sys.path:
        sys.path.append(_root)

import torch
import torch._dynamo
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.bench_models import (GPT_INFER_BATCHES, GPT_SHAPE, GPT_TRAIN_BATCH, MLP_SIZES,
                                     OPTIMIZER_IMPLS, SEED, gpt_program, load_gpt, mlp_program)
from benchmarks.common import (QUICK_ROUND_MS, QUICK_ROUNDS, QUICK_WARMUP, DEFAULT_ROUND_MS, DEFAULT_WARMUP,
                               REPO_ROOT, Case, Fn, Result, Suite, busy_cpus, calibrate, device_labels,
                               format_table, make_parser, parse_devices, require_devices, synchronizer, time_round,
                               write_json, _display_path)

EAGER_TARGET = 1.05
COMPILED_TARGET = 1.00
COMPILERS = ("eager", "inductor", "backend=neuron")


@dataclass
class Workload:
    """One model program: a CPU model and how to run one step of it.

    Args:
        name: row label.
        model: CPU model; each variant gets its own deep copy.
        batch: CPU tensors the step uses.
        train: True for forward, loss, backward, AdamW step and zero_grad; False for a no-grad forward.
        loss_of: given the (compiled) model and the batch on the device, returns the loss (train only).
    """

    name: str
    model: nn.Module
    batch: tuple[torch.Tensor, ...]
    train: bool
    loss_of: Callable[[Any, tuple], torch.Tensor] | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the compile suite's options.

    Args:
        parser: parser to extend.
    """
    parser.add_argument("--optimizer-impl", choices=sorted(OPTIMIZER_IMPLS), default="for-loop",
                        help="AdamW implementation used by every variant (default: %(default)s)")
    parser.add_argument("--no-compile-times", dest="compile_times", action="store_false",
                        help="skip the cold/warm compile time measurement (fresh processes, slow)")
    parser.add_argument("--compile-ratio", action="store_true",
                        help="only the focused compile-time comparison: cold and warm compile of a forward+backward "
                             "on neuron vs CPU Inductor, fresh processes interleaved, medians (see compile_ratios)")
    parser.add_argument("--ratio-models", default=",".join(RATIO_MODELS), metavar="LIST",
                        help=f"models of --compile-ratio, any of {', '.join(RATIO_MODELS)} (default: %(default)s)")
    parser.add_argument("--ratio-repeats", type=int, default=3, metavar="N",
                        help="cold+warm process pairs per model and variant for --compile-ratio (default: %(default)s)")
    parser.add_argument("--ratio-variants", default="cpu,neuron", metavar="LIST",
                        help="variants of --compile-ratio, baseline first: cpu (CPU Inductor, torchneuron loaded), "
                             "cpu-plain (CPU Inductor without torchneuron), neuron (default backend), "
                             "neuron-backend (backend='neuron') (default: %(default)s)")


CNN_BATCH = 32
CNN_IMAGE = 32


def _cnn() -> nn.Module:
    """Return a small convolutional classifier: two conv/batch-norm/ReLU/max-pool stages and a linear head."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * (CNN_IMAGE // 4) ** 2, 10))


def training_program(name: str, gen: torch.Generator) -> tuple[nn.Module, tuple[torch.Tensor, ...], Callable]:
    """Return the CPU model, training batch and loss function of the "mlp", "cnn" or "gpt" workload.

    Args:
        name: which model.
        gen: generator the batch is drawn from (the model's weights come from the global seed).
    """
    if name == "mlp":
        return mlp_program(gen)
    if name == "cnn":
        return (_cnn(), (torch.randn(CNN_BATCH, 3, CNN_IMAGE, CNN_IMAGE, generator=gen),
                         torch.randint(0, 10, (CNN_BATCH,), generator=gen)),
                lambda m, d: F.cross_entropy(m(d[0]), d[1]))
    return gpt_program(gen)


def workloads() -> tuple[list[Workload], str | None]:
    """Return the workloads, each model built once on CPU from a fixed seed, and why GPT rows are missing if they are."""
    gen = torch.Generator().manual_seed(SEED)
    out = []
    for name in ("mlp", "cnn"):
        torch.manual_seed(SEED)
        model, batch, loss_of = training_program(name, gen)
        label = "mlp " + "-".join(map(str, MLP_SIZES)) if name == "mlp" else f"cnn {CNN_IMAGE}x{CNN_IMAGE}"
        out.append(Workload(f"{label} train b{len(batch[0])}", model, batch, True, loss_of))
        out.append(Workload(f"{label} infer b{len(batch[0])}", model, batch[:1], False))
    try:
        load_gpt()
    except ImportError as exc:
        return out, str(exc)
    shape = GPT_SHAPE
    block, vocab = shape["block_size"], shape["vocab_size"]
    gpt_name = f"gpt {shape['n_layer']}L {shape['n_head']}H {shape['n_embd']}d"
    torch.manual_seed(SEED)
    model, batch, loss_of = training_program("gpt", gen)
    out.append(Workload(f"{gpt_name} train b{GPT_TRAIN_BATCH}x{block}", model, batch, True, loss_of))
    for b in GPT_INFER_BATCHES:
        out.append(Workload(f"{gpt_name} infer b{b}x{block}", model,
                            (torch.randint(0, vocab, (b, block), generator=gen),), False))
    return out, None


def _own_code(fn: Callable) -> Callable:
    """Return fn as a function with a code object of its own.

    Dynamo keeps compiled entries per code object and checks the newest first.
    Variants sharing one (every module's ``__call__``, one lambda's code) would
    each pay for the guards of the variants compiled after them, about 10 us per
    entry (small GPT inference): a cost of the benchmark, not of either device.
    A program compiling one model has one entry, as each variant has here.
    """
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def _compile_fn(compiler: str) -> Callable[[Any], Any]:
    if compiler == "eager":
        return lambda fn: fn
    if compiler == "backend=neuron":
        return lambda fn: torch.compile(_own_code(fn), backend="neuron")
    return lambda fn: torch.compile(_own_code(fn))


def build_step(work: Workload, device: torch.device, compiler: str, optimizer_kwargs: dict[str, Any]) -> Fn:
    """Return one step of a workload on a device, compiled by compiler, already run once (compiled).

    Args:
        work: the workload.
        device: where the model and batch live.
        compiler: "eager", "inductor" or "backend=neuron".
        optimizer_kwargs: AdamW arguments selecting its implementation.
    """
    compile_ = _compile_fn(compiler)
    replica = copy.deepcopy(work.model).to(device)
    data = tuple(t.to(device) for t in work.batch)
    if work.train:
        replica.train()
        opt = torch.optim.AdamW(replica.parameters(), lr=1e-3, **optimizer_kwargs)
        run = compile_(lambda *args: replica(*args))
        opt_step = compile_(lambda: opt.step())

        def step() -> None:
            loss = work.loss_of(run, data)
            loss.backward()
            opt_step()
            opt.zero_grad(set_to_none=True)
    else:
        replica.eval()
        run = compile_(lambda *args: replica(*args))

        def step() -> None:
            with torch.no_grad():
                run(*data)
    step()
    return step


def measure_workload(work: Workload, variants: list[tuple[str, str]], rounds: int, warmup: int, round_ms: float,
                     optimizer_kwargs: dict[str, Any]
                     ) -> tuple[int, dict[tuple[str, str], list[float]], dict[tuple[str, str], str]]:
    """Time every variant of a workload in interleaved rounds.

    Returns the calls per round, the per-call ns of each round of each variant
    that could be built, and the error of each variant that could not.

    Args:
        work: the workload.
        variants: (device, compiler) pairs.
        rounds: timed rounds.
        warmup: untimed rounds before them.
        round_ms: wanted length of one round of the first variant.
        optimizer_kwargs: AdamW arguments.
    """
    errors: dict[tuple[str, str], str] = {}
    built: list[tuple[str, str]] = []
    fns: list[Fn] = []
    for d, c in variants:
        try:
            fns.append(build_step(work, torch.device(d), c, optimizer_kwargs))
            built.append((d, c))
        except Exception as exc:  # noqa: BLE001 - report the variant as skipped, keep the others
            errors[(d, c)] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            torch._dynamo.reset()
    if not fns:
        return 0, {}, errors
    variants = built
    syncs = [synchronizer(d) for d, _ in variants]
    for fn, sync in zip(fns, syncs):
        time_round(fn, 1, sync)
    inner = calibrate(fns[0], syncs[0], round_ms * 1e6)
    samples: dict[tuple[str, str], list[float]] = {v: [] for v in variants}
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        order = random.Random(0)
        for r in range(warmup + rounds):
            # A new order every round: a variant run right after another (an eager one, whose
            # allocations and cache traffic linger) would otherwise always follow the same one.
            for i in order.sample(range(len(variants)), len(variants)):
                per_call = time_round(fns[i], inner, syncs[i])
                if r >= warmup:
                    samples[variants[i]].append(per_call)
    finally:
        if was_enabled:
            gc.enable()
    return inner, samples, errors


def _ratio(a: list[float], b: list[float]) -> float:
    """Median over rounds of b / a."""
    return statistics.median(y / x for x, y in zip(a, b))


def speedup_table(rows: list[tuple[str, dict[str, float]]], columns: list[str]) -> str:
    """Render compiled-over-eager speed-ups (median over rounds of eager time / compiled time).

    Args:
        rows: (workload name, {column: speed-up}).
        columns: column names in order.
    """
    table = [["case", *columns]]
    for name, values in rows:
        table.append([name, *(f"{values[c]:.2f}x" if c in values else "-" for c in columns)])
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines = ["speed-up of compiled over eager on the same device (median over rounds of eager / compiled time)"]
    for j, r in enumerate(table):
        lines.append("  ".join([r[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(r[1:], widths[1:]))]).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


_COMPILE_PROGRAM = textwrap.dedent("""
    import json, sys, time
    import torch, torch.nn.functional as F
    import torch._dynamo, torch._inductor.compile_fx  # imported before timing: the figure is compile time only
    device, backend, model_name = sys.argv[1], sys.argv[2], sys.argv[3]
    sys.path.append({root!r})
    from benchmarks.bench_compile import training_program
    torch.set_num_threads({threads})
    torch.manual_seed(0)
    model, data, loss_of = training_program(model_name, torch.Generator().manual_seed(0))
    model = model.to(device)
    data = tuple(t.to(device) for t in data)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    run = torch.compile(model, backend=backend)
    opt_step = torch.compile(lambda: opt.step(), backend=backend)
    def step():
        loss = loss_of(run, data); loss.backward(); opt_step(); opt.zero_grad(set_to_none=True)
    start = time.perf_counter(); step(); step(); first = time.perf_counter() - start
    start = time.perf_counter(); step(); step(); steady = time.perf_counter() - start
    blocks = []  # the compiled step in a process of its own: effects a shared process would hide
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(5):
            step()
        torch.accelerator.synchronize() if device != "cpu" else None
        blocks.append((time.perf_counter() - start) / 5)
    from torch._dynamo.utils import counters
    print(json.dumps({{"seconds": first - steady, "fx_hits": counters["inductor"]["fxgraph_cache_hit"],
                      "fx_misses": counters["inductor"]["fxgraph_cache_miss"],
                      "step_ms": sorted(blocks)[len(blocks) // 2] * 1e3}}))
""")


def compile_times(threads: int, models: list[str], log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Measure cold and warm compile times of training steps in fresh processes.

    Cold: an empty cache directory. Warm: a new process reusing the directory the
    cold run filled (PyTorch's FX graph, AOTAutograd and kernel caches).

    Args:
        threads: torch.set_num_threads value in the child processes.
        models: any of "mlp", "cnn" and "gpt".
        log: receives one progress line per run.
    """
    program = _COMPILE_PROGRAM.format(root=str(REPO_ROOT), threads=threads)
    rows = []
    for model_name in models:
        for device, backend in (("cpu", "inductor"), ("neuron", "inductor"), ("neuron", "neuron")):
            row: dict[str, Any] = {"model": model_name, "device": device, "backend": backend}
            with tempfile.TemporaryDirectory(prefix="bench_compile_cache_") as cache:
                env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TORCHNEURON_CACHE_DIR=cache)
                for phase in ("cold", "warm"):
                    proc = subprocess.run([sys.executable, "-c", program, device, backend, model_name],
                                          capture_output=True, text=True, env=env, timeout=3600)
                    if proc.returncode != 0:
                        errors = [ln for ln in proc.stderr.splitlines() if "Error" in ln or "error" in ln]
                        row["error"] = (errors or proc.stderr.strip().splitlines() or ["failed"])[-1].strip()
                        break
                    row[phase] = json.loads(proc.stdout.strip().splitlines()[-1])
            rows.append(row)
            cold, warm = row.get("cold") or {}, row.get("warm") or {}
            log(f"  compile {model_name} on {device}, backend={backend}: cold {cold.get('seconds', float('nan')):.1f} s, "
                f"warm {warm.get('seconds', float('nan')):.1f} s")
    return rows


def format_compile_times(rows: list[dict[str, Any]]) -> str:
    """Render the cold/warm compile time rows as a table."""
    header = ["training step compile", "cold", "warm", "warm/cold", "warm FX cache hits/misses",
              "step in own process", "/ CPU"]
    table = [header]
    cpu_step = {row["model"]: (row.get("warm") or {}).get("step_ms") for row in rows if row["device"] == "cpu"}
    for row in rows:
        name = f"{row['model']} on {row['device']}, backend={row['backend']}"
        cold, warm = row.get("cold"), row.get("warm")
        if not cold or not warm:
            table.append([name, "-", "-", "-", row.get("error", "failed"), "-", "-"])
            continue
        base = cpu_step.get(row["model"])
        table.append([name, f"{cold['seconds']:.1f} s", f"{warm['seconds']:.1f} s",
                      f"{warm['seconds'] / cold['seconds']:.2f}", f"{warm['fx_hits']}/{warm['fx_misses']}",
                      f"{warm['step_ms']:.2f} ms", f"{warm['step_ms'] / base:.2f}" if base else "-"])
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = ["compile time of two training steps (forward, backward, AdamW step) in a fresh process, "
             "minus two steady steps; then the median step time in that (warm) process, alone on the machine"]
    for j, r in enumerate(table):
        lines.append("  ".join([r[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(r[1:], widths[1:]))]).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


RATIO_MODELS = ("gpt", "llama", "bert")

# A fresh process compiles one model's forward+backward once. Everything it imports (torch, Dynamo, Inductor's
# compile_fx, transformers, the model) loads before the clock starts; the figure is the first call's time minus
# a compiled call's. The model file of the demo GPT is loaded by path, so "cpu-plain" imports no torchneuron.
_RATIO_PROGRAM = textwrap.dedent("""
    import importlib.util, json, resource, sys, time
    import torch
    import torch._dynamo, torch._inductor.compile_fx
    device, backend, name, gpt_path = sys.argv[1:5]
    torch.set_num_threads({threads})
    torch.manual_seed(0)
    if name == "gpt":
        spec = importlib.util.spec_from_file_location("_ratio_gpt", gpt_path)
        gpt = importlib.util.module_from_spec(spec); sys.modules[spec.name] = gpt; spec.loader.exec_module(gpt)
        model = gpt.GPT(gpt.GPTConfig(**{gpt_shape!r}))
        tokens = torch.randint(0, {gpt_vocab}, ({gpt_batch}, {gpt_block} + 1))
        data = (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
        loss_of = lambda m, d: m(d[0], d[1])[1]
    elif name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        model = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             max_position_embeddings=128))
        data = (torch.randint(0, 256, (4, 32)),)
        loss_of = lambda m, d: m(input_ids=d[0], labels=d[0]).loss
    elif name == "bert":
        from transformers import BertConfig, BertForSequenceClassification
        model = BertForSequenceClassification(BertConfig(vocab_size=256, hidden_size=128, intermediate_size=256,
                                                         num_hidden_layers=2, num_attention_heads=4,
                                                         max_position_embeddings=128))
        data = (torch.randint(0, 256, (4, 32)), torch.randint(0, 2, (4,)))
        loss_of = lambda m, d: m(input_ids=d[0], labels=d[1]).loss
    else:
        raise ValueError(f"unknown model {{name!r}}")
    model = model.to(device).train()
    data = tuple(t.to(device) for t in data)
    run = torch.compile(model, backend=backend)
    def step():
        loss_of(run, data).backward()
        torch.accelerator.synchronize() if device != "cpu" else None
    def clocks():  # wall time; CPU time of this process and of the children it waited for (compilers, probes)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.perf_counter(), time.process_time() + children.ru_utime + children.ru_stime
    def timed():
        wall, cpu = clocks(); step(); wall_end, cpu_end = clocks()
        return wall_end - wall, cpu_end - cpu
    first, first_cpu = timed()
    steady, steady_cpu = timed()
    from torch._dynamo.utils import counters
    inductor, aot = counters["inductor"], counters["aot_autograd"]
    print(json.dumps({{"seconds": first - steady, "cpu_seconds": first_cpu - steady_cpu,
                      "frames": counters["frames"]["ok"],
                      "fx_hits": inductor["fxgraph_cache_hit"], "fx_misses": inductor["fxgraph_cache_miss"],
                      "fx_bypass": inductor["fxgraph_cache_bypass"], "aot_hits": aot["autograd_cache_hit"],
                      "aot_misses": aot["autograd_cache_miss"], "aot_bypass": aot["autograd_cache_bypass"],
                      "torchneuron": getattr(sys.modules.get("torchneuron"), "__file__", None)}}))
""")

# variant -> (device, backend, extra environment)
RATIO_VARIANTS: dict[str, tuple[str, str, dict[str, str]]] = {
    "cpu": ("cpu", "inductor", {}),
    "cpu-plain": ("cpu", "inductor", {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}),
    "neuron": ("neuron", "inductor", {}),
    "neuron-backend": ("neuron", "neuron", {}),
}


def compile_ratios(models: list[str], variants: list[str], repeats: int, threads: int,
                   log: Callable[[str], None]) -> dict[str, Any]:
    """Cold and warm compile times of a forward+backward, each variant in fresh processes, and their ratios.

    Every repeat runs, per model, each variant in a new random order: a process on an empty
    ``TORCHINDUCTOR_CACHE_DIR`` (cold), then one on the directory it filled (warm). Ratios are
    variant / first variant, as the median of the per-repeat ratios.

    Args:
        models: names in RATIO_MODELS.
        variants: names in RATIO_VARIANTS, the baseline first.
        repeats: cold+warm pairs per model and variant.
        threads: torch.set_num_threads value in the child processes.
        log: receives one progress line per pair.
    """
    from benchmarks.bench_models import GPT_SHAPE, GPT_TRAIN_BATCH

    program = _RATIO_PROGRAM.format(threads=threads, gpt_shape=GPT_SHAPE, gpt_vocab=GPT_SHAPE["vocab_size"],
                                    gpt_batch=GPT_TRAIN_BATCH, gpt_block=GPT_SHAPE["block_size"])
    gpt_path = str(Path(load_gpt().__file__).resolve())
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {m: {v: [] for v in variants} for m in models}
    order = random.Random(1)
    for r in range(repeats):
        for model_name in models:
            for variant in order.sample(variants, len(variants)):
                device, backend, extra = RATIO_VARIANTS[variant]
                pair: dict[str, Any] = {}
                with tempfile.TemporaryDirectory(prefix="bench_compile_ratio_") as cache:
                    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, **extra)
                    env.pop("TORCHNEURON_CACHE_DIR", None)
                    for phase in ("cold", "warm"):
                        # cwd: the cache directory, so the child imports torchneuron as PYTHONPATH or the
                        # installed package says, not from the directory the benchmark was started in
                        proc = subprocess.run([sys.executable, "-c", program, device, backend, model_name, gpt_path],
                                              capture_output=True, text=True, env=env, timeout=3600, cwd=cache)
                        if proc.returncode != 0:
                            lines = proc.stderr.strip().splitlines() or ["failed"]
                            raise RuntimeError(f"{model_name} {variant} {phase}: {lines[-1]}")
                        pair[phase] = json.loads(proc.stdout.strip().splitlines()[-1])
                runs[model_name][variant].append(pair)
                log(f"  [{r + 1}/{repeats}] {model_name} {variant}: cold {pair['cold']['seconds']:.1f} s "
                    f"(CPU {pair['cold']['cpu_seconds']:.1f} s), warm {pair['warm']['seconds']:.2f} s "
                    f"(CPU {pair['warm']['cpu_seconds']:.2f} s) (warm FX hits {pair['warm']['fx_hits']}, "
                    f"AOT hits {pair['warm']['aot_hits']})")
    return {"models": models, "variants": variants, "repeats": repeats, "threads": threads, "runs": runs}


def format_compile_ratios(result: dict[str, Any]) -> str:
    """Render :func:`compile_ratios` as a table: median cold and warm times per variant and ratios to the baseline,
    in wall time and in CPU time (the process's and its compilers'; steadier than wall time on a busy machine)."""
    variants = result["variants"]
    base = variants[0]
    header = ["model", "variant", "cold wall", "warm wall", "cold CPU", "warm CPU",
              "cold / " + base + " (wall, CPU)", "warm / " + base + " (wall, CPU)", "warm FX/AOT hits"]
    table = [header]
    for model_name in result["models"]:
        runs = result["runs"][model_name]
        for variant in variants:
            pairs = runs[variant]
            cells = []
            for key in ("seconds", "cpu_seconds"):
                for phase in ("cold", "warm"):
                    digits = 1 if phase == "cold" else 2
                    cells.append(f"{statistics.median(p[phase][key] for p in pairs):.{digits}f} s")
            ratios = ["-", "-"]
            if variant != base:
                for i, phase in enumerate(("cold", "warm")):
                    ratios[i] = ", ".join(
                        f"{statistics.median(p[phase][key] / b[phase][key] for p, b in zip(pairs, runs[base])):.2f}"
                        for key in ("seconds", "cpu_seconds"))
            hits = pairs[-1]["warm"]
            table.append([model_name, variant, *cells, *ratios, f"{hits['fx_hits']}/{hits['aot_hits']}"])
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = [f"compile time of one forward+backward in a fresh process (first call minus a compiled call), "
             f"cold: empty cache directory, warm: the directory the cold process filled; medians over "
             f"{result['repeats']} interleaved repeats, ratios = median of per-repeat ratios; "
             f"threads {result['threads']}, torch {torch.__version__}"]
    for j, r in enumerate(table):
        lines.append("  ".join([r[0].ljust(widths[0]), r[1].ljust(widths[1]),
                                *(c.rjust(w) for c, w in zip(r[2:], widths[2:]))]).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


SUITE = Suite(
    name="compile",
    description="torch.compile: MLP, CNN and GPT training steps and inference; eager, default backend and backend=neuron",
    build_cases=lambda args: [],
    default_threads=2,
    default_rounds=20,
    add_arguments=add_arguments,
)


def main(argv: list[str] | None = None) -> int:
    """Run the compile benchmark, print its tables, write its JSON and return the exit status.

    Args:
        argv: arguments without the program name; None reads sys.argv.
    """
    args = make_parser(SUITE.description, [SUITE]).parse_args(argv)
    devices = parse_devices(args.devices)
    require_devices(devices)
    base, other = devices
    labels = device_labels(devices)
    threads = args.threads or SUITE.default_threads
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else SUITE.default_rounds)
    warmup = args.warmup if args.warmup is not None else (QUICK_WARMUP if args.quick else DEFAULT_WARMUP)
    round_ms = args.round_ms or (QUICK_ROUND_MS if args.quick else DEFAULT_ROUND_MS)
    torch.set_num_threads(threads)
    # Every compiled module shares Dynamo's wrapper code object: allow one cache entry per variant.
    torch._dynamo.config.recompile_limit = 256
    torch._dynamo.config.accumulated_recompile_limit = 4096
    optimizer_kwargs = OPTIMIZER_IMPLS[args.optimizer_impl]
    if args.compile_ratio:
        return _main_compile_ratio(args, threads)

    variants = [(base, "eager"), (base, "inductor"), (other, "eager"), (other, "inductor")]
    if torch.device(other).type == "neuron":
        variants.append((other, "backend=neuron"))
    works, gpt_skip = workloads()
    if args.filter:
        works = [w for w in works if args.filter in w.name]
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    log(f"[compile] {len(works)} workloads x {len(variants)} variants on {labels[0]} and {labels[1]}, "
        f"threads {threads}")
    busy = busy_cpus()
    if busy is not None and busy > 0.5:
        log(f"warning: other processes keep {busy:.1f} of {os.cpu_count()} CPUs busy; timings will be noisy")

    results: list[Result] = []
    speedups: list[tuple[str, dict[str, float]]] = []
    raw: dict[str, Any] = {}
    for work in works:
        torch._dynamo.reset()  # the previous workload's compiled code is not needed any more
        started = time.perf_counter()
        inner, samples, errors = measure_workload(work, variants, rounds, warmup, round_ms, optimizer_kwargs)
        raw[work.name] = {f"{d} {c}": s for (d, c), s in samples.items()}
        for compiler in COMPILERS:
            pair = [(base, "eager" if compiler == "eager" else "inductor"), (other, compiler)]
            if pair[1] not in samples and pair[1] not in errors:
                continue
            target = EAGER_TARGET if compiler == "eager" else COMPILED_TARGET
            failed = [f"{d} {c}: {errors[(d, c)]}" for d, c in pair if (d, c) in errors]
            case = Case(f"{work.name} | {compiler}", lambda device: None, target, skip="; ".join(failed) or None)
            results.append(Result(case, labels, inner, [] if failed else [samples[pair[0]], samples[pair[1]]]))
        ups = {}
        for device, label, compiler in ((base, labels[0], "inductor"), (other, labels[1], "inductor"),
                                        (other, labels[1], "backend=neuron")):
            if (device, "eager") in samples and (device, compiler) in samples:
                ups[f"{label} {compiler}"] = 1 / _ratio(samples[(device, "eager")], samples[(device, compiler)])
        speedups.append((work.name, ups))
        medians = "  ".join(f"{d} {c} {statistics.median(s) / 1e6:.2f} ms" for (d, c), s in samples.items())
        log(f"  {work.name}: {medians}  ({time.perf_counter() - started:.0f} s)")

    title = (f"{SUITE.name}: {SUITE.description}\n"
             f"devices {labels[0]} vs {labels[1]}, threads {torch.get_num_threads()}, rounds {rounds} "
             f"(+{warmup} warmup), all variants of a workload interleaved, torch {torch.__version__}\n"
             f"rows '| backend=neuron' compare {labels[1]} backend=neuron with {labels[0]} default backend")
    print(format_table(results, labels, title), flush=True)
    if gpt_skip:
        print(f"gpt rows skipped: {gpt_skip}")
    print()
    columns = [f"{labels[0]} inductor", f"{labels[1]} inductor", f"{labels[1]} backend=neuron"]
    print(speedup_table(speedups, columns), flush=True)

    times: list[dict[str, Any]] = []
    if args.compile_times and torch.device(other).type == "neuron":
        models = [m for m in ("mlp", "cnn", "gpt") if not args.filter or args.filter in m or
                  any(args.filter in w.name and w.name.startswith(m) for w in works)]
        log("")
        times = compile_times(threads, models, log)
        print()
        print(format_compile_times(times), flush=True)

    if not args.no_json:
        path = getattr(args, "json", None) or args.json_dir / f"{SUITE.name}.json"
        settings = {"devices": list(devices), "labels": list(labels), "threads": torch.get_num_threads(),
                    "rounds": rounds, "warmup": warmup, "round_ms": round_ms, "quick": args.quick,
                    "filter": args.filter, "argv": sys.argv, "busy_cpus_before_run": busy,
                    "optimizer_impl": args.optimizer_impl}
        write_json(path, SUITE, results, settings)
        payload = json.loads(path.read_text())
        payload["speedups"] = {name: ups for name, ups in speedups}
        payload["variant_rounds_ns"] = raw
        payload["compile_times"] = times
        path.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"results written to {_display_path(path)}", flush=True)
    failed = any(r.ok is False for r in results)
    return 1 if failed and args.strict else 0


def _main_compile_ratio(args: argparse.Namespace, threads: int) -> int:
    """``--compile-ratio``: run :func:`compile_ratios`, print its table and write its JSON."""
    models = [m for m in args.ratio_models.split(",") if m]
    variants = [v for v in args.ratio_variants.split(",") if v]
    unknown = [m for m in models if m not in RATIO_MODELS] + [v for v in variants if v not in RATIO_VARIANTS]
    if unknown or len(variants) < 2:
        raise ValueError(f"--compile-ratio: unknown models/variants {unknown} or fewer than two variants")
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    busy = busy_cpus()
    if busy is not None and busy > 0.5:
        log(f"warning: other processes keep {busy:.1f} of {os.cpu_count()} CPUs busy; timings will be noisy")
    log(f"[compile-ratio] models {models}, variants {variants}, {args.ratio_repeats} repeats, threads {threads}")
    result = compile_ratios(models, variants, args.ratio_repeats, threads, log)
    used = sorted({p[phase]["torchneuron"] or "not imported" for runs in result["runs"].values()
                   for pairs in runs.values() for p in pairs for phase in ("cold", "warm")})
    print(f"torchneuron in the compiling processes: {', '.join(used)}")
    print(format_compile_ratios(result), flush=True)
    if not args.no_json:
        path = getattr(args, "json", None) or args.json_dir / "compile_ratio.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**result, "torch": torch.__version__, "busy_cpus_before_run": busy,
                                    "argv": sys.argv},
                                   indent=2) + "\n")
        print(f"results written to {_display_path(path)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
