"""What each instruction costs: the engine it runs on and the work it does there, charged to the kernel
being run (its time per generation: :func:`_hardware.instruction_seconds`). Used by ``nl`` and ``nisa``
alike; not part of either's namespace."""

from __future__ import annotations

import math

import torch

from ._run import run


def _free(shape) -> int:
    return math.prod(shape[1:]) if len(shape) > 1 else 1


def charge_vector(name: str, shape, inputs: int, dtype: torch.dtype, engine: str = "VectorE") -> None:
    """VectorE/GpSimd: ~N cycles per input tile of N elements per partition, plus a static overhead."""
    run().charge(name, engine, (inputs * _free(shape), dtype in (torch.bfloat16, torch.float16)))


def charge_scalar(name: str, shape) -> None:
    """ScalarE: one element per partition per cycle, plus the static overhead."""
    run().charge(name, "ScalarE", (_free(shape),))


def charge_dma(name: str, nbytes: int) -> None:
    """The DMA queues: the bytes over the core's share of HBM bandwidth."""
    run().charge(name, "DMA", (nbytes,))


def charge_tensor(name: str, rows: int, rate: str) -> None:
    """TensorE: ``rows`` (the moving operand's free size, or a transpose's partitions) at ``rate``
    ("fp32", "fp8", "16bit")."""
    run().charge(name, "TensorE", (rows, rate))
