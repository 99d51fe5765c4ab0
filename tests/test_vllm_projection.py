"""Projecting a workload served with vLLM: ``torchneuron project`` on a user's own vLLM script.

The script (tests/data/vllm_serve.py) is run unchanged, in vLLM's environment (``.venv-vllm``,
as tests/test_vllm.py runs it), by ``python -m torchneuron project``: vLLM's model runner on
neuron records what the scheduler scheduled each engine step, and the report projects that
schedule on Trainium and GPU instances. The other tests project schedules built here, with
figures that can be worked out from the hardware's numbers.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from torchneuron.projection.model import get_target
from torchneuron.projection.models import LLAMA_CONFIGS
from torchneuron.projection.schedule import Schedule, imports_vllm, project_schedule
from torchneuron.projection.serving import project_step

ROOT = Path(__file__).resolve().parents[1]
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
DATA = ROOT / "tests" / "data"
SCRIPT = DATA / "vllm_serve.py"
needs_vllm = pytest.mark.skipif(not VLLM_PY.exists(), reason="no .venv-vllm: run scripts/bootstrap.sh")


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> dict:
    """One run of ``torchneuron project`` on the script: its output and the report's JSON."""
    path = tmp_path_factory.mktemp("served")
    model = path / "tiny_llama"
    proc = subprocess.run([sys.executable, str(DATA / "vllm_tiny_llama.py"), str(model)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "TORCHNEURON_VLLM"))}
    env.update({"TORCHNEURON_NUM_DEVICES": "1", "TORCHNEURON_DEVICE_MEMORY": "256MiB", "OMP_NUM_THREADS": "2",
                "VLLM_LOGGING_LEVEL": "WARNING"})
    report = path / "report.json"
    proc = subprocess.run([str(VLLM_PY), "-m", "torchneuron", "project", str(SCRIPT), str(model), "6", "8",
                           "--json", str(report)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    return {"stdout": proc.stdout, "report": json.loads(report.read_text()), "model": str(model)}


@needs_vllm
def test_the_script_runs_unchanged(served):
    assert "torchneuron" not in SCRIPT.read_text()  # a plain vLLM script
    assert imports_vllm(str(SCRIPT))
    out = served["stdout"]
    assert re.search(r"served 7 requests: \d+ prompt tokens, 56 output tokens", out)  # the script's own print
    assert "== PROJECTION (not a measurement) ==" in out and "served workload (vLLM's scheduler" in out


@needs_vllm
def test_recorded_schedule_matches_the_requests(served):
    requests, prompt, output = map(int, re.search(r"served (\d+) requests: (\d+) prompt tokens, (\d+) output",
                                                  served["stdout"]).groups())
    report = served["report"]
    s = report["schedule"]
    assert (s["requests"], s["prompt_tokens"], s["output_tokens"]) == (requests, prompt, output)
    # Every prompt token was computed in a step or found in the prefix cache (the repeated start).
    assert s["prompt_tokens_computed"] + s["prompt_tokens_from_prefix_cache"] == prompt
    assert s["prompt_tokens_from_prefix_cache"] >= 32  # at least one block of 32 tokens
    assert s["prefill_tokens"] == s["prompt_tokens_computed"]
    # Each request feeds back all its output tokens but the last.
    assert s["decode_tokens"] == output - requests
    engine = report["engine"]
    assert (engine["max_num_seqs"], engine["max_num_batched_tokens"], engine["block_size"]) == (4, 64, 32)
    steps = report["steps"]
    assert len(steps) == s["engine_steps"] > output // 4
    assert max(st["sequences"] for st in steps) == 4  # the scheduler's limit, reached
    assert all(st["prefill_tokens"] + st["decode_tokens"] <= 64 for st in steps)
    assert any(st["prefill_tokens"] and st["decode_tokens"] for st in steps)  # continuous batching
    assert sum(st["sampled"] for st in steps) == output
    assert 0 < s["peak_kv_blocks"] <= engine["num_gpu_blocks"]
    # The recorded model is the one served (tests/data/vllm_tiny_llama.py).
    config = json.loads((Path(served["model"]) / "config.json").read_text())
    m = report["served_model"]
    assert (m["layers"], m["hidden"], m["heads"], m["kv_heads"], m["ffn"], m["dtype"]) == (2, 128, 4, 2, 256, "float32")
    assert m["vocab"] == config["vocab_size"]


@needs_vllm
def test_report_rows_follow_from_the_hardware(served):
    report = served["report"]
    assert report["mode"] == "eager"  # the script's enforce_eager=True
    rows = {r["target"]: r for r in report["targets"]}
    assert list(rows) == ["trn1.32xlarge", "trn2.48xlarge", "p5.48xlarge"]
    output = report["schedule"]["output_tokens"]
    for name, r in rows.items():
        target = get_target(name)
        assert r["tp"] == 1 and r["replicas_per_instance"] == target.devices_per_instance  # a tiny model
        assert r["output_tokens_per_s_per_replica"] == pytest.approx(output / r["workload_s_per_replica"])
        assert r["output_tokens_per_s_per_instance"] == pytest.approx(
            r["output_tokens_per_s_per_replica"] * target.devices_per_instance)
        if target.price_per_hour:
            assert r["usd_per_million_output_tokens"] == pytest.approx(
                target.price_per_hour / 3600 / r["output_tokens_per_s_per_instance"] * 1e6)
        assert r["memory"]["fits"]
    assert rows["trn2.48xlarge"]["usd_per_million_output_tokens"] is None  # no published price
    # The same schedule re-projected from the report's records gives the same figures.
    again = project_schedule(Schedule.from_records(report["records"]), ["trn1.32xlarge"])
    assert again.rows[0]["workload_s_per_replica"] == pytest.approx(rows["trn1.32xlarge"]["workload_s_per_replica"])


# ---------------------------------------------------------------- schedules built here

ENGINE = {"kind": "engine", "model": {"architecture": "LlamaForCausalLM", "layers": 2, "hidden": 128, "heads": 4,
                                      "kv_heads": 2, "ffn": 256, "vocab": 384, "dtype": "float32"},
          "tp": 1, "block_size": 32, "max_num_seqs": 8, "max_num_batched_tokens": 2048, "enforce_eager": False}


def _one_request(prompt: int, outputs: int) -> Schedule:
    """One request: its whole prompt in one step, then one decode step per further output token."""
    steps = [{"kind": "step", "requests": [["r", prompt, 0, prompt, True]], "kv_blocks": -(-prompt // 32)}]
    for i in range(1, outputs):
        steps.append({"kind": "step", "requests": [["r", 1, prompt + i - 1, prompt, True]],
                      "kv_blocks": -(-(prompt + i) // 32)})
    return Schedule.from_records([ENGINE, *steps])


def test_known_figures_llama3_8b_on_p5():
    """Llama 3 8B, one request of 1,024 prompt tokens and 64 outputs, on one H100 of a p5.48xlarge.

    The bounds are worked out here from published figures, not from the projection's own formulas:
    8,030,261,248 parameters (meta-llama/Meta-Llama-3-8B's config), read once per decoded token in
    bfloat16; H100 SXM's 3.35 TB/s of HBM3 and 989 TFLOP/s of dense bf16 (NVIDIA's H100 datasheet);
    p5.48xlarge at $55.04 an hour on demand with 8 GPUs (AWS's EC2 price list, us-east-1).
    """
    report = project_schedule(_one_request(1024, 64), ["p5.48xlarge"], model="llama3-8b", tp={"p5.48xlarge": 1})
    (row,) = report.rows
    assert report.mode == "compiled" and row["tp"] == 1 and row["replicas_per_instance"] == 8
    weights = 8_030_261_248 * 2
    assert row["memory"]["weights"] == weights
    # A decode step cannot beat reading the weights at the full bandwidth, and a projection that is
    # not bound by that read (twice the time at full bandwidth) says something else than memory.
    floor = weights / 3.35e12
    tpot = row["tpot_s"]["median"]
    assert floor < tpot < 2 * floor, (floor, tpot)
    # The prompt is compute-bound: 2 FLOPs per weight per token at the dense bf16 peak, at the least.
    assert row["ttft_s"]["median"] > 2 * 8_030_261_248 * 1024 / 989e12
    assert row["ttft_s"]["median"] < 10 * tpot * 1024 / 64  # far less than decoding the prompt token by token
    # Eight replicas decoding one token each per step, and the instance's price over that output.
    per_instance = row["output_tokens_per_s_per_instance"]
    assert 8 * 64 / (row["ttft_s"]["median"] + 64 * 2 * floor) < per_instance < 8 / floor
    dollars = row["usd_per_million_output_tokens"]
    assert 55.04 / 3600 / (8 / floor) * 1e6 < dollars < 55.04 / 3600 / (8 / (2 * floor)) * 1e6 * 1.2, dollars


def test_devices_per_replica_are_the_fewest_that_hold_the_model():
    report = project_schedule(_one_request(512, 8), ["trn1.32xlarge", "trn2.48xlarge"], compare=["p5.48xlarge"],
                              model="llama3-70b", prices={"trn2.48xlarge": 40.0})
    rows = {r["target"]: r for r in report.rows}
    cfg = LLAMA_CONFIGS["llama3-70b"]
    for name, r in rows.items():
        target = get_target(name)
        assert r["memory"]["fits"]
        assert r["replicas_per_instance"] == target.devices_per_instance // r["tp"]
        weights_on_half = cfg.num_params() * 2 / (r["tp"] // 2)
        assert weights_on_half > target.hbm_bytes  # half as many devices would not hold the weights
    assert (rows["trn1.32xlarge"]["tp"], rows["trn2.48xlarge"]["tp"], rows["p5.48xlarge"]["tp"]) == (16, 8, 2)
    assert rows["trn2.48xlarge"]["price_given"]
    assert rows["trn2.48xlarge"]["usd_per_million_output_tokens"] == pytest.approx(
        40.0 / 3600 / rows["trn2.48xlarge"]["output_tokens_per_s_per_instance"] * 1e6)
    assert "prices per instance-hour given by the user" in report.format()


def test_a_step_batches_its_requests():
    """A mixed step costs less than its decodes and its prompt chunk as separate forwards (the weights
    are read once), and more than either alone."""
    p5 = get_target("p5.48xlarge")
    cfg = LLAMA_CONFIGS["llama3-8b"]
    mixed = project_step(cfg, ((8, 1, 300), (1, 256, 0)), 9, p5)["step_s"]
    decodes = project_step(cfg, ((8, 1, 300),), 8, p5)["step_s"]
    chunk = project_step(cfg, ((1, 256, 0),), 1, p5)["step_s"]
    assert max(decodes, chunk) < mixed < decodes + chunk


def test_imports_vllm_reads_the_source(tmp_path):
    plain = tmp_path / "train.py"
    plain.write_text("import torch\nprint('vllm')\n")
    served = tmp_path / "serve.py"
    served.write_text("import sys\nif True:\n    from vllm import LLM\n")
    assert not imports_vllm(str(plain)) and imports_vllm(str(served))


def test_model_config_from_a_hugging_face_config(tmp_path):
    """``--model-config DIR`` reads a Hugging Face config.json; the served model's own shape gives the same rows."""
    config = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 128,
              "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 256, "vocab_size": 384,
              "torch_dtype": "float32"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    schedule = _one_request(40, 4)
    served = project_schedule(schedule, ["trn1.32xlarge"])
    named = project_schedule(schedule, ["trn1.32xlarge"], model=str(tmp_path))
    assert named.projected["dtype"] == served.projected["dtype"] == "float32"
    assert named.rows[0]["workload_s_per_replica"] == pytest.approx(served.rows[0]["workload_s_per_replica"])
    with pytest.raises(ValueError, match="neither a name"):
        project_schedule(schedule, ["trn1.32xlarge"], model=str(tmp_path / "missing"))


def test_a_vllm_script_that_serves_nothing_is_told_so(tmp_path):
    script = tmp_path / "idle.py"
    script.write_text("if False:\n    from vllm import LLM\nprint('nothing served')\n")
    proc = subprocess.run([sys.executable, "-m", "torchneuron", "project", str(script)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1 and "nothing served" in proc.stdout
    assert "no engine step was recorded" in proc.stderr and "TORCHNEURON_VLLM" in proc.stderr


# ============ the recorder's file, read back by the projection (no vLLM needed: its outputs built here) ============

def _config():
    from types import SimpleNamespace as NS

    text = NS(num_attention_heads=8, num_hidden_layers=4, hidden_size=512, num_key_value_heads=4,
              intermediate_size=1024)
    model = NS(hf_text_config=text, hf_config=NS(architectures=["LlamaForCausalLM"]), get_head_size=lambda: 64,
               get_vocab_size=lambda: 1000, dtype="torch.float32", model="/m", max_model_len=512,
               enforce_eager=True)
    return NS(model_config=model, cache_config=NS(block_size=32, num_gpu_blocks=64, enable_prefix_caching=True),
              scheduler_config=NS(max_num_seqs=8, max_num_batched_tokens=256, enable_chunked_prefill=True),
              parallel_config=NS(tensor_parallel_size=1, pipeline_parallel_size=1))


def _output(new=(), cached=(), finished=(), blocks=None):
    """A SchedulerOutput's fields the recorder reads: new requests ``(id, prompt, tokens)``, cached ones
    ``(id, computed, outputs, tokens)``."""
    from types import SimpleNamespace as NS

    scheduled = {r[0]: r[2] for r in new} | {r[0]: r[3] for r in cached}
    return NS(finished_req_ids=set(finished), preempted_req_ids=set(),
              total_num_scheduled_tokens=sum(scheduled.values()), num_scheduled_tokens=scheduled,
              scheduled_new_reqs=[NS(req_id=i, prompt_token_ids=list(range(p)), prompt_embeds=None,
                                     block_ids=([blocks[i]] if blocks else [[]]), num_computed_tokens=0)
                                  for i, p, _ in new],
              scheduled_cached_reqs=NS(req_ids=[r[0] for r in cached], new_block_ids=[None] * len(cached),
                                       resumed_req_ids=set(), num_computed_tokens=[r[1] for r in cached],
                                       num_output_tokens=[r[2] for r in cached]))


def test_a_recorded_file_is_read_back_by_the_projection(tmp_path):
    """The recorder writes with torchneuron.vllm.schedule_format, the projection reads with it: the steps come
    back as scheduled; a finished request's prompt and blocks are dropped; the file is closed by close()."""
    from torchneuron.vllm import schedule_format
    from torchneuron.vllm.schedule_recorder import BUFFER_LINES, ScheduleRecorder

    path = tmp_path / "schedule.jsonl"
    with ScheduleRecorder(str(path), _config(), records_here=True) as rec:
        rec.step(_output(new=[("a", 40, 40), ("b", 10, 10)], blocks={"a": [0, 1], "b": [2]}))
        rec.step(_output(cached=[("a", 40, 0, 1), ("b", 10, 0, 1)]))
        assert rec.live_requests == 2
        rec.step(_output(cached=[("a", 41, 1, 1)], finished=["b"]))
        assert rec.live_requests == 1  # b finished: its prompt's length and blocks are gone
        assert path.read_text().count("\n") < 4 <= BUFFER_LINES  # still held in the bounded buffer
        file = rec._file
    assert file.closed and rec.live_requests == 0
    schedule = Schedule.load(str(path))
    assert schedule.settings["block_size"] == 32 and schedule.model["layers"] == 4
    assert schedule.model == {"architecture": "LlamaForCausalLM", "layers": 4, "hidden": 512, "heads": 8,
                              "kv_heads": 4, "head_dim": 64, "ffn": 1024, "vocab": 1000, "dtype": "float32"}
    got = [[(r.id, r.new, r.cached, r.prompt, r.sampled) for r in s.requests] for s in schedule.steps]
    assert got == [[("a", 40, 0, 40, True), ("b", 10, 0, 10, True)],
                   [("a", 1, 40, 40, True), ("b", 1, 10, 10, True)],
                   [("a", 1, 41, 40, True)]]
    assert [s.kv_blocks for s in schedule.steps] == [3, 3, 2]
    assert schedule.summary()["output_tokens"] == 5
    assert project_schedule(schedule, ["trn1.32xlarge"]).rows[0]["target"] == "trn1.32xlarge"
    # A record of another format version is refused, not misread.
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "engine", "format": 99, "model": {}}\n')
    with pytest.raises(ValueError, match="format 99"):
        schedule_format.read(str(bad))
