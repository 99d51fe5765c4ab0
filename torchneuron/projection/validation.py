"""Published throughput figures, and the projection of each from fake-mode counts.

Each row is a measurement someone published, with its source and exact configuration. The
projection counts one microbatch of the same model shape on meta tensors (forward, backward and
the AdamW step), then applies the row's parallelism. Rows marked ``calibration`` fixed the
generation's ``matmul_efficiency`` in ``hardware.json`` (at most half the rows); the others
validate it. ``docs/projection.md`` shows the table; ``tests/test_projection.py`` recomputes it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import statistics
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F

from torchneuron.projection.counting import CountingMode, StepCounts
from torchneuron.projection.model import ModelHints, Parallelism, extrapolate_layers, get_target, step_time
from torchneuron.projection.models import LLAMA_CONFIGS, LlamaConfig, build
from torchneuron.projection.serving import project_serving

logger = logging.getLogger("torchneuron")

_TRN1_DECODER = ("AWS Neuron performance: Trn1 training, decoder models (aws-neuron/aws-neuron-sdk "
                 "general/benchmarks/trn1/training_data_decoder.csv, Neuron 2.16)")
_TRN1_ENCODER = ("AWS Neuron performance: Trn1 training, encoder models (aws-neuron/aws-neuron-sdk "
                 "general/benchmarks/trn1/training_data_encoder.csv, Neuron 2.26)")
_TRN1_VIT = ("AWS Neuron performance: Trn1 training, vision transformers (aws-neuron/aws-neuron-sdk "
             "general/benchmarks/trn1/training_data_vision_transformers.csv, Neuron 2.16)")
_TRN1_URL = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/benchmarks/trn1/trn1-training-performance.html"
_TRN1_DECODER_224 = ("AWS Neuron performance: Trn1 training, decoder models (aws-neuron/aws-neuron-sdk "
                     "about-neuron/benchmarks/trn1/training_data_decoder.csv, Neuron 2.24)")
_TRN1_INFER = ("AWS Neuron performance: Trn1 inference, decoder models, latency-optimized (aws-neuron/aws-neuron-sdk "
               "about-neuron/benchmarks/trn1/latency_data_decoder.csv, Transformers NeuronX, Neuron 2.18); P50 values")
_TRN1_INFER_URL = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/benchmarks/trn1/trn1-inference-performance.html"
_TRN1_INFER_L3 = ("AWS Neuron performance: Trn1 inference, decoder models, latency-optimized (aws-neuron/aws-neuron-sdk "
                  "about-neuron/benchmarks/trn1/latency_data_decoder.csv, Transformers NeuronX, Neuron 2.18.1); P50 values")
_L3_NOTE = ("attention taken as fused: Neuron 2.18.1's Llama-3 context encoding costs about a fifth of 2.18.0's per "
            "attention score on the same attention shape (Mistral-7B); no release note confirms a kernel change, and "
            "costed as unfused this row would be off by far more (docs/projection.md)")
_TRN2_INFER = ("AWS Neuron documentation, 'Tutorial: Using Speculative Decoding to improve Llama-3.3-70B inference "
               "performance on Trn2 instances', scenario 1 (no speculation; NxD Inference with vLLM, bf16, TP=64 at LNC=2, "
               "attention/MLP/QKV kernels, sequence parallel), sample LLMPerf output, P50 (aws-neuron/aws-neuron-sdk "
               "libraries/nxd-inference/tutorials/trn2-llama3.3-70b-tutorial.rst)")
_TRN2_INFER_URL = ("https://awsdocs-neuron.readthedocs-hosted.com/en/latest/libraries/nxd-inference/tutorials/"
                   "trn2-llama3.3-70b-tutorial.html")
_MBRIDGE = ("NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md, '25.11 NeMo Container', pre-training, "
            "FP8 current scaling (FP8-CS), Tokens / sec / GPU")
_MBRIDGE_URL = "https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/docs/performance-summary.md"
_MEGATRON = ("NVIDIA/Megatron-LM README, 'Training Speed and Scalability': GPT-3 175B (vocab 131072, seq 4096, "
             "batch 1152) strong-scaled on H100, MFU 47% at 96 GPUs and 42% at 4608 GPUs")
_MEGATRON_URL = "https://github.com/NVIDIA/Megatron-LM#training-speed-and-scalability"


@dataclass(frozen=True)
class Row:
    """One published measurement and the configuration it was measured with.

    Args:
        name: short label.
        model: key of :data:`~torchneuron.projection.models.LLAMA_CONFIGS` or a config.
        target: instance type.
        nodes: instances used.
        dp, tp, pp: parallelism as published.
        microbatch: sequences per microbatch.
        global_batch: sequences per optimizer step.
        seq: sequence length (tokens per sequence).
        metric: ``"seq_per_s"`` (global training throughput), ``"mfu"``, or for serving rows
            ``"tpot_ms"`` (time per output token) and ``"ttft_ms"`` (time to first token).
        value: the published number.
        source: document title, url: its address.
        calibration: whether the row fixed a generation parameter.
        note: what the published configuration adds that the count does not model.
        prompt, generate: serving rows: input and output tokens per sequence.
        attention: serving rows: ``"unfused"`` when the published stack materializes attention
            scores (no flash-attention kernel), else ``"fused"``.
        matmul_dtype: training rows: the dtype the published run's matmuls ran in when it is not
            the model's (``"float8"`` for FP8 training); empty for the model's own.
    """

    name: str
    model: Any
    target: str
    nodes: int
    dp: int
    tp: int
    pp: int
    microbatch: int
    global_batch: int
    seq: int
    metric: str
    value: float
    source: str
    url: str
    calibration: bool = False
    note: str = ""
    prompt: int = 0
    generate: int = 0
    attention: str = "fused"
    matmul_dtype: str = ""

    @property
    def microbatches(self) -> int:
        return max(1, self.global_batch // (self.dp * self.microbatch))


GPT3_175B_MEGATRON = LlamaConfig(12288, 96, 96, 96, 32768, 131072)

ROWS: List[Row] = [
    Row("Llama2-7B, NxD, BF16", "llama2-7b", "trn1.32xlarge", 16, 64, 8, 1, 1, 1024, 4096, "seq_per_s", 93.3,
        _TRN1_DECODER, _TRN1_URL, calibration=True, note="selective activation checkpointing, sequence parallel"),
    Row("Llama2-13B, NxD, BF16", "llama2-13b", "trn1.32xlarge", 32, 32, 8, 4, 1, 1024, 4096, "seq_per_s", 85.65,
        _TRN1_DECODER, _TRN1_URL),
    Row("Llama2-70B, NxD, BF16", "llama2-70b", "trn1.32xlarge", 32, 8, 32, 4, 1, 1024, 4096, "seq_per_s", 15.34,
        _TRN1_DECODER, _TRN1_URL),
    Row("GPT3-175B, NeMo Megatron, BF16+SR", "gpt3-175b", "trn1.32xlarge", 32, 4, 32, 8, 1, 1024, 2048, "seq_per_s",
        13.3, _TRN1_DECODER, _TRN1_URL),
    Row("BERT-Large ph1, 1 node, BF16+SR", "bert-large", "trn1.32xlarge", 1, 32, 1, 1, 16, 16384, 128, "seq_per_s",
        3697.71, _TRN1_ENCODER, _TRN1_URL, note="AdamW; 32 data-parallel NeuronCores"),
    Row("ViT-Base fine-tune, 1 node, BF16+SR", "vit-base", "trn1.32xlarge", 1, 32, 1, 1, 64, 2048, 197, "seq_per_s",
        5232.78, _TRN1_VIT, _TRN1_URL, note="224x224 images = 197 tokens; patch embedding as a matmul"),
    Row("Llama-3.1-8B, NxD, BF16, seq 8192", "llama3-8b", "trn1.32xlarge", 32, 32, 32, 1, 1, 1024, 8192, "seq_per_s",
        47.95, _TRN1_DECODER_224, _TRN1_URL, calibration=True, note="ZeRO-1; FP32 optimizer"),
    Row("Llama-3.1-70B, NxD, BF16, seq 8192", "llama3-70b", "trn1.32xlarge", 32, 4, 32, 8, 1, 1024, 8192, "seq_per_s",
        7.94, _TRN1_DECODER_224, _TRN1_URL, note="FP32 optimizer"),
    Row("Llama-2-7b decode, TP32, batch 1", "llama2-7b", "trn1.32xlarge", 1, 1, 32, 1, 1, 1, 8192, "tpot_ms", 6.70,
        _TRN1_INFER, _TRN1_INFER_URL, prompt=128, generate=8064, attention="unfused"),
    Row("Llama-2-13b decode, TP32, batch 1", "llama2-13b", "trn1.32xlarge", 1, 1, 32, 1, 1, 1, 8192, "tpot_ms", 9.84,
        _TRN1_INFER, _TRN1_INFER_URL, prompt=4096, generate=4096, attention="unfused"),
    Row("Llama-2-13b decode 8192+8192, TP32, batch 1", "llama2-13b", "trn1.32xlarge", 1, 1, 32, 1, 1, 1, 16384,
        "tpot_ms", 13.41, _TRN1_INFER, _TRN1_INFER_URL, prompt=8192, generate=8192, attention="unfused"),
    Row("Llama-2-70b decode, TP32, batch 1", "llama2-70b", "trn1.32xlarge", 1, 1, 32, 1, 1, 1, 2048, "tpot_ms", 26.04,
        _TRN1_INFER, _TRN1_INFER_URL, calibration=True, prompt=1024, generate=1024, attention="unfused"),
    Row("Mistral-7B-v0.2 decode 8192+8192, TP32, batch 1", "mistral-7b", "trn1.32xlarge", 1, 1, 32, 1, 1, 1, 16384,
        "tpot_ms", 9.89, _TRN1_INFER, _TRN1_INFER_URL, prompt=8192, generate=8192, attention="unfused"),
    Row("Llama-2-7b prefill 128, TP32, batch 1", "llama2-7b", "trn1.32xlarge", 1, 1, 32, 1, 1, 1, 8192, "ttft_ms",
        13.32, _TRN1_INFER, _TRN1_INFER_URL, prompt=128, generate=8064, attention="unfused"),
    Row("Llama-2-13b prefill 4096, TP32, batch 1", "llama2-13b", "trn1.32xlarge", 1, 1, 32, 1, 1, 1, 8192, "ttft_ms",
        864.1, _TRN1_INFER, _TRN1_INFER_URL, calibration=True, prompt=4096, generate=4096, attention="unfused"),
    Row("Llama-2-13b prefill 8192, TP32, batch 1", "llama2-13b", "trn1.32xlarge", 1, 1, 32, 1, 1, 1, 16384, "ttft_ms",
        2367.9, _TRN1_INFER, _TRN1_INFER_URL, prompt=8192, generate=8192, attention="unfused"),
    Row("Llama-2-70b prefill 128, TP32, batch 1", "llama2-70b", "trn1.32xlarge", 1, 1, 32, 1, 1, 1, 256, "ttft_ms",
        53.91, _TRN1_INFER, _TRN1_INFER_URL, prompt=128, generate=128, attention="unfused"),
    Row("Llama-2-70b prefill 256, TP32, batch 1", "llama2-70b", "trn1.32xlarge", 1, 1, 32, 1, 1, 1, 512, "ttft_ms",
        81.88, _TRN1_INFER, _TRN1_INFER_URL, prompt=256, generate=256, attention="unfused"),
    Row("Llama-2-70b prefill 1024, TP32, batch 1", "llama2-70b", "trn1.32xlarge", 1, 1, 32, 1, 1, 1, 2048, "ttft_ms",
        232.48, _TRN1_INFER, _TRN1_INFER_URL, prompt=1024, generate=1024, attention="unfused"),
    Row("Llama-2-70b prefill 2048, TP32, batch 1", "llama2-70b", "trn1.32xlarge", 1, 1, 32, 1, 1, 1, 4096, "ttft_ms",
        690.96, _TRN1_INFER, _TRN1_INFER_URL, prompt=2048, generate=2048, attention="unfused"),
    Row("Mistral-7B-v0.2 prefill 8192, TP32, batch 1", "mistral-7b", "trn1.32xlarge", 1, 1, 32, 1, 1, 1, 16384,
        "ttft_ms", 1322.87, _TRN1_INFER, _TRN1_INFER_URL, prompt=8192, generate=8192, attention="unfused"),
    Row("Llama-3-8B decode (2.18.1), TP32, batch 1", "llama3-8b", "trn1.32xlarge", 1, 1, 32, 1, 1, 1, 8192, "tpot_ms",
        7.03, _TRN1_INFER_L3, _TRN1_INFER_URL, prompt=128, generate=8064, note="int8 weight storage"),
    Row("Llama-3-70B decode (2.18.1), TP32, batch 1", "llama3-70b", "trn1.32xlarge", 1, 1, 32, 1, 1, 1, 4096, "tpot_ms",
        26.2, _TRN1_INFER_L3, _TRN1_INFER_URL, prompt=2048, generate=2048),
    Row("Llama-3-8B prefill 128 (2.18.1), TP32, batch 1", "llama3-8b", "trn1.32xlarge", 1, 1, 32, 1, 1, 1, 8192,
        "ttft_ms", 17.09, _TRN1_INFER_L3, _TRN1_INFER_URL, prompt=128, generate=8064, note=_L3_NOTE),
    Row("Llama-3-8B prefill 4096 (2.18.1), TP32, batch 1", "llama3-8b", "trn1.32xlarge", 1, 1, 32, 1, 1, 1, 8192,
        "ttft_ms", 153.02, _TRN1_INFER_L3, _TRN1_INFER_URL, prompt=4096, generate=4096, note=_L3_NOTE),
    Row("Llama-3-70B prefill 128 (2.18.1), TP32, batch 1", "llama3-70b", "trn1.32xlarge", 1, 1, 32, 1, 1, 1, 1152,
        "ttft_ms", 53.2, _TRN1_INFER_L3, _TRN1_INFER_URL, prompt=128, generate=1024, note=_L3_NOTE),
    Row("Llama-3-70B prefill 2048 (2.18.1), TP32, batch 1", "llama3-70b", "trn1.32xlarge", 1, 1, 32, 1, 1, 1, 4096,
        "ttft_ms", 547.0, _TRN1_INFER_L3, _TRN1_INFER_URL, prompt=2048, generate=2048, note=_L3_NOTE),
    Row("Llama-3.3-70B decode, trn2, TP64, batch 1", "llama3-70b", "trn2.48xlarge", 1, 1, 64, 1, 1, 1, 12800,
        "tpot_ms", 19.83, _TRN2_INFER, _TRN2_INFER_URL, prompt=10000, generate=1500),
    Row("Llama-3.3-70B prefill 10000, trn2, TP64, batch 1", "llama3-70b", "trn2.48xlarge", 1, 1, 64, 1, 1, 1, 12800,
        "ttft_ms", 575.7, _TRN2_INFER, _TRN2_INFER_URL, prompt=10000, generate=1500),
    Row("GPT-3 175B, Megatron-LM, 96 H100", GPT3_175B_MEGATRON, "p5.48xlarge", 12, 3, 4, 8, 1, 1152, 4096, "mfu", 0.47,
        _MEGATRON, _MEGATRON_URL, calibration=True, note="TP=4 PP=8 assumed (the README's table is an image)"),
    Row("Llama-3 8B, Megatron-Bridge, 8 H100, FP8", "llama3-8b", "p5.48xlarge", 1, 8, 1, 1, 1, 128, 8192, "seq_per_s",
        14451 * 8 / 8192, _MBRIDGE, _MBRIDGE_URL, matmul_dtype="float8",
        note="14,451 tokens/s/GPU; FSDP over 8 GPUs modelled as ZeRO-1 data parallel"),
    Row("Llama-3 70B, Megatron-Bridge, 64 H100, FP8", "llama3-70b", "p5.48xlarge", 8, 2, 4, 8, 1, 128, 8192,
        "seq_per_s", 1602 * 64 / 8192, _MBRIDGE, _MBRIDGE_URL, matmul_dtype="float8",
        note="1,602 tokens/s/GPU; virtual pipeline (VP=5) not modelled"),
    Row("Llama-3 8B, Megatron-Bridge, 8 B200, FP8", "llama3-8b", "p6-b200.48xlarge", 1, 8, 1, 1, 2, 128, 8192,
        "seq_per_s", 30624 * 8 / 8192, _MBRIDGE, _MBRIDGE_URL, matmul_dtype="float8",
        note="30,624 tokens/s/GPU; Blackwell projected with Hopper's fitted efficiency"),
    Row("GPT-3 175B, Megatron-LM, 4608 H100", GPT3_175B_MEGATRON, "p5.48xlarge", 576, 144, 4, 8, 1, 1152, 4096, "mfu",
        0.42, _MEGATRON, _MEGATRON_URL, note="TP=4 PP=8 assumed; communication overlapped in the measurement"),
]


@functools.lru_cache(maxsize=None)
def count_training_microbatch(cfg: LlamaConfig, microbatch: int, seq: int) -> StepCounts:
    """Count one microbatch's forward, backward and AdamW step of a Llama-style model on meta tensors."""
    with CountingMode() as counter:
        net = build(cfg)
        opt = torch.optim.AdamW(net.parameters(), foreach=False)
        counter.discard()
        tokens = torch.zeros(microbatch, seq, dtype=torch.long, device="meta")
        logits = net(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten())
        del logits
        loss.backward()
        opt.step()
        opt.zero_grad()
        counter.mark_step(tokens=microbatch * seq, samples=microbatch)
    return counter.completed_steps()[0]


