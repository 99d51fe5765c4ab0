"""The NeuronCore's on-chip limits and engine rates, per generation, with their sources.

Every figure is from AWS's public NKI architecture guides in aws-neuron/aws-neuron-sdk at commit
81ce03ae261e12925e53437a0f690478e6366155 (2026-08-21):
``nki/guides/architecture/trainium_inferentia2_arch.rst`` (trn1, NeuronCore-v2),
``nki/guides/architecture/trainium2_arch.rst`` (trn2, NeuronCore-v3) and
``nki/guides/architecture/trainium3_arch.rst`` (trn3, NeuronCore-v4).
"""

from __future__ import annotations

import contextvars
import dataclasses
import os
from typing import Optional

KiB = 1024
MiB = 1024 * KiB
_SRC = "aws-neuron-sdk@81ce03a nki/guides/architecture/"


@dataclasses.dataclass(frozen=True)
class Generation:
    name: str
    sbuf_partition_bytes: int  # SBUF capacity of one partition
    psum_partition_bytes: int  # PSUM capacity of one partition
    psum_banks: int
    tensor_ghz: float
    vector_ghz: float
    scalar_ghz: float
    gpsimd_ghz: float
    vector_lanes_fp32: int  # elements per cycle over the 128 partitions, 32-bit types
    vector_lanes_16bit: int  # the same for bf16/fp16
    fp8_speedup: float  # TensorE rate of fp8 inputs against bf16
    hbm_bytes_per_s_per_core: float  # the device's HBM bandwidth shared by its NeuronCores
    sources: tuple


PMAX = 128  # partitions of SBUF and PSUM (every guide)
GEMM_STATIONARY_FMAX = 128  # TensorE's stationary operand: 128x128 (trainium_inferentia2_arch.rst, LoadStationary)
GEMM_MOVING_FMAX = 512  # its moving operand: 128x512 (MultiplyMoving); one PSUM bank holds 512 fp32 per partition
PSUM_BANK_BYTES = 2 * KiB  # 512 fp32 elements per partition per bank
MM_INIT_LATENCY_CYCLES = 64  # initiation interval floor of a matmul, TensorE cycles (NeuronCore-v2)
FP32_MATMUL_FACTOR = 4  # fp32 inputs cost ~4x bf16/fp16/tf32/fp8 on TensorE
VECTOR_STATIC_OVERHEAD_CYCLES = 100  # VectorE/ScalarE instruction overhead when instructions depend on each other

GENERATIONS = {
    # NeuronCore-v2: 24 MiB SBUF = 128 x 192 KiB, 2 MiB PSUM = 128 x 16 KiB; Tensor 2.8 GHz, Vector 1.12,
    # Scalar and GpSimd 1.4; 128 elements/cycle; device HBM 820 GB/s for 2 NeuronCores.
    "trn1": Generation("trn1", 192 * KiB, 16 * KiB, 8, 2.8, 1.12, 1.4, 1.4, 128, 128, 1.0, 820e9 / 2,
                       (_SRC + "trainium_inferentia2_arch.rst",)),
    # NeuronCore-v3: 28 MiB SBUF = 128 x 224 KiB, PSUM unchanged; Tensor 2.4 GHz (fp8 4x128 against bf16
    # 2x128 per cycle), Vector 0.96 GHz (512 bf16/fp16, 256 other elements/cycle), Scalar and GpSimd 1.2;
    # device HBM 3 TB/s for 8 NeuronCores.
    "trn2": Generation("trn2", 224 * KiB, 16 * KiB, 8, 2.4, 0.96, 1.2, 1.2, 256, 512, 2.0, 3e12 / 8,
                       (_SRC + "trainium2_arch.rst",)),
    # NeuronCore-v4: 32 MiB SBUF = 128 x 256 KiB, PSUM unchanged; Tensor 2.4 GHz, Vector 1.2 GHz (512
    # bf16/fp16/fp8, 256 other), Scalar 1.2; device HBM 4.7 TB/s for 8 NeuronCores. Its fp8 rate is for
    # MXFP8; plain fp8 is taken at the bf16 rate.
    "trn3": Generation("trn3", 256 * KiB, 16 * KiB, 8, 2.4, 1.2, 1.2, 1.2, 256, 512, 1.0, 4.7e12 / 8,
                       (_SRC + "trainium3_arch.rst",)),
}


def instruction_seconds(engine: str, work: tuple, gen: Generation) -> float:
    """What one instruction takes on ``gen``'s ``engine``, from what it does (``work``, the same on every
    generation): the cost model of ``kernel.estimate``, in one place.

    ``work`` per engine: TensorE ``(rows, rate)``, rows the moving operand's free size (a transpose: its
    partitions), rate ``"fp32"``, ``"fp8"`` or ``"16bit"``: max(rows, 64) cycles, x4 for fp32, fp8 at the
    generation's fp8 speedup. VectorE and GpSimd ``(elements, sixteen_bit)``, elements per partition over
    all inputs: that many cycles over the lanes beyond 128 (16-bit dtypes have more on trn2 and trn3), plus
    100. ScalarE ``(elements,)``: one per partition per cycle, plus 100. DMA ``(bytes,)``: over the core's
    share of HBM bandwidth.
    """
    if engine == "TensorE":
        rows, rate = work
        factor = FP32_MATMUL_FACTOR if rate == "fp32" else (1.0 / gen.fp8_speedup if rate == "fp8" else 1.0)
        return max(rows, MM_INIT_LATENCY_CYCLES) * factor / (gen.tensor_ghz * 1e9)
    if engine == "DMA":
        return work[0] / gen.hbm_bytes_per_s_per_core
    if engine == "ScalarE":
        return (work[0] + VECTOR_STATIC_OVERHEAD_CYCLES) / (gen.scalar_ghz * 1e9)
    elements, sixteen_bit = work
    lanes = gen.vector_lanes_16bit if sixteen_bit else gen.vector_lanes_fp32
    cycles = elements / max(1.0, lanes / PMAX) + VECTOR_STATIC_OVERHEAD_CYCLES
    return cycles / ((gen.gpsimd_ghz if engine == "GpSimd" else gen.vector_ghz) * 1e9)


# The target of the kernel being run or estimated: kernel.estimate(target=...), else @nki.jit(platform_target=...).
TARGET: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("torchneuron_nki_target", default=None)
_EXPLICIT: contextvars.ContextVar[bool] = contextvars.ContextVar("torchneuron_nki_target_explicit", default=False)


def resolve(name: str, where: str) -> Generation:
    gen = GENERATIONS.get(name.strip().lower())
    if gen is None:
        raise ValueError(f"{where}={name!r}: expected one of {sorted(GENERATIONS)}")
    return gen


def current() -> Generation:
    """The target generation. As on AWS, ``NEURON_PLATFORM_TARGET_OVERRIDE`` (trn1, trn2, trn3) overrides a
    kernel's ``@nki.jit(platform_target=...)``; ``kernel.estimate(target=...)`` overrides both; else trn2."""
    chosen, explicit = TARGET.get(), _EXPLICIT.get()
    env = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE", "").strip()
    if chosen is not None and (explicit or not env):
        return resolve(chosen, "target" if explicit else "platform_target")
    return resolve(env or "trn2", "NEURON_PLATFORM_TARGET_OVERRIDE")
