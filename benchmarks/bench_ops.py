"""Operator latency: small ops on 16-element tensors, a width-32 layer's ops and large ops, neuron versus CPU."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
    _root = str(Path(__file__).resolve().parent.parent)
    if _root not in sys.path:
        sys.path.append(_root)

import torch
import torch.nn.functional as F

from benchmarks.common import Case, Fn, Suite, main as run_main

SMALL_TARGET = 1.5
LARGE_TARGET = 1.05
SMALL_NUMEL = 16


def _small(op):
    """Return a setup that times op on two seeded 16-element float32 tensors.

    Args:
        op: function of (x, y) to time.
    """
    def setup(device: torch.device) -> Fn:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(SMALL_NUMEL, generator=gen).to(device)
        y = torch.randn(SMALL_NUMEL, generator=gen).to(device)
        return lambda: op(x, y)
    return setup


def _layer(op):
    """Return a setup that times op on a small layer's seeded float32 tensors, as a model of width 32
    runs them: activations a (16 x 32), weight w (32 x 32), bias b and norm weight g (32), attention
    q (1 x 2 x 8 x 16), indices i (16).

    Args:
        op: function of a dict of those tensors to time.
    """
    def setup(device: torch.device) -> Fn:
        gen = torch.Generator().manual_seed(0)
        t = {"a": torch.randn(16, 32, generator=gen), "w": torch.randn(32, 32, generator=gen),
             "b": torch.randn(32, generator=gen), "g": torch.randn(32, generator=gen),
             "q": torch.randn(1, 2, 8, 16, generator=gen), "i": torch.randint(0, 32, (16,), generator=gen)}
        t = {k: v.to(device) for k, v in t.items()}
        return lambda: op(t)
    return setup


def _matmul(n: int):
    """Return a setup that times an n x n float32 matrix product.

    Args:
        n: matrix size.
    """
    def setup(device: torch.device) -> Fn:
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(n, n, generator=gen).to(device)
        b = torch.randn(n, n, generator=gen).to(device)
        return lambda: a @ b
    return setup


def _conv2d(batch: int, channels: int, size: int, kernel: int):
    """Return a setup that times a same-padded float32 2-d convolution with bias.

    Args:
        batch: batch size.
        channels: input and output channels.
        size: height and width of the input.
        kernel: kernel height and width.
    """
    def setup(device: torch.device) -> Fn:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(batch, channels, size, size, generator=gen).to(device)
        w = (torch.randn(channels, channels, kernel, kernel, generator=gen) * 0.05).to(device)
        b = torch.randn(channels, generator=gen).to(device)
        return lambda: F.conv2d(x, w, b, padding=kernel // 2)
    return setup


def _random(op, numel: int):
    """Return a setup that times a random op on a seeded float32 tensor of numel elements.

    Args:
        op: function of (x) to time; it draws from the device's default generator.
        numel: elements of x.
    """
    def setup(device: torch.device) -> Fn:
        x = torch.randn(numel, generator=torch.Generator().manual_seed(0)).to(device)
        return lambda: op(x)
    return setup


def build_cases(args: argparse.Namespace) -> list[Case]:
    """Return the operator cases.

    Args:
        args: parsed options (unused).
    """
    return [
        Case("add x + y", _small(lambda x, y: x + y), SMALL_TARGET),
        Case("mul x * y", _small(lambda x, y: x * y), SMALL_TARGET),
        Case("view x.view(4, 4)", _small(lambda x, y: x.view(4, 4)), SMALL_TARGET),
        Case("index x[3]", _small(lambda x, y: x[3]), SMALL_TARGET),
        Case("slice x[2:5]", _small(lambda x, y: x[2:5]), SMALL_TARGET),
        Case("sum x.sum()", _small(lambda x, y: x.sum()), SMALL_TARGET),
        Case("mm 16x32 @ 32x32", _layer(lambda t: torch.mm(t["a"], t["w"])), SMALL_TARGET),
        Case("linear 16x32, bias (addmm)", _layer(lambda t: F.linear(t["a"], t["w"], t["b"])), SMALL_TARGET),
        Case("layer_norm 16x32", _layer(lambda t: F.layer_norm(t["a"], (32,), t["g"], t["b"])), SMALL_TARGET),
        Case("softmax 16x32", _layer(lambda t: torch.softmax(t["a"], -1)), SMALL_TARGET),
        Case("sdpa 1x2x8x16", _layer(lambda t: F.scaled_dot_product_attention(t["q"], t["q"], t["q"])),
             SMALL_TARGET),
        Case("embedding 16 of 32x32", _layer(lambda t: F.embedding(t["i"], t["w"])), SMALL_TARGET),
        Case("cat 2 x 16x32", _layer(lambda t: torch.cat([t["a"], t["a"]])), SMALL_TARGET),
        Case("matmul 1024x1024", _matmul(1024), LARGE_TARGET),
        Case("conv2d 8x64x56x56 k3 p1", _conv2d(8, 64, 56, 3), LARGE_TARGET),
        Case("randn 1M", _random(lambda x: torch.randn(x.shape, device=x.device), 1 << 20), LARGE_TARGET),
        Case("rand 1M", _random(lambda x: torch.rand(x.shape, device=x.device), 1 << 20), LARGE_TARGET),
        Case("dropout p=0.1 1M", _random(lambda x: F.dropout(x, 0.1, training=True), 1 << 20), LARGE_TARGET),
    ]


SUITE = Suite(
    name="ops",
    description="operator latency: small ops on 16-element float32 tensors, a small layer's ops, large matmul and conv2d, random ops",
    build_cases=build_cases,
    default_threads=1,
    default_rounds=30,
)


def main(argv: list[str] | None = None) -> int:
    """Run the operator suite and return the exit status.

    Args:
        argv: arguments without the program name; None reads sys.argv.
    """
    return run_main([SUITE], argv)


if __name__ == "__main__":
    sys.exit(main())