def layer_extrapolated_step_time(cfg: LlamaConfig, microbatch: int, seq: int, target: Any, par: Parallelism,
                                 mode: str, hints: ModelHints) -> Dict[str, Any]:
    """:func:`step_time` of an ``n_layers`` model from counts of its 1- and 2-layer versions.

    The layers are identical, so every counted quantity is ``base + layers x per_layer`` and the
    projection of the full model is ``t(1) + (n_layers - 1)·(t(2) - t(1))``, component by
    component (the parallel traffic, from ``hints``, is the same in both). Counting two layers
    instead of eighty makes each row take well under a second; ``tests/test_projection.py``
    checks that the result equals the projection of the fully counted model.
    """
    one = dataclasses.replace(cfg, n_layers=1)
    two = dataclasses.replace(cfg, n_layers=2)
    t1 = step_time([count_training_microbatch(one, microbatch, seq)], target, par, mode, hints)
    t2 = step_time([count_training_microbatch(two, microbatch, seq)], target, par, mode, hints)
    return extrapolate_layers(t1, t2, cfg.n_layers)


def project_row(row: Row, mode: str = "compiled", exact: bool = False) -> Dict[str, Any]:
    """Project one row; returns the projected value, the error and the step breakdown.

    Args:
        row: the published measurement.
        mode: ``"compiled"`` (default: both Neuron and Megatron run fused graphs) or ``"eager"``.
        exact: count every layer instead of extrapolating from one and two layers.
    """
    cfg = LLAMA_CONFIGS[row.model] if isinstance(row.model, str) else row.model
    if row.metric in ("tpot_ms", "ttft_ms"):
        (s,) = project_serving(cfg, [row.target], batch=row.microbatch, prompt=row.prompt, generate=row.generate,
                               tp=row.tp, mode=mode, exact=exact, attention=row.attention)
        seconds = s["decode_s_per_token"] if row.metric == "tpot_ms" else s["prefill_s"]
        projected = seconds * 1e3
        return {"row": row, "projected": projected, "published": row.value, "error": projected / row.value - 1.0,
                "step_s": seconds, "breakdown": s["decode_breakdown" if row.metric == "tpot_ms" else "prefill_breakdown"],
                "memory": {"per_device_bytes": s["memory_per_device_bytes"], "fits": s["fits"]}}
    target = get_target(row.target)
    par = Parallelism(dp=row.dp, tp=row.tp, pp=row.pp, microbatches=row.microbatches, nodes=row.nodes)
    hints = ModelHints(params=cfg.num_params(), param_bytes=2, layers=cfg.n_layers, hidden=cfg.dim,
                       matmul_dtype=row.matmul_dtype)
    if exact:
        t = step_time([count_training_microbatch(cfg, row.microbatch, row.seq)], target, par, mode, hints)
    else:
        t = layer_extrapolated_step_time(cfg, row.microbatch, row.seq, target, par, mode, hints)
    seq_per_s = t["samples_per_step"] / t["step_s"]
    mfu = t["matmul_flops_per_step"] / (t["step_s"] * target.peak_flops("bfloat16") * par.devices)
    projected = seq_per_s if row.metric == "seq_per_s" else mfu
    return {"row": row, "projected": projected, "published": row.value,
            "error": projected / row.value - 1.0, "step_s": t["step_s"], "breakdown": t["breakdown"],
            "memory": t["memory"]}


