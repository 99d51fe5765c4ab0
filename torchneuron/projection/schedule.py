"""Projecting a served workload: what a serving engine scheduled, step by step, on other hardware.

A :class:`Schedule` is what vLLM's scheduler gave the model runner at each engine step: every
request scheduled, with the tokens it computes in the step, the tokens of it already in the KV
cache, its prompt's length and whether it samples a token; and the KV cache blocks in use. vLLM's
model runner on neuron writes one when ``TORCHNEURON_VLLM_SCHEDULE`` names a file
(``torchneuron project`` sets it for a script that serves with vLLM); :meth:`Schedule.load` reads it.

:func:`project_schedule` projects each engine step as one forward of the served model's shape (or
another's): the step's tokens pass the projections and the feed-forward together, attention runs
per group of requests against their cache, the output head only for the requests that sample
(``serving.count_step``, counted on meta tensors, timed by ``model.step_time``). Adding the steps
up gives the time each request waited for its first token, the time per output token after it,
and output tokens per second and per dollar, with every device of an instance serving a replica of
the workload.

The file format is :mod:`torchneuron.vllm.schedule_format`'s (the recorder writes with it, this
module reads with it): one engine record per engine, then one step record per engine step.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch

from torchneuron.projection.model import get_target
from torchneuron.projection.models import LLAMA_CONFIGS, LlamaConfig
from torchneuron.vllm import schedule_format

__all__ = ["ScheduledRequest", "EngineStep", "Schedule", "ServingReport", "project_schedule", "model_config"]

LABEL = "PROJECTION (not a measurement)"

ASSUMPTIONS = [
    "Each engine step is projected as one forward of the model at the recorded schedule: the step's tokens "
    "pass the linear layers together (weights read once per step), attention runs per group of requests "
    "against its KV cache (a step's decodes at their mean cache length), logits only for the requests that "
    "sample; sampling itself and the host's scheduling are not costed.",
    "Kernel time as for training (torchneuron.projection.model.step_time): max(FLOPs / (peak x efficiency), "
    "bytes / (HBM bandwidth x efficiency)) + a fixed cost per op (eager) or per fused kernel (compiled); "
    "tensor parallelism splits each kernel over tp devices and adds 2 all-reduces of the step's activations "
    "per layer.",
    "Requests all wait from the first step (as LLM.generate queues them); no idle time between steps. "
    "TTFT = end of the step that samples a request's first token; TPOT = the time from there to its last "
    "token over its other output tokens.",
    "Every device of an instance serves: tp devices per replica, devices // tp replicas, each serving the "
    "recorded workload; $/Mtok = the whole instance's price over all its replicas' output tokens.",
    "Memory per device = weights / tp + the recorded peak of KV blocks in use x block size at the projected "
    "model's KV bytes per token / tp + the largest step's activations / tp.",
    "Prices are on-demand list prices where a source was found (see hardware.json).",
]


@dataclass(frozen=True)
class ScheduledRequest:
    """One request's share of an engine step.

    Args:
        id: vLLM's request id.
        new: tokens it computes in the step.
        cached: its tokens already in the KV cache (computed before, or hits of the prefix cache).
        prompt: its prompt's length.
        sampled: whether the step samples a token for it (its prompt is complete after the step).
    """

    id: str
    new: int
    cached: int
    prompt: int
    sampled: bool

    @property
    def decoding(self) -> bool:
        """A decode: one new token after the whole prompt."""
        return self.new == 1 and self.cached >= self.prompt


@dataclass
class EngineStep:
    """The requests of one engine step and the KV cache blocks in use after scheduling it."""

    requests: List[ScheduledRequest]
    kv_blocks: int = 0

    @property
    def tokens(self) -> int:
        return sum(r.new for r in self.requests)

    @property
    def prefill_tokens(self) -> int:
        return sum(r.new for r in self.requests if not r.decoding)

    @property
    def decode_tokens(self) -> int:
        return sum(r.new for r in self.requests if r.decoding)

    @property
    def sampled(self) -> int:
        return sum(r.sampled for r in self.requests)

    def groups(self) -> tuple:
        """``((requests, new, cached), ...)``: the decodes in one group at their mean cache length, each
        other shape (a prompt chunk, a speculative step) in a group of its own kind."""
        decodes = [r.cached for r in self.requests if r.decoding]
        out: Dict[tuple, int] = {}
        for r in self.requests:
            if not r.decoding:
                out[(r.new, r.cached)] = out.get((r.new, r.cached), 0) + 1
        groups = [(n, new, cached) for (new, cached), n in sorted(out.items())]
        if decodes:
            groups.insert(0, (len(decodes), 1, round(sum(decodes) / len(decodes))))
        return tuple(groups)


@dataclass
class Schedule:
    """What a serving engine scheduled: its model, its settings and its engine steps."""

    model: Dict[str, Any]
    settings: Dict[str, Any] = field(default_factory=dict)
    steps: List[EngineStep] = field(default_factory=list)
    engines: int = 1
    records: List[Dict[str, Any]] = field(default_factory=list, repr=False)

    @classmethod
    def from_records(cls, records: Sequence[Mapping[str, Any]]) -> "Schedule":
        """Build from the recorder's records (the first engine's, when several engines wrote)."""
        head = None
        steps: List[EngineStep] = []
        kept: List[Dict[str, Any]] = []
        engines = 0
        for rec in records:
            if rec.get("kind") == "engine":
                engines += 1
                if head is None:
                    head = rec
                    kept.append(dict(rec))
                continue
            if rec.get("kind") == "step" and engines == 1:
                steps.append(EngineStep([ScheduledRequest(*r) for r in schedule_format.requests(rec)],
                                        int(rec.get("kv_blocks") or 0)))
                kept.append(dict(rec))
        if head is None:
            raise ValueError("schedule: no engine record (was the engine vLLM on neuron, with "
                             "TORCHNEURON_VLLM_SCHEDULE set before it started?)")
        settings = {k: v for k, v in head.items() if k not in ("kind", "format", "model")}
        return cls(model=dict(head["model"]), settings=settings, steps=steps, engines=engines, records=kept)

    @classmethod
    def load(cls, path: str) -> "Schedule":
        """Read a schedule file (:mod:`torchneuron.vllm.schedule_format`)."""
        return cls.from_records(schedule_format.read(path))

    def summary(self) -> Dict[str, Any]:
        """Requests, prompt tokens (computed, and found in the prefix cache), output tokens and the
        largest step and KV cache."""
        prompt: Dict[str, int] = {}
        cached: Dict[str, int] = {}
        computed = 0
        for step in self.steps:
            for r in step.requests:
                if r.id not in prompt:
                    prompt[r.id] = r.prompt
                    cached[r.id] = r.cached
                computed += max(0, min(r.new, r.prompt - r.cached))
        block = int(self.settings.get("block_size") or 0)
        peak_blocks = max((s.kv_blocks for s in self.steps), default=0)
        return {
            "engine_steps": len(self.steps), "requests": len(prompt),
            "prompt_tokens": sum(prompt.values()), "prompt_tokens_computed": computed,
            "prompt_tokens_from_prefix_cache": sum(cached.values()),
            "output_tokens": sum(s.sampled for s in self.steps),
            "prefill_tokens": sum(s.prefill_tokens for s in self.steps),
            "decode_tokens": sum(s.decode_tokens for s in self.steps),
            "max_sequences_per_step": max((len(s.requests) for s in self.steps), default=0),
            "max_tokens_per_step": max((s.tokens for s in self.steps), default=0),
            "peak_kv_blocks": peak_blocks, "block_size": block,
            "peak_kv_tokens": peak_blocks * block if block else max(
                (sum(r.cached + r.new for r in s.requests) for s in self.steps), default=0),
        }


def model_config(model: Mapping[str, Any]) -> LlamaConfig:
    """The :class:`~torchneuron.projection.models.LlamaConfig` of a recorded model (a Hugging Face
    config's layers, hidden size, heads, key-value heads, feed-forward size and vocabulary)."""
    return LlamaConfig(dim=int(model["hidden"]), n_layers=int(model["layers"]), n_heads=int(model["heads"]),
                       n_kv_heads=int(model.get("kv_heads") or model["heads"]),
                       ffn_dim=int(model.get("ffn") or 4 * int(model["hidden"])), vocab=int(model["vocab"]))


def resolve_model(spec: Optional[str], recorded: Mapping[str, Any]) -> tuple:
    """``(config, dtype, description)`` of the model to project: the recorded one, a name in
    :data:`~torchneuron.projection.models.LLAMA_CONFIGS` (in bfloat16), or a Hugging Face
    ``config.json`` (or a directory holding one; its ``torch_dtype``, else bfloat16)."""
    if not spec:
        return model_config(recorded), _dtype(recorded.get("dtype")), "as served"
    if spec in LLAMA_CONFIGS:
        return LLAMA_CONFIGS[spec], torch.bfloat16, f"{spec} (torchneuron.projection.models), bfloat16"
    import os

    path = os.path.join(spec, "config.json") if os.path.isdir(spec) else spec
    if not os.path.isfile(path):
        raise ValueError(f"--model-config {spec!r}: neither a name ({', '.join(LLAMA_CONFIGS)}) nor a "
                         "Hugging Face config.json or a directory with one")
    with open(path) as f:
        hf = json.load(f)
    fields = hf_fields(hf)
    return model_config(fields), _dtype(fields.get("dtype") or "bfloat16"), f"{path}, {fields.get('dtype') or 'bfloat16'}"


def hf_fields(hf: Mapping[str, Any]) -> Dict[str, Any]:
    """The fields :func:`model_config` reads, from a Hugging Face config's dictionary."""
    text = hf.get("text_config") or hf
    heads = text.get("num_attention_heads")
    return {"architecture": (hf.get("architectures") or ["?"])[0], "layers": text.get("num_hidden_layers"),
            "hidden": text.get("hidden_size"), "heads": heads,
            "kv_heads": text.get("num_key_value_heads") or heads, "ffn": text.get("intermediate_size"),
            "vocab": text.get("vocab_size"), "dtype": str(hf.get("torch_dtype") or hf.get("dtype") or "") or None}


def _dtype(name: Any) -> torch.dtype:
    text = str(name or "bfloat16").replace("torch.", "")
    dtype = getattr(torch, text, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def _choose_tp(cfg: LlamaConfig, target: Any, kv_tokens: int, nbytes: int, act: float) -> int:
    """The fewest devices per replica (a power of two the instance holds) whose memory holds the
    weights, the KV cache and the activations: the most replicas."""
    need = cfg.num_params() * nbytes + kv_bytes(cfg, kv_tokens, nbytes) + act
    tp = 1
    while tp * 2 <= target.devices_per_instance and need / tp > target.hbm_bytes:
        tp *= 2
    return tp


def kv_bytes(cfg: LlamaConfig, tokens: int, nbytes: int) -> float:
    """KV cache bytes of ``tokens`` tokens: a key and a value per layer per key-value head."""
    return 2.0 * cfg.n_layers * tokens * cfg.n_kv_heads * cfg.head_dim * nbytes


def project_schedule(schedule: Schedule, targets: Sequence[str], compare: Sequence[str] = (),
                     model: Optional[str] = None, mode: Optional[str] = None,
                     tp: Optional[Mapping[str, int]] = None, prices: Optional[Mapping[str, float]] = None,
                     exact: bool = False) -> "ServingReport":
    """Project a recorded served workload on each target and comparison.

    Args:
        schedule: what the engine scheduled.
        targets, compare: instance names (Trainium, typically; GPUs, typically).
        model: project this model instead of the served one (see :func:`resolve_model`).
        mode: ``"eager"`` or ``"compiled"``; default: as the engine ran (``enforce_eager``).
        tp: devices per model replica by instance name; default: the fewest whose memory holds the model.
        prices: USD per instance-hour by name, in place of ``hardware.json``'s.
        exact: count every layer instead of extrapolating from one and two.
    """
    from torchneuron.projection.serving import project_step

    if not schedule.steps:
        raise ValueError("schedule: no engine step was recorded (did the script generate anything?)")
    cfg, dtype, described = resolve_model(model, schedule.model)
    mode = mode or ("eager" if schedule.settings.get("enforce_eager") else "compiled")
    summary = schedule.summary()
    nbytes = torch.empty((), dtype=dtype).element_size()
    steps = [(s.groups(), s.sampled) for s in schedule.steps]
    largest = max(range(len(steps)), key=lambda i: schedule.steps[i].tokens)
    names = list(targets) + [c for c in compare if c not in targets]
    rows = []
    for name in names:
        target = get_target(name)
        given = (tp or {}).get(name)
        if given is None:
            probe = project_step(cfg, *steps[largest], target, 1, mode, dtype, exact)
            degree = _choose_tp(cfg, target, summary["peak_kv_tokens"], nbytes, probe["memory"]["activations"])
        else:
            degree = given
        times = [project_step(cfg, g, n, target, degree, mode, dtype, exact) for g, n in steps]
        rows.append(_row(schedule, times, target, degree, largest, cfg, nbytes, summary,
                         role="target" if name in targets else "compare", price=(prices or {}).get(name)))
    base = rows[0]
    for r in rows:
        r["work_per_dollar_vs_first"] = (base["usd_per_million_output_tokens"] / r["usd_per_million_output_tokens"]
                                         if r["usd_per_million_output_tokens"] and base["usd_per_million_output_tokens"]
                                         else None)
    projected = {"config": dataclasses.asdict(cfg), "dtype": str(dtype).replace("torch.", ""),
                 "described": described, "params": cfg.num_params()}
    return ServingReport(rows=rows, schedule=summary, served=dict(schedule.model), settings=dict(schedule.settings),
                         projected=projected, mode=mode, engines=schedule.engines, records=schedule.records,
                         steps=[{"sequences": len(s.requests), "prefill_tokens": s.prefill_tokens,
                                 "decode_tokens": s.decode_tokens, "sampled": s.sampled, "kv_blocks": s.kv_blocks,
                                 "context_lengths": [r.cached + r.new for r in s.requests]} for s in schedule.steps])


def _row(schedule: Schedule, times: List[Dict[str, Any]], target: Any, tp: int, largest: int, cfg: LlamaConfig,
         nbytes: int, summary: Dict[str, Any], role: str, price: Optional[float]) -> Dict[str, Any]:
    clock = 0.0
    first: Dict[str, float] = {}
    last: Dict[str, float] = {}
    count: Dict[str, int] = {}
    prefill_s = decode_s = 0.0
    breakdown: Dict[str, float] = {}
    for step, t in zip(schedule.steps, times):
        clock += t["step_s"]
        if step.prefill_tokens:
            prefill_s += t["step_s"]
        else:
            decode_s += t["step_s"]
        for k, v in t["breakdown"].items():
            breakdown[k] = breakdown.get(k, 0.0) + v
        for r in step.requests:
            if r.sampled:
                first.setdefault(r.id, clock)
                last[r.id] = clock
                count[r.id] = count.get(r.id, 0) + 1
    total_s = clock
    out = summary["output_tokens"]
    replicas = max(1, target.devices_per_instance // tp)
    per_replica = out / total_s if total_s else 0.0
    per_instance = per_replica * replicas
    given = price is not None
    usd = price if given else target.price_per_hour
    tpots = [(last[i] - first[i]) / (count[i] - 1) for i in first if count[i] > 1]
    ttfts = list(first.values())
    weights = cfg.num_params() * nbytes / tp
    kv = kv_bytes(cfg, summary["peak_kv_tokens"], nbytes) / tp
    act = times[largest]["memory"]["activations"]
    memory = weights + kv + act
    return {
        "target": target.name, "role": role, "chip": target.chip_name, "device": target.chip["device_name"],
        "mode": times[0]["mode"], "tp": tp, "replicas_per_instance": replicas, "devices_used": replicas * tp,
        "devices_paid": target.devices_per_instance, "idle_devices": target.devices_per_instance - replicas * tp,
        "workload_s_per_replica": total_s, "prefill_steps_s": prefill_s, "decode_steps_s": decode_s,
        "output_tokens_per_s_per_replica": per_replica, "output_tokens_per_s_per_instance": per_instance,
        "usd_per_hour": usd, "price_given": given,
        "usd_per_million_output_tokens": usd / 3600.0 / per_instance * 1e6 if usd and per_instance else None,
        "ttft_s": _stats(ttfts), "tpot_s": _stats(tpots), "breakdown": breakdown,
        "memory": {"per_device_bytes": memory, "weights": weights, "kv_cache": kv, "activations": act,
                   "capacity_bytes": target.hbm_bytes, "fits": memory <= target.hbm_bytes},
    }


def _params(n: float) -> str:
    return f"{n / 1e9:,.2f} B" if n >= 1e9 else f"{n / 1e6:,.2f} M"


def _stats(values: List[float]) -> Dict[str, Optional[float]]:
    if not values:
        return {"median": None, "mean": None, "max": None}
    return {"median": statistics.median(values), "mean": statistics.fmean(values), "max": max(values)}


@dataclass
class ServingReport:
    """The projection of a served workload; :meth:`format` prints it, :meth:`to_dict` saves it."""

    rows: List[Dict[str, Any]]
    schedule: Dict[str, Any]
    served: Dict[str, Any]
    settings: Dict[str, Any]
    projected: Dict[str, Any]
    mode: str
    engines: int = 1
    steps: List[Dict[str, Any]] = field(default_factory=list, repr=False)
    records: List[Dict[str, Any]] = field(default_factory=list, repr=False)

    def row(self, target: str) -> Dict[str, Any]:
        """The row of one target."""
        for r in self.rows:
            if r["target"] == target:
                return r
        raise KeyError(target)

    def to_dict(self) -> Dict[str, Any]:
        return {"label": LABEL, "kind": "served workload", "assumptions": ASSUMPTIONS, "mode": self.mode,
                "schedule": self.schedule, "served_model": self.served, "engine": self.settings,
                "projected_model": self.projected, "engines": self.engines, "targets": self.rows,
                "steps": self.steps, "records": self.records, "sources": {r["target"]: get_target(r["target"]).sources() for r in self.rows}}

    def format(self) -> str:
        """A plain-text table, labelled as a projection, with its assumptions."""
        from torchneuron.projection.report import _bytes, _money, _num, _ratio, _time

        s, m, e = self.schedule, self.served, self.settings
        lines = [f"== {LABEL} ==",
                 f"served workload (vLLM's scheduler, {s['engine_steps']} engine steps): {s['requests']} requests, "
                 f"{s['prompt_tokens']:,} prompt tokens ({s['prompt_tokens_from_prefix_cache']:,} from the prefix "
                 f"cache), {s['output_tokens']:,} output tokens; at most {s['max_sequences_per_step']} sequences and "
                 f"{s['max_tokens_per_step']:,} tokens per step, at most {s['peak_kv_blocks']:,} KV blocks of "
                 f"{s['block_size']} tokens in use",
                 f"served model: {m.get('architecture', '?')}, {m['layers']} layers, hidden {m['hidden']}, "
                 f"{m['heads']} heads ({m.get('kv_heads')} KV), ffn {m.get('ffn')}, vocab {m['vocab']}, {m.get('dtype')}; "
                 f"engine: tp={e.get('tp', 1)}, max_num_seqs={e.get('max_num_seqs')}, "
                 f"max_num_batched_tokens={e.get('max_num_batched_tokens')}, "
                 f"{'eager' if e.get('enforce_eager') else 'compiled'}",
                 f"projected model: {self.projected['described']} ({_params(self.projected['params'])} parameters); "
                 f"mode={self.mode}; every device of an instance serves: tp devices per replica, "
                 f"each replica the whole workload"]
        if self.engines > 1:
            lines.append(f"note: {self.engines} engines recorded; the first one's steps are projected")
        head = (f"{'target':<18}{'role':<8}{'tp':>3}{'replicas':>9}{'TTFT p50':>11}{'TPOT p50':>11}"
                f"{'tok/s/replica':>14}{'tok/s/instance':>15}{'$/hour':>9}{'$/Mtok out':>11}{'tok/$':>7}  memory/device")
        lines += ["", head, "-" * len(head)]
        for r in self.rows:
            mem = r["memory"]
            ttft, tpot = r["ttft_s"]["median"], r["tpot_s"]["median"]
            lines.append(
                f"{r['target']:<18}{r['role']:<8}{r['tp']:>3}{r['replicas_per_instance']:>9}"
                f"{_time(ttft) if ttft is not None else '-':>11}{_time(tpot) if tpot is not None else '-':>11}"
                f"{_num(r['output_tokens_per_s_per_replica']):>14}{_num(r['output_tokens_per_s_per_instance']):>15}"
                f"{_money(r['usd_per_hour'], True):>9}{_money(r['usd_per_million_output_tokens'], True):>11}"
                f"{_ratio(r['work_per_dollar_vs_first']):>7}  "
                f"{_bytes(mem['per_device_bytes'])} of {_bytes(mem['capacity_bytes'])} "
                f"{'fits' if mem['fits'] else 'does not fit'}")
        lines += ["", "per target (the workload's time on one replica; its steps' time by component):"]
        for r in self.rows:
            parts = ", ".join(f"{k} {_time(v)}" for k, v in sorted(r["breakdown"].items(), key=lambda kv: -kv[1]) if v)
            idle = f", {r['idle_devices']} idle" if r["idle_devices"] else ""
            lines.append(f"  {r['target']}: {_time(r['workload_s_per_replica'])} ({_time(r['prefill_steps_s'])} in "
                         f"steps with prompt tokens, {_time(r['decode_steps_s'])} decode-only; {r['devices_used']} of "
                         f"{r['devices_paid']} devices{idle}): {parts}")
        given = [f"{r['target']} ${r['usd_per_hour']:,.2f}" for r in self.rows if r.get("price_given")]
        if given:
            lines += ["", "prices per instance-hour given by the user, not from hardware.json: " + ", ".join(given)]
        lines += ["", "assumptions:"] + [f"  - {a}" for a in ASSUMPTIONS]
        lines.append("tok/$ = output tokens per dollar relative to the first target (higher is cheaper); "
                     "n/a = no published price (--price NAME=USD gives one).")
        return "\n".join(lines)


def imports_vllm(path: str, module: bool = False) -> bool:
    """Whether a script (or, with ``module``, a module) imports vLLM itself (``import vllm``,
    ``from vllm import LLM``...), read from its source without running it."""
    import ast
    import importlib.util

    if module:
        try:
            spec = importlib.util.find_spec(path)
        except (ImportError, ValueError):
            return False
        path = spec.origin if spec and spec.origin else ""
    try:
        with open(path) as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "vllm" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "vllm":
            return True
    return False


def run_served(path: str, argv: Sequence[str], env: str, module: bool = False) -> tuple:
    """Run a script that serves with vLLM, unchanged, as ``__main__`` (or a module, as ``python -m``
    does), with ``env`` naming a file its engine writes its schedule to; return ``(schedule, wall_s)``.

    Nothing is counted while it runs: its work is the schedule, projected afterwards.
    """
    import os
    import runpy
    import sys
    import tempfile
    import time

    fd, tmp = tempfile.mkstemp(prefix="torchneuron-schedule-", suffix=".jsonl")
    os.close(fd)
    old_env, old_argv = os.environ.get(env), sys.argv
    os.environ[env] = tmp
    sys.argv = [path, *argv]
    start = time.perf_counter()
    try:
        try:
            if module:
                runpy.run_module(path, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(path, run_name="__main__")
        except SystemExit as e:
            if e.code not in (None, 0):
                raise
        wall = time.perf_counter() - start
        records = schedule_format.read(tmp)
    finally:
        sys.argv = old_argv
        if old_env is None:
            os.environ.pop(env, None)
        else:
            os.environ[env] = old_env
        os.unlink(tmp)
    if not records:
        raise RuntimeError(f"{path} imports vLLM, but no engine step was recorded: the engine must run on neuron "
                           "(torchneuron's vLLM platform, TORCHNEURON_VLLM not 0) and generate something")
    return Schedule.from_records(records), wall
