"""The file format of a recorded vLLM schedule: written by the recorder, read by the projection.

The one definition both sides use: :mod:`torchneuron.vllm.schedule_recorder`
writes records with :func:`engine_record` and :func:`step_record`, and
:mod:`torchneuron.projection.schedule` reads them with :func:`read` and
:func:`requests`. It imports neither vLLM nor torch.

A file is JSON lines, appended to by each engine that records (one per
``LLM``), with ``"format": VERSION`` in every engine record:

* ``{"kind": "engine", "format": 1, "model": {...}, <settings>}``: the model's
  shape (:data:`MODEL_FIELDS`) and the engine's settings (:data:`SETTINGS`);
* ``{"kind": "step", "requests": [[id, new, cached, prompt, sampled], ...],
  "kv_blocks": N}``: one engine step: each scheduled request's tokens computed in
  the step, its tokens already in the KV cache, its prompt's length and whether
  the step samples a token for it (:data:`REQUEST_FIELDS`), and the KV cache
  blocks in use after scheduling it.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Iterable, List, Mapping, Sequence, Tuple

__all__ = ["ENV", "MODEL_FIELDS", "REQUEST_FIELDS", "SETTINGS", "VERSION", "engine_record", "read", "requests",
           "step_record"]

#: The environment variable naming the file to record to (unset: nothing is recorded).
ENV = "TORCHNEURON_VLLM_SCHEDULE"
#: The format's version, in every engine record.
VERSION = 1
#: The fields of a recorded model (a Hugging Face config's shape).
MODEL_FIELDS = ("architecture", "layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab", "dtype")
#: The engine settings an engine record carries next to its model.
SETTINGS = ("model_path", "tp", "pp", "block_size", "num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens",
            "max_model_len", "enforce_eager", "prefix_caching", "chunked_prefill", "pid")
#: The order of a scheduled request's entries in a step record.
REQUEST_FIELDS = ("id", "new", "cached", "prompt", "sampled")


def engine_record(model: Mapping[str, Any], **settings: Any) -> Dict[str, Any]:
    """The record that opens an engine's steps: ``model`` (:data:`MODEL_FIELDS`) and ``settings`` (:data:`SETTINGS`)."""
    unknown = set(model) - set(MODEL_FIELDS)
    if unknown:
        raise ValueError(f"schedule format: unknown model field(s) {sorted(unknown)}; known: {MODEL_FIELDS}")
    unknown = set(settings) - set(SETTINGS)
    if unknown:
        raise ValueError(f"schedule format: unknown setting(s) {sorted(unknown)}; known: {SETTINGS}")
    return {"kind": "engine", "format": VERSION, "model": dict(model), **settings}


def step_record(scheduled: Iterable[Sequence[Any]], kv_blocks: int) -> Dict[str, Any]:
    """The record of one engine step: ``scheduled`` as ``(id, new, cached, prompt, sampled)`` tuples."""
    rows = []
    for row in scheduled:
        req_id, new, cached, prompt, sampled = row
        rows.append([str(req_id), int(new), int(cached), int(prompt), bool(sampled)])
    return {"kind": "step", "requests": rows, "kv_blocks": int(kv_blocks)}


def requests(record: Mapping[str, Any]) -> List[Tuple[str, int, int, int, bool]]:
    """A step record's requests as ``(id, new, cached, prompt, sampled)`` tuples."""
    out = []
    for row in record["requests"]:
        if len(row) != len(REQUEST_FIELDS):
            raise ValueError(f"schedule format: a request has {len(row)} entries, expected {REQUEST_FIELDS}")
        req_id, new, cached, prompt, sampled = row
        out.append((str(req_id), int(new), int(cached), int(prompt), bool(sampled)))
    return out


def read(path: str) -> List[Dict[str, Any]]:
    """The records of a schedule file, checked: known kinds, a supported format version."""
    records = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            record = json.loads(line)
            kind = record.get("kind")
            if kind not in ("engine", "step"):
                raise ValueError(f"{path}:{number}: not a schedule record (kind={kind!r})")
            if kind == "engine" and record.get("format", VERSION) != VERSION:
                raise ValueError(f"{path}:{number}: schedule format {record.get('format')}, this version reads "
                                 f"{VERSION}")
            records.append(record)
    return records
