"""Model steps: MLP and small-GPT training steps and GPT inference, neuron versus CPU."""

from __future__ import annotations

import argparse
import copy
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

if __package__ in (None, ""):
    _root = str(Path(__file__).resolve().parent.parent)
    if _root not in sys.path:
        sys.path.append(_root)

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.common import REPO_ROOT, Case, Fn, Suite, main as run_main

TARGET = 1.05
SEED = 0

MLP_SIZES = (784, 1024, 1024, 10)
MLP_BATCH = 64

GPT_SHAPE = dict(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.0)
GPT_TRAIN_BATCH = 16
GPT_INFER_BATCHES = (1, 32)

OPTIMIZER_IMPLS: dict[str, dict[str, Any]] = {
    "for-loop": {"foreach": False},
    "foreach": {"foreach": True},
    "fused": {"fused": True},
    "default": {},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the model suite's options.

    Args:
        parser: parser to extend.
    """
    parser.add_argument("--optimizer-impl", choices=sorted(OPTIMIZER_IMPLS), default="for-loop",
                        help="AdamW implementation used on both devices (default: %(default)s); "
                             "'default' lets PyTorch choose per device, which differs between cpu and neuron")


def load_gpt() -> ModuleType:
    """Return the torchneuron.models.gpt module, loading the source file directly if the package cannot import."""
    try:
        from torchneuron.models import gpt
        return gpt
    except Exception as exc:  # noqa: BLE001 - an unbuilt extension can raise more than ImportError
        path = REPO_ROOT / "torchneuron" / "models" / "gpt.py"
        if not path.is_file():
            raise ImportError(f"torchneuron.models.gpt is not importable ({exc})") from exc
        spec = importlib.util.spec_from_file_location("_bench_gpt", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module


def _mlp() -> nn.Module:
    """Return the MLP with layer sizes MLP_SIZES and ReLU between layers."""
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(zip(MLP_SIZES, MLP_SIZES[1:])):
        if i:
            layers.append(nn.ReLU())
        layers.append(nn.Linear(n_in, n_out))
    return nn.Sequential(*layers)


Program = tuple[nn.Module, tuple[torch.Tensor, ...], Callable[[Any, tuple], torch.Tensor]]


def mlp_program(gen: torch.Generator) -> Program:
    """Return the MLP (weights from the global seed), a training batch drawn from gen, and its loss function."""
    return (_mlp(), (torch.randn(MLP_BATCH, MLP_SIZES[0], generator=gen),
                     torch.randint(0, MLP_SIZES[-1], (MLP_BATCH,), generator=gen)),
            lambda m, d: F.cross_entropy(m(d[0]), d[1]))


def gpt_program(gen: torch.Generator) -> Program:
    """Return the GPT (weights from the global seed), a training batch of tokens drawn from gen, and its loss."""
    gpt = load_gpt()
    model = gpt.GPT(gpt.GPTConfig(**GPT_SHAPE))
    tokens = torch.randint(0, GPT_SHAPE["vocab_size"], (GPT_TRAIN_BATCH, GPT_SHAPE["block_size"] + 1), generator=gen)
    return model, (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()), lambda m, d: m(d[0], d[1])[1]


def _train_step(model: nn.Module, loss_fn: Callable[[nn.Module], torch.Tensor],
                optimizer_kwargs: dict[str, Any]) -> Callable[[torch.device], Fn]:
    """Return a setup that copies model to a device and times one training step there.

    Args:
        model: CPU model; each device gets its own deep copy.
        loss_fn: given a device, returns the function computing a batch's loss from the model copy.
        optimizer_kwargs: extra AdamW arguments selecting its implementation.
    """
    def setup(device: torch.device) -> Fn:
        replica = copy.deepcopy(model).to(device).train()
        opt = torch.optim.AdamW(replica.parameters(), lr=1e-3, **optimizer_kwargs)
        batch_loss = loss_fn(device)

        def step() -> None:
            loss = batch_loss(replica)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step
    return setup


def _mlp_loss(x: torch.Tensor, y: torch.Tensor) -> Callable[[torch.device], Callable[[nn.Module], torch.Tensor]]:
    """Return, per device, the cross-entropy loss of the MLP on batch (x, y).

    Args:
        x: CPU inputs.
        y: CPU class labels.
    """
    def on(device: torch.device) -> Callable[[nn.Module], torch.Tensor]:
        xd, yd = x.to(device), y.to(device)
        return lambda m: F.cross_entropy(m(xd), yd)
    return on


def _gpt_loss(idx: torch.Tensor, targets: torch.Tensor) -> Callable[[torch.device], Callable[[nn.Module], torch.Tensor]]:
    """Return, per device, the language-model loss of the GPT on batch (idx, targets).

    Args:
        idx: CPU token ids of shape (batch, block).
        targets: CPU next-token ids of the same shape.
    """
    def on(device: torch.device) -> Callable[[nn.Module], torch.Tensor]:
        idx_d, targets_d = idx.to(device), targets.to(device)
        return lambda m: m(idx_d, targets_d)[1]
    return on


def _gpt_infer(model: nn.Module, idx: torch.Tensor) -> Callable[[torch.device], Fn]:
    """Return a setup that copies model to a device and times one no-grad forward pass there.

    Args:
        model: CPU model; each device gets its own deep copy.
        idx: CPU token ids of shape (batch, block).
    """
    def setup(device: torch.device) -> Fn:
        replica = copy.deepcopy(model).to(device).eval()
        idx_d = idx.to(device)

        def step() -> None:
            with torch.no_grad():
                replica(idx_d)
        return step
    return setup


def build_cases(args: argparse.Namespace) -> list[Case]:
    """Return the model cases, each model built once on CPU from a fixed seed.

    Args:
        args: parsed options; uses optimizer_impl.
    """
    optimizer_kwargs = OPTIMIZER_IMPLS[args.optimizer_impl]
    gen = torch.Generator().manual_seed(SEED)

    torch.manual_seed(SEED)
    mlp, (x, y), _ = mlp_program(gen)
    mlp_name = "-".join(map(str, MLP_SIZES))
    cases = [Case(f"mlp {mlp_name} train b{MLP_BATCH}",
                  _train_step(mlp, _mlp_loss(x, y), optimizer_kwargs), TARGET)]

    shape = GPT_SHAPE
    gpt_name = f"gpt {shape['n_layer']}L {shape['n_head']}H {shape['n_embd']}d"
    block, vocab = shape["block_size"], shape["vocab_size"]
    train_name = f"{gpt_name} train b{GPT_TRAIN_BATCH}x{block}"
    infer_names = [f"{gpt_name} infer b{b}x{block}" for b in GPT_INFER_BATCHES]
    try:
        load_gpt()
    except ImportError as exc:
        skip = str(exc)
        cases.append(Case(train_name, lambda device: None, TARGET, skip=skip))
        cases += [Case(name, lambda device: None, TARGET, skip=skip) for name in infer_names]
        return cases

    torch.manual_seed(SEED)
    model, (idx, targets), _ = gpt_program(gen)
    cases.append(Case(train_name, _train_step(model, _gpt_loss(idx, targets), optimizer_kwargs), TARGET))
    for name, batch in zip(infer_names, GPT_INFER_BATCHES):
        idx = torch.randint(0, vocab, (batch, block), generator=gen)
        cases.append(Case(name, _gpt_infer(model, idx), TARGET))
    return cases


SUITE = Suite(
    name="models",
    description="model steps: AdamW training steps of an MLP and a small GPT, GPT no-grad inference",
    build_cases=build_cases,
    default_threads=2,
    default_rounds=20,
    add_arguments=add_arguments,
)


def main(argv: list[str] | None = None) -> int:
    """Run the model suite and return the exit status.

    Args:
        argv: arguments without the program name; None reads sys.argv.
    """
    return run_main([SUITE], argv)


if __name__ == "__main__":
    sys.exit(main())
