"""Inference projection: prefill (the prompt, compute-bound) and decode (one token at a time,
bound by reading weights and KV cache) projected separately, with the KV cache in the memory check.

Time to first token is the prefill plus one decode step: the fixed costs of a forward pass that a
decode step consists of at batch 1 (a compiled graph's launch, every layer's collective latency,
reading the weights, sampling) are paid once more before the first token comes back. Stacks that
run attention without a fused kernel (``attention="unfused"``) also pay, in the prefill, a time per
attention score (query x key pair, per head a device holds, per layer): the generation's
``unfused_attention_s_per_score``, fitted on one published row (docs/projection.md).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from typing import Any, Dict, List, Optional, Sequence

import torch

from torchneuron.projection.counting import CountingMode, StepCounts
from torchneuron.projection.model import ModelHints, Parallelism, _val, extrapolate_layers, get_target, step_time
from torchneuron.projection.models import LLAMA_CONFIGS, LlamaConfig, build

logger = logging.getLogger("torchneuron")


@functools.lru_cache(maxsize=None)
def count_forward(cfg: LlamaConfig, batch: int, seq: int, cache_len: int = 0) -> StepCounts:
    """Count one forward of ``batch x seq`` tokens (after ``cache_len`` cached ones) on meta tensors."""
    with CountingMode() as counter, torch.no_grad():
        net = build(cfg)
        counter.discard()
        tokens = torch.zeros(batch, seq, dtype=torch.long, device="meta")
        net(tokens, cache_len=cache_len)
        counter.mark_step(tokens=batch * seq, samples=batch)
    return counter.completed_steps()[0]


def project_serving(model: Any, targets: Sequence[str], batch: int = 1, prompt: int = 1024, generate: int = 256,
                    tp: int = 1, mode: str = "compiled", exact: bool = False,
                    attention: str = "fused") -> List[Dict[str, Any]]:
    """Project serving a Llama-style model: time to first token, time per output token, cost.

    Args:
        model: name in :data:`LLAMA_CONFIGS` or a config.
        targets: instance names.
        batch: concurrent sequences.
        prompt: prompt tokens per sequence.
        generate: output tokens per sequence; decode is counted at the mean cache length.
        tp: tensor-parallel degree (devices per model replica).
        mode: ``"compiled"`` (default) or ``"eager"``.
        exact: count every layer instead of extrapolating from one and two layers.
        attention: ``"fused"`` (a flash-attention kernel: scores never leave the chip) or
            ``"unfused"`` (scores materialized; the prefill pays the generation's time per score).
    """
    if attention not in ("fused", "unfused"):
        raise ValueError(f"attention must be 'fused' or 'unfused', got {attention!r}")
    cfg = LLAMA_CONFIGS[model] if isinstance(model, str) else model
    cache = prompt + generate // 2
    hints = ModelHints(params=cfg.num_params(), param_bytes=2, layers=cfg.n_layers, hidden=cfg.dim, master_bytes=0)
    kv_bytes = 2 * cfg.n_layers * batch * (prompt + generate) * cfg.n_kv_heads * cfg.head_dim * 2
    rows = []
    for name in targets:
        target = get_target(name)
        par = Parallelism(tp=tp)
        if exact:
            tp_pre = step_time([count_forward(cfg, batch, prompt)], target, par, mode, hints)
            tp_dec = step_time([count_forward(cfg, batch, 1, cache)], target, par, mode, hints)
        else:
            small = [dataclasses.replace(cfg, n_layers=n) for n in (1, 2)]
            tp_pre = extrapolate_layers(*(step_time([count_forward(c, batch, prompt)], target, par, mode, hints)
                                          for c in small), cfg.n_layers)
            tp_dec = extrapolate_layers(*(step_time([count_forward(c, batch, 1, cache)], target, par, mode, hints)
                                          for c in small), cfg.n_layers)
        tpot = tp_dec["step_s"]
        prefill_breakdown = dict(tp_pre["breakdown"])
        prefill_breakdown["first decode step"] = tpot
        if attention == "unfused":
            per_score = target.gen.get("unfused_attention_s_per_score")
            if per_score is None or _val(per_score) is None:
                logger.warning("projection: %s has no unfused_attention_s_per_score; attention scores not costed", name)
            else:
                heads = math.ceil(cfg.n_heads / tp)  # a device computes whole heads
                prefill_breakdown["attention scores (unfused)"] = (
                    batch * heads * prompt * prompt * cfg.n_layers * float(_val(per_score)))
        ttft = sum(prefill_breakdown.values())
        total_s = ttft + generate * tpot
        out_tokens_per_s = batch * generate / total_s
        memory = tp_dec["memory"]["weights"] + kv_bytes / tp + tp_pre["memory"]["activations"]
        replicas = max(1, target.devices_per_instance // tp)
        price = target.price_per_hour
        rows.append({
            "target": name, "tp": tp, "batch": batch, "prompt": prompt, "generate": generate,
            "prefill_s": ttft, "decode_s_per_token": tpot, "prefill_breakdown": prefill_breakdown,
            "decode_breakdown": tp_dec["breakdown"], "output_tokens_per_s_per_replica": out_tokens_per_s,
            "replicas_per_instance": replicas,
            "usd_per_million_output_tokens": (price / 3600 / (out_tokens_per_s * replicas) * 1e6) if price else None,
            "memory_per_device_bytes": memory, "kv_cache_bytes": kv_bytes, "capacity_bytes": target.hbm_bytes,
            "fits": memory <= target.hbm_bytes,
        })
    return rows


@functools.lru_cache(maxsize=None)
def _count_transcription(cfg: Any, batch: int, prompt: int, cache_len: int) -> tuple:
    """Counts of the encoder (with the cross-attention keys and values), the prompt and one decode step."""
    from torchneuron.projection.models import build_encoder_decoder

    with CountingMode() as counter, torch.no_grad():
        net = build_encoder_decoder(cfg)
        counter.discard()
        net.encode(torch.zeros(batch, cfg.mel_bins, 2 * cfg.frames, dtype=torch.bfloat16, device="meta"))
        counter.mark_step(samples=batch)
        net.decode(torch.zeros(batch, prompt, dtype=torch.long, device="meta"))
        counter.mark_step(tokens=batch * prompt)
        net.decode(torch.zeros(batch, 1, dtype=torch.long, device="meta"), cache_len=cache_len)
        counter.mark_step(tokens=batch)
    return tuple(counter.completed_steps())


def project_transcription(model: Any, targets: Sequence[str], batch: int = 16, tokens_per_clip: int = 128,
                          prompt: int = 4, clip_s: float = 30.0, mode: str = "compiled",
                          prices: Optional[Dict[str, float]] = None) -> List[Dict[str, Any]]:
    """Project transcribing audio with a Whisper-style model: hours of audio per hour and per dollar.

    Each device transcribes ``batch`` clips of ``clip_s`` seconds at a time: the encoder once per
    clip (with every decoder layer's cross-attention keys and values), the ``prompt`` tokens
    (start, language, task, no-timestamps), then ``tokens_per_clip`` decode steps, each counted at
    the mean cache length; every device of an instance is a replica.

    Args:
        model: name in :data:`~torchneuron.projection.models.WHISPER_CONFIGS` or a config.
        targets: instance names.
        batch: clips per device at a time.
        tokens_per_clip: text tokens generated per clip (about 100 for 30 s of English speech).
        prompt: decoder prompt tokens.
        clip_s: seconds of audio per clip (Whisper's window is 30 s).
        mode: ``"compiled"`` (default) or ``"eager"``.
        prices: USD per instance-hour by name, in place of ``hardware.json``'s.
    """
    from torchneuron.projection.models import WHISPER_CONFIGS

    cfg = WHISPER_CONFIGS[model] if isinstance(model, str) else model
    cache = prompt + tokens_per_clip // 2
    encode, pre, dec = _count_transcription(cfg, batch, prompt, cache)
    params = sum(p.numel() for p in _params_of(cfg))
    hints = ModelHints(params=params, param_bytes=2, master_bytes=0)
    kv_bytes = 2 * cfg.decoder_layers * batch * (prompt + tokens_per_clip + cfg.frames) * cfg.dim * 2
    rows = []
    for name in targets:
        target = get_target(name)
        t_enc, t_pre, t_dec = (step_time([c], target, Parallelism(), mode, hints) for c in (encode, pre, dec))
        batch_s = t_enc["step_s"] + t_pre["step_s"] + tokens_per_clip * t_dec["step_s"]
        replicas = target.devices_per_instance
        audio_h_per_h = replicas * batch * clip_s / batch_s
        price = (prices or {}).get(name, target.price_per_hour)
        memory = params * 2 + kv_bytes + t_enc["memory"]["activations"]
        rows.append({
            "target": name, "batch": batch, "tokens_per_clip": tokens_per_clip, "replicas_per_instance": replicas,
            "encoder_s": t_enc["step_s"], "prompt_s": t_pre["step_s"], "decode_s_per_token": t_dec["step_s"],
            "batch_s": batch_s, "audio_hours_per_instance_hour": audio_h_per_h,
            "usd_per_hour": price, "price_given": name in (prices or {}), "audio_hours_per_usd": audio_h_per_h / price if price else None,
            "encoder_breakdown": t_enc["breakdown"], "decode_breakdown": t_dec["breakdown"],
            "memory_per_device_bytes": memory, "capacity_bytes": target.hbm_bytes, "fits": memory <= target.hbm_bytes,
        })
    return rows


@functools.lru_cache(maxsize=None)
def _params_of(cfg: Any) -> tuple:
    from torchneuron.projection.models import build_encoder_decoder

    return tuple(build_encoder_decoder(cfg).parameters())


@functools.lru_cache(maxsize=8)
def _built(cfg: LlamaConfig, dtype: torch.dtype) -> torch.nn.Module:
    return build(cfg, dtype)


@functools.lru_cache(maxsize=None)
def count_step(cfg: LlamaConfig, groups: tuple, sampled: int, dtype: torch.dtype = torch.bfloat16) -> StepCounts:
    """Count one engine step of a serving engine on meta tensors (see ``Llama.forward_step``).

    Args:
        cfg: the model's shape.
        groups: ``((requests, new tokens each, cached tokens each), ...)``.
        sampled: requests that sample a token in the step.
        dtype: the weights' and activations' dtype.
    """
    tokens = sum(b * s for b, s, _ in groups)
    net = _built(cfg, dtype)
    with CountingMode() as counter, torch.no_grad():
        ids = torch.zeros(1, tokens, dtype=torch.long, device="meta")
        net.forward_step(ids, groups, sampled)
        counter.mark_step(tokens=tokens, samples=sum(b for b, _, _ in groups))
    return counter.completed_steps()[0]


def project_step(cfg: LlamaConfig, groups: tuple, sampled: int, target: Any, tp: int = 1, mode: str = "compiled",
                 dtype: torch.dtype = torch.bfloat16, exact: bool = False) -> Dict[str, Any]:
    """Project one engine step on ``target`` with ``tp`` devices per model replica: :func:`step_time`'s
    result for :func:`count_step`'s counts, from counts of 1 and 2 layers unless ``exact``."""
    nbytes = torch.empty((), dtype=dtype).element_size()
    hints = ModelHints(params=cfg.num_params(), param_bytes=nbytes, layers=cfg.n_layers, hidden=cfg.dim,
                       act_bytes=nbytes, master_bytes=0)
    par = Parallelism(dp=1, tp=tp)
    if exact:
        return step_time([count_step(cfg, groups, sampled, dtype)], target, par, mode, hints)
    small = [dataclasses.replace(cfg, n_layers=n) for n in (1, 2)]
    return extrapolate_layers(*(step_time([count_step(c, groups, sampled, dtype)], target, par, mode, hints)
                                for c in small), cfg.n_layers)
