"""Recurrent networks: LSTM and GRU training steps and no-grad inference, neuron versus CPU.

The shapes of pytorch/examples' word_language_model (2 layers, 200 units, a
sequence of 35 steps, batch 20; embedding and decoder left out, so the
recurrent layers dominate), one bidirectional LSTM over packed sequences, and
a small no-grad LSTM at batch 1. Neuron runs the CPU's own path (oneDNN's LSTM
layer, the GRU's op-by-op composite; ``csrc/aten/rnn.cpp``), so each ratio is
that path's cost on device memory.

    python benchmarks/bench_rnn.py            # default rounds, 2 threads
    python benchmarks/bench_rnn.py --quick
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

if __package__ in (None, ""):
    _root = str(Path(__file__).resolve().parent.parent)
    if _root not in sys.path:
        sys.path.append(_root)

import torch
from torch.nn.utils.rnn import pack_padded_sequence

from benchmarks.common import Case, Fn, Suite, main as run_main

TARGET = 1.05
SEED = 0
SEQ, BATCH, SIZE, LAYERS = 35, 20, 200, 2  # word_language_model's defaults


def _train_step(make, x: torch.Tensor, lengths: torch.Tensor | None = None):
    """A setup timing one SGD training step of the network `make()` on input `x` (packed if `lengths`)."""
    torch.manual_seed(SEED)
    model = make()

    def setup(device: torch.device) -> Fn:
        replica = copy.deepcopy(model).to(device).train()
        opt = torch.optim.SGD(replica.parameters(), lr=0.1, foreach=False)
        xd = x.to(device)

        def step() -> None:
            inp = xd if lengths is None else pack_padded_sequence(xd, lengths)
            out, _ = replica(inp)
            (out if lengths is None else out.data).pow(2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step
    return setup


def _infer(make, x: torch.Tensor):
    """A setup timing one no-grad forward pass of `make()` on `x`."""
    torch.manual_seed(SEED)
    model = make()

    def setup(device: torch.device) -> Fn:
        replica = copy.deepcopy(model).to(device).eval()
        xd = x.to(device)

        def step() -> None:
            with torch.no_grad():
                replica(xd)
        return step
    return setup


def build_cases(args) -> list[Case]:
    """Return the RNN cases, their inputs drawn once on the CPU."""
    gen = torch.Generator().manual_seed(SEED)
    x = torch.randn(SEQ, BATCH, SIZE, generator=gen)
    lengths = torch.linspace(SEQ, 5, BATCH).round().long()
    small = torch.randn(16, 1, 64, generator=gen)
    return [
        Case(f"lstm {LAYERS}x{SIZE} train seq{SEQ} b{BATCH}", _train_step(lambda: torch.nn.LSTM(SIZE, SIZE, LAYERS), x),
             TARGET),
        Case(f"gru {LAYERS}x{SIZE} train seq{SEQ} b{BATCH}", _train_step(lambda: torch.nn.GRU(SIZE, SIZE, LAYERS), x),
             TARGET),
        Case(f"lstm bidir packed train seq{SEQ} b{BATCH}",
             _train_step(lambda: torch.nn.LSTM(SIZE, SIZE, bidirectional=True), x, lengths), TARGET),
        Case(f"lstm {LAYERS}x{SIZE} no-grad seq{SEQ} b{BATCH}", _infer(lambda: torch.nn.LSTM(SIZE, SIZE, LAYERS), x),
             TARGET),
        Case("lstm 1x64 no-grad seq16 b1", _infer(lambda: torch.nn.LSTM(64, 64), small), TARGET),
    ]


SUITE = Suite(
    name="rnn",
    description="recurrent networks: LSTM and GRU training steps (word_language_model's shapes), no-grad LSTM",
    build_cases=build_cases,
    default_threads=2,
    default_rounds=20,
)


def main(argv: list[str] | None = None) -> int:
    """Run the RNN suite and return the exit status.

    Args:
        argv: arguments without the program name; None reads sys.argv.
    """
    return run_main([SUITE], argv)


if __name__ == "__main__":
    sys.exit(main())
