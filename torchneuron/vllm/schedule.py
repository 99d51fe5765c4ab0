"""What vLLM's scheduler gave the model runner, engine step by engine step, written to a file.

When ``TORCHNEURON_VLLM_SCHEDULE`` names a file, the neuron model runner of tensor-parallel rank 0
appends to it, as JSON lines, one record of the engine (the model's shape and dtype, the engine's
settings) and then one record per engine step: every scheduled request as ``[id, new, cached,
prompt, sampled]`` (tokens computed in the step, tokens of it already in the KV cache, its
prompt's length, whether the step samples a token for it) and the KV cache blocks in use.
``torchneuron project`` sets the variable for a script that serves with vLLM and projects what it
reads back (:mod:`torchneuron.projection.schedule`). Everything comes from the scheduler's output
(``SchedulerOutput``) as the runner receives it; nothing of the model's execution is changed.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Dict, Optional, Set

__all__ = ["ENV", "ScheduleRecorder", "recorder"]

#: The file the schedule is appended to; unset (the default): nothing is recorded.
ENV = "TORCHNEURON_VLLM_SCHEDULE"

logger = logging.getLogger("torchneuron")


def recorder(vllm_config) -> Optional["ScheduleRecorder"]:
    """A recorder for this engine when ``TORCHNEURON_VLLM_SCHEDULE`` is set, else ``None``."""
    path = os.environ.get(ENV, "").strip()
    return ScheduleRecorder(path, vllm_config) if path else None


class ScheduleRecorder:
    """Appends an engine's schedule to ``path`` (see the module's description)."""

    def __init__(self, path: str, vllm_config) -> None:
        self.path = path
        self.config = vllm_config
        self._file = None
        self._off = False
        self._prompts: Dict[str, int] = {}
        self._blocks: Dict[str, Set[int]] = {}

    def _open(self) -> bool:
        if self._file is not None or self._off:
            return not self._off
        from vllm.distributed.parallel_state import get_pp_group, get_tp_group

        if get_tp_group().rank_in_group != 0 or not get_pp_group().is_first_rank:
            self._off = True  # one rank records the engine's schedule
            return False
        self._file = open(self.path, "a", buffering=1)
        self._file.write(json.dumps(self._engine()) + "\n")
        logger.info("vLLM on neuron: recording the schedule to %s", self.path)
        return True

    def _engine(self) -> Dict[str, Any]:
        c = self.config
        mc, cc, sc, pc = c.model_config, c.cache_config, c.scheduler_config, c.parallel_config
        text = mc.hf_text_config
        heads = getattr(text, "num_attention_heads", None)
        model = {
            "architecture": (getattr(mc.hf_config, "architectures", None) or ["?"])[0],
            "layers": getattr(text, "num_hidden_layers", None), "hidden": getattr(text, "hidden_size", None),
            "heads": heads, "kv_heads": getattr(text, "num_key_value_heads", None) or heads,
            "head_dim": mc.get_head_size(), "ffn": getattr(text, "intermediate_size", None),
            "vocab": mc.get_vocab_size(), "dtype": str(mc.dtype).replace("torch.", ""),
        }
        return {"kind": "engine", "model": model, "model_path": str(mc.model), "tp": pc.tensor_parallel_size,
                "pp": pc.pipeline_parallel_size, "block_size": cc.block_size, "num_gpu_blocks": cc.num_gpu_blocks,
                "max_num_seqs": sc.max_num_seqs, "max_num_batched_tokens": sc.max_num_batched_tokens,
                "max_model_len": mc.max_model_len, "enforce_eager": bool(mc.enforce_eager),
                "prefix_caching": bool(cc.enable_prefix_caching),
                "chunked_prefill": bool(getattr(sc, "enable_chunked_prefill", False)), "pid": os.getpid()}

    def step(self, out) -> None:
        """Record one ``SchedulerOutput`` (an engine step), before the runner executes it."""
        if not out.total_num_scheduled_tokens or not self._open():
            return
        for req_id in out.finished_req_ids | (out.preempted_req_ids or set()):
            self._blocks.pop(req_id, None)
        scheduled = out.num_scheduled_tokens
        requests = []
        for new in out.scheduled_new_reqs:
            prompt = len(new.prompt_token_ids) if new.prompt_token_ids is not None else (
                len(new.prompt_embeds) if new.prompt_embeds is not None else 0)
            self._prompts[new.req_id] = prompt
            self._blocks[new.req_id] = {b for group in new.block_ids for b in group}
            n = scheduled.get(new.req_id, 0)
            requests.append([new.req_id, n, new.num_computed_tokens, prompt,
                             new.num_computed_tokens + n >= prompt])
        cached = out.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            n = scheduled.get(req_id, 0)
            if not n:
                continue
            blocks = cached.new_block_ids[i]
            if blocks is not None:
                ids = {b for group in blocks for b in group}
                if req_id in cached.resumed_req_ids:
                    self._blocks[req_id] = ids
                else:
                    self._blocks.setdefault(req_id, set()).update(ids)
            prompt = self._prompts.get(req_id, 0)
            done = cached.num_computed_tokens[i]
            outputs = cached.num_output_tokens[i] if i < len(cached.num_output_tokens) else 0
            # A request samples once every token it has (its prompt and its outputs so far) is computed.
            requests.append([req_id, n, done, prompt, done + n >= prompt + max(0, outputs)])
        in_use = set().union(*self._blocks.values()) if self._blocks else set()
        self._file.write(json.dumps({"kind": "step", "requests": requests, "kv_blocks": len(in_use)}) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
