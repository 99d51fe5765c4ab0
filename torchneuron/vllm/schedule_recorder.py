"""What vLLM's scheduler gave the model runner, engine step by engine step, written to a file.

When ``TORCHNEURON_VLLM_SCHEDULE`` names a file, the neuron model runner of tensor-parallel rank 0
appends to it, as JSON lines, one record of the engine (the model's shape and dtype, the engine's
settings) and then one record per engine step: every scheduled request as ``[id, new, cached,
prompt, sampled]`` and the KV cache blocks in use. The format is
:mod:`torchneuron.vllm.schedule_format`'s, which the projection reads back
(:mod:`torchneuron.projection.schedule`); ``torchneuron project`` sets the variable for a script
that serves with vLLM. Everything comes from the scheduler's output (``SchedulerOutput``) as the
runner receives it; nothing of the model's execution is changed.

The recorder keeps what it needs only while a request lives (its prompt's length and its KV cache
blocks, dropped when vLLM reports the request finished), holds at most :data:`BUFFER_LINES` records
before writing them, and closes its file when the worker shuts down (:meth:`ScheduleRecorder.close`,
also at interpreter exit).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
from typing import Any, Dict, List, Optional, Set

from . import schedule_format
from .schedule_format import ENV

__all__ = ["BUFFER_LINES", "ENV", "ScheduleRecorder", "recorder"]

#: Records held in memory before they are written (and at most this many are lost if the process is killed).
BUFFER_LINES = 64

logger = logging.getLogger("torchneuron")


def recorder(vllm_config) -> Optional["ScheduleRecorder"]:
    """A recorder for this engine when ``TORCHNEURON_VLLM_SCHEDULE`` is set, else ``None``."""
    path = os.environ.get(ENV, "").strip()
    return ScheduleRecorder(path, vllm_config) if path else None


def _records_here() -> bool:
    """Whether this worker records: tensor-parallel rank 0 of the first pipeline stage."""
    from vllm.distributed.parallel_state import get_pp_group, get_tp_group

    return get_tp_group().rank_in_group == 0 and get_pp_group().is_first_rank


class ScheduleRecorder:
    """Appends an engine's schedule to ``path`` (see the module's description).

    Args:
        path: the file (appended to).
        vllm_config: the engine's ``VllmConfig``.
        records_here: whether this process records; default: asked from vLLM's process groups when the
            first step arrives.
    """

    def __init__(self, path: str, vllm_config, records_here: Optional[bool] = None) -> None:
        self.path = path
        self.config = vllm_config
        self._records_here = records_here
        self._file = None
        self._closed = False
        self._buffer: List[str] = []
        self._prompts: Dict[str, int] = {}
        self._blocks: Dict[str, Set[int]] = {}

    @property
    def live_requests(self) -> int:
        """Requests whose prompt length and blocks are held (those vLLM has not reported finished)."""
        return len(self._prompts.keys() | self._blocks.keys())

    def _open(self) -> bool:
        if self._file is not None:
            return True
        if self._closed:
            return False
        if self._records_here is None:
            self._records_here = _records_here()
        if not self._records_here:
            self._closed = True  # one rank records the engine's schedule
            return False
        self._file = open(self.path, "a")
        atexit.register(self.close)
        self._buffer.append(json.dumps(self._engine()))
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
        return schedule_format.engine_record(
            model, model_path=str(mc.model), tp=pc.tensor_parallel_size, pp=pc.pipeline_parallel_size,
            block_size=cc.block_size, num_gpu_blocks=cc.num_gpu_blocks, max_num_seqs=sc.max_num_seqs,
            max_num_batched_tokens=sc.max_num_batched_tokens, max_model_len=mc.max_model_len,
            enforce_eager=bool(mc.enforce_eager), prefix_caching=bool(cc.enable_prefix_caching),
            chunked_prefill=bool(getattr(sc, "enable_chunked_prefill", False)), pid=os.getpid())

    def step(self, out) -> None:
        """Record one ``SchedulerOutput`` (an engine step), before the runner executes it."""
        # A finished request's prompt and blocks go first, whether or not this step computes anything.
        for req_id in out.finished_req_ids:
            self._prompts.pop(req_id, None)
            self._blocks.pop(req_id, None)
        for req_id in out.preempted_req_ids or ():
            self._blocks.pop(req_id, None)  # its prompt's length is needed when it resumes
        if not out.total_num_scheduled_tokens or not self._open():
            return
        scheduled = out.num_scheduled_tokens
        rows = []
        for new in out.scheduled_new_reqs:
            prompt = len(new.prompt_token_ids) if new.prompt_token_ids is not None else (
                len(new.prompt_embeds) if new.prompt_embeds is not None else 0)
            self._prompts[new.req_id] = prompt
            self._blocks[new.req_id] = {b for group in new.block_ids for b in group}
            n = scheduled.get(new.req_id, 0)
            rows.append((new.req_id, n, new.num_computed_tokens, prompt, new.num_computed_tokens + n >= prompt))
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
            rows.append((req_id, n, done, prompt, done + n >= prompt + max(0, outputs)))
        in_use = set().union(*self._blocks.values()) if self._blocks else set()
        self._buffer.append(json.dumps(schedule_format.step_record(rows, len(in_use))))
        if len(self._buffer) >= BUFFER_LINES:
            self.flush()

    def flush(self) -> None:
        """Write the records held in memory."""
        if self._file is not None and self._buffer:
            self._file.write("\n".join(self._buffer) + "\n")
            self._file.flush()
            self._buffer.clear()

    def close(self) -> None:
        """Write what is held and close the file (the worker's shutdown, or interpreter exit); idempotent."""
        self._closed = True
        if self._file is not None:
            try:
                self.flush()
            finally:
                self._file.close()
                self._file = None
                atexit.unregister(self.close)
        self._buffer.clear()
        self._prompts.clear()
        self._blocks.clear()

    def __enter__(self) -> "ScheduleRecorder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