def validate(rows: Optional[List[Row]] = None, mode: str = "compiled") -> Dict[str, Any]:
    """Project every row; the median |error| of the validation rows (calibration rows excluded) and
    of all rows, and the largest factor between a projection and its published value."""
    results = [project_row(r, mode) for r in (rows or ROWS)]
    held_out = [abs(r["error"]) for r in results if not r["row"].calibration]
    return {"results": results,
            "median_abs_error": statistics.median(held_out) if held_out else 0.0,
            "median_abs_error_all": statistics.median(abs(r["error"]) for r in results),
            "max_ratio": max(max(r["projected"] / r["published"], r["published"] / r["projected"]) for r in results)}


def markdown_table(summary: Dict[str, Any]) -> str:
    """The validation table as Markdown."""
    lines = ["| row | target | nodes | dp/tp/pp | batch (micro/global) | seq | metric | published | projected | error | role |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary["results"]:
        row = r["row"]
        fmt = (lambda v: f"{v * 100:.1f}%") if row.metric == "mfu" else (lambda v: f"{v:,.2f}")
        batch = (f"{row.microbatch}/{row.global_batch}" if row.metric in ("seq_per_s", "mfu")
                 else f"{row.microbatch}, in {row.prompt} out {row.generate}")
        lines.append(f"| {row.name} | {row.target} | {row.nodes} | {row.dp}/{row.tp}/{row.pp} | "
                     f"{batch} | {row.seq} | {row.metric} | {fmt(row.value)} | "
                     f"{fmt(r['projected'])} | {r['error'] * 100:+.1f}% | "
                     f"{'calibration' if row.calibration else 'validation'} |")
    return "\n".join(lines)


def calibrate(rows: Optional[List[Row]] = None, mode: str = "compiled") -> Dict[str, float]:
    """Fit each generation's parameters to its calibration rows (least squares in log error).

    Training rows fit ``matmul_efficiency``; decode rows fit ``link_latency_s`` (in microseconds);
    prefill rows of stacks without fused attention fit ``unfused_attention_s_per_score`` (in steps
    of 10 ps). Parameters are fitted in turn, twice, each with the others' fitted values. Returns ``{"<generation>.<parameter>": value}``;
    ``hardware.json`` holds them rounded. The hardware data is restored afterwards.
    """
    import math

    from torchneuron.projection.model import load_hardware

    rows = [r for r in (rows or ROWS) if r.calibration]
    hw = load_hardware()
    fitted: Dict[str, float] = {}
    by_gen: Dict[str, List[Row]] = {}
    for r in rows:
        by_gen.setdefault(get_target(r.target).chip["generation"], []).append(r)
    for gen, gen_rows in by_gen.items():
        plan = [("matmul_efficiency", [r for r in gen_rows if r.metric in ("seq_per_s", "mfu")],
                 [i / 100 for i in range(20, 101)]),
                ("link_latency_s", [r for r in gen_rows if r.metric == "tpot_ms"], [i * 1e-6 for i in range(1, 101)]),
                ("unfused_attention_s_per_score", [r for r in gen_rows if r.metric == "ttft_ms" and r.attention == "unfused"],
                 [i * 1e-11 for i in range(1, 201)])]
        plan = [(param, param_rows, grid) for param, param_rows, grid in plan if param_rows]
        originals = {param: hw["generations"][gen][param][0] for param, _, _ in plan}
        try:
            for _ in range(2):  # alternate: each parameter refitted with the other's fitted value
                for param, param_rows, grid in plan:
                    if not param_rows:
                        continue
                    entry = hw["generations"][gen][param]
                    best = (float("inf"), entry[0])
                    for value in grid:
                        entry[0] = value
                        loss = sum(math.log(project_row(r, mode)["projected"] / r.value) ** 2 for r in param_rows)
                        best = min(best, (loss, value))
                    entry[0] = best[1]
                    fitted[f"{gen}.{param}"] = best[1]
        finally:
            for param, value in originals.items():
                hw["generations"][gen][param][0] = value
    return fitted
