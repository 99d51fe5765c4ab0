"""vLLM on neuron through torchneuron's platform plugin (torchneuron.vllm), driven in vLLM's own environment.

vLLM's CPU build pins other library versions than the main environment, so
``scripts/bootstrap.sh`` puts it in ``.venv-vllm``; these tests run that
environment's python in subprocesses. The model is a small Llama with random
weights and a byte-level BPE tokenizer built here (tests/data/vllm_tiny_llama.py).

* Greedy tokens from ``LLM(model=...)`` on neuron (picked by the plugin, no user
  code) equal vLLM on the CPU (``TORCHNEURON_VLLM=0``) and Hugging Face
  ``generate()`` on the CPU, in eager and in vLLM's default compiled mode, with
  prefix caching and chunked prefill on.
* A seeded sampled request gives the same tokens twice.
* The KV cache is sized from the device's capacity (``TORCHNEURON_DEVICE_MEMORY``
  times ``gpu_memory_utilization``) and lives in device memory; a model that
  does not fit gets vLLM's ValueError naming the setting to change.
* Tensor parallelism 2 over neuron:0 and neuron:1 gives the tokens of one device.
* A tiny Mixtral (tests/data/vllm_tiny_mixtral.py) gives vLLM's CPU tokens and Hugging Face's on neuron.
* The OpenAI server answers real HTTP requests (completions, chat, streaming)
  and exits within 5 s of SIGTERM, leaving no process or shared memory behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
DATA = ROOT / "tests" / "data"
PROMPTS = ["the quick brown fox", "hello world, this is", "a neuron device runs the model and tokens come",
           "the quick brown fox jumps over"]  # the last shares a prefix with the first: prefix caching
MAX_TOKENS = 12
RUN_TIMEOUT = 300

pytestmark = pytest.mark.skipif(not VLLM_PY.exists(), reason="no .venv-vllm: run scripts/bootstrap.sh")


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "TORCHNEURON_VLLM"))}
    env.update({"TORCHNEURON_NUM_DEVICES": "2", "OMP_NUM_THREADS": "2", "VLLM_LOGGING_LEVEL": "WARNING"})
    env.update(extra)
    return env


def _generate(spec: dict, **env: str) -> dict:
    proc = subprocess.run([str(VLLM_PY), str(DATA / "vllm_generate.py"), json.dumps(spec)], capture_output=True,
                          text=True, env=_env(**env), timeout=RUN_TIMEOUT)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"vLLM run failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def _build_model(tmp_path_factory, name: str) -> str:
    """The model directory tests/data/vllm_<name>.py builds."""
    path = tmp_path_factory.mktemp(name)
    proc = subprocess.run([sys.executable, str(DATA / f"vllm_{name}.py"), str(path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return str(path)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return _build_model(tmp_path_factory, "tiny_llama")


@pytest.fixture(scope="module")
def cpu_run(model_dir) -> dict:
    """vLLM on the CPU: the plugin turned off, its KV cache given explicitly (the CPU sizes it from host RAM)."""
    result = _generate({"model": model_dir, "prompts": PROMPTS, "max_tokens": MAX_TOKENS,
                        "kv_bytes": 64 << 20}, TORCHNEURON_VLLM="0")
    assert result["platform"] == "cpu"
    return result


@pytest.fixture(scope="module")
def hf_tokens(model_dir, cpu_run) -> list[list[int]]:
    """Hugging Face generate() on the CPU, greedy, from the prompt ids vLLM tokenized."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    out = []
    for ids in cpu_run["prompt_ids"]:
        with torch.no_grad():
            full = model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
                                  do_sample=False, pad_token_id=0)
        out.append(full[0, len(ids):].tolist())
    return out


@pytest.fixture(scope="module")
def neuron_eager(model_dir) -> dict:
    return _generate({"model": model_dir, "prompts": PROMPTS, "max_tokens": MAX_TOKENS, "eager": True,
                      "sampled": 1234, "util": 0.5}, TORCHNEURON_DEVICE_MEMORY="256MiB")


def test_hf_reference_is_not_trivial(hf_tokens):
    # Different prompts give different continuations: equal lists below mean something.
    assert len({tuple(t) for t in hf_tokens[:3]}) == 3
    assert all(len(t) == MAX_TOKENS for t in hf_tokens)


def test_greedy_eager_equals_cpu_vllm_and_hf(neuron_eager, cpu_run, hf_tokens):
    assert neuron_eager["platform"] == "neuron"
    assert neuron_eager["prompt_ids"] == cpu_run["prompt_ids"]
    assert neuron_eager["greedy"] == cpu_run["greedy"]
    assert neuron_eager["greedy"] == hf_tokens


def test_seeded_sampling_repeats(neuron_eager):
    first, second = neuron_eager["sampled"]
    assert first == second
    assert all(len(t) == MAX_TOKENS for t in first)
    assert first[0] != neuron_eager["greedy"][0]  # sampled at temperature 1, not greedy


def test_kv_cache_sized_from_device_capacity(neuron_eager):
    (worker,) = neuron_eager["worker_memory"]
    capacity = 256 << 20
    assert worker["device"] == "neuron:0" and worker["capacity"] == capacity
    kv = worker["kv_cache_bytes"]
    # The cache takes what gpu_memory_utilization=0.5 leaves after the model: under half, most of it.
    assert 0.3 * capacity < kv <= 0.5 * capacity
    assert worker["allocated"] >= kv  # the cache is device memory (torch.neuron.memory_allocated)
    block_bytes = 2 * 2 * 32 * 2 * 32 * 4  # layers x (k, v) x block size x kv heads x head size x fp32
    assert neuron_eager["num_gpu_blocks"] == kv // block_bytes


def test_events_are_neuron_events(neuron_eager):
    """The runner waits for sampled tokens on a real event of its device (no no-op placeholder)."""
    assert [w["event_device"] for w in neuron_eager["worker_memory"]] == ["neuron:0"]


CONFIG_CHECK = r"""
import json, os, sys
from vllm.engine.arg_utils import EngineArgs
before = dict(os.environ)
config = EngineArgs(model=sys.argv[1], dtype="float32", max_model_len=256, tensor_parallel_size=int(sys.argv[2]),
                    kv_cache_memory_bytes=1 << 24).create_engine_config()
import torchneuron.vllm.worker  # noqa: F401  (the worker, its runner and vLLM's GPU worker)
import torch
c = config.compilation_config
print("RESULT " + json.dumps({
    "device_type": config.device_config.device_type, "device": str(config.device_config.device),
    "worker_cls": config.parallel_config.worker_cls, "block_size": config.cache_config.block_size,
    "async": config.scheduler_config.async_scheduling, "mode": c.mode.name, "backend": c.backend,
    "compile_threads": c.inductor_compile_config.get("compile_threads"),
    # AITER_*: vLLM's own ROCm module syncs these from its settings (vllm/_aiter_ops.py), on every platform.
    "env_changed": sorted(k for k in set(before) | set(os.environ)
                          if before.get(k) != os.environ.get(k) and not k.startswith("AITER_")),
    "cpu_shm_imported": "vllm.v1.worker.cpu.shm" in sys.modules, "event": torch.Event().device.type}))
"""


def _config_check(model_dir: str, tp: int, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(VLLM_PY), "-c", CONFIG_CHECK, model_dir, str(tp)], capture_output=True, text=True,
                          env=_env(**env), timeout=RUN_TIMEOUT)


def test_platform_configures_neuron_without_touching_the_environment(model_dir):
    """vLLM's configuration for neuron: the device stays neuron, the platform's settings are made, and
    nothing writes the process environment; importing the worker leaves torch's events real."""
    proc = _config_check(model_dir, 1)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    got = json.loads(lines[-1][len("RESULT "):])
    assert got == {"device_type": "neuron", "device": "neuron", "worker_cls": "torchneuron.vllm.worker.NeuronWorker",
                   "block_size": 128, "async": False, "mode": "DYNAMO_TRACE_ONCE", "backend": "inductor",
                   "compile_threads": 1, "env_changed": [], "cpu_shm_imported": False, "event": "neuron"}
    # Two ranks on this host's one NUMA node: stopped at configuration, told what to set.
    proc = _config_check(model_dir, 2)
    assert proc.returncode != 0 and "VLLM_CPU_OMP_THREADS_BIND=" in proc.stderr, proc.stderr[-3000:]


def test_model_that_does_not_fit_gets_a_clear_error(model_dir):
    proc = subprocess.run([str(VLLM_PY), str(DATA / "vllm_generate.py"),
                           json.dumps({"model": model_dir, "prompts": PROMPTS[:1], "util": 0.3})], capture_output=True, text=True,
                          env=_env(TORCHNEURON_DEVICE_MEMORY="3MiB"), timeout=RUN_TIMEOUT)
    assert proc.returncode != 0
    assert "gpu_memory_utilization" in proc.stderr and "TORCHNEURON_DEVICE_MEMORY" in proc.stderr, \
        proc.stderr[-3000:]


def test_greedy_compiled_equals_cpu_vllm(model_dir, cpu_run, hf_tokens):
    result = _generate({"model": model_dir, "prompts": PROMPTS, "max_tokens": MAX_TOKENS, "eager": False},
                       TORCHNEURON_DEVICE_MEMORY="256MiB")
    assert result["platform"] == "neuron"
    assert result["greedy"] == cpu_run["greedy"] == hf_tokens


def test_tensor_parallel_2_equals_one_device(model_dir, neuron_eager):
    # Two ranks on one NUMA node: vLLM's thread binding needs each rank's cores (see docs/serving.md).
    result = _generate({"model": model_dir, "prompts": PROMPTS, "max_tokens": MAX_TOKENS, "eager": True, "tp": 2},
                       TORCHNEURON_DEVICE_MEMORY="256MiB", VLLM_CPU_OMP_THREADS_BIND="0|1")
    assert sorted(w["device"] for w in result["worker_memory"]) == ["neuron:0", "neuron:1"]
    assert {w["tp_backend"] for w in result["worker_memory"]} == {"neuron"}  # torchneuron.distributed
    assert result["greedy"] == neuron_eager["greedy"]


# ================================ a mixture-of-experts model ==========================================

@pytest.fixture(scope="module")
def mixtral_dir(tmp_path_factory) -> str:
    return _build_model(tmp_path_factory, "tiny_mixtral")


def test_mixtral_greedy_equals_cpu_vllm_and_hf(mixtral_dir):
    """A tiny Mixtral (4 experts, top-2) served on neuron through vLLM's fused MoE layer gives the CPU's tokens."""
    from transformers import MixtralForCausalLM

    spec = {"model": mixtral_dir, "prompts": PROMPTS[:3], "max_tokens": MAX_TOKENS}
    cpu = _generate({**spec, "kv_bytes": 64 << 20}, TORCHNEURON_VLLM="0")
    neuron = _generate({**spec, "eager": True, "util": 0.5}, TORCHNEURON_DEVICE_MEMORY="256MiB")
    assert (cpu["platform"], neuron["platform"]) == ("cpu", "neuron")
    assert neuron["prompt_ids"] == cpu["prompt_ids"]
    assert len({tuple(t) for t in cpu["greedy"]}) == 3  # the prompts' continuations differ
    assert neuron["greedy"] == cpu["greedy"]
    model = MixtralForCausalLM.from_pretrained(mixtral_dir, torch_dtype=torch.float32).eval()
    for ids, tokens in zip(cpu["prompt_ids"], cpu["greedy"]):
        with torch.no_grad():
            full = model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
                                  do_sample=False, pad_token_id=0)
        assert full[0, len(ids):].tolist() == tokens


# ================================ the OpenAI server ===================================================

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict, timeout: float = 60):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(request, timeout=timeout)


def _descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                if ppid == parent and int(entry.name) not in found:
                    found.add(int(entry.name))
                    todo.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _shared_memory_of(pids) -> set[str]:
    """The /dev/shm entries the processes ``pids`` have mapped or open (another program's, such as a
    second test suite's vLLM server on the same machine, are not theirs)."""
    names = set()
    for pid in pids:
        proc = Path("/proc") / str(pid)
        try:
            names.update(line.split("/dev/shm/", 1)[1].split(" (deleted)")[0].strip()
                         for line in (proc / "maps").read_text().splitlines() if "/dev/shm/" in line)
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("/dev/shm/"):
                    names.add(target[len("/dev/shm/"):].split(" (deleted)")[0])
        except OSError:
            continue
    return names


def test_openai_server_answers_and_shuts_down(model_dir, cpu_run):
    port = _free_port()
    shm_before = set(os.listdir("/dev/shm"))
    server = subprocess.Popen([str(VLLM_PY), "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
                               "--dtype", "float32", "--enforce-eager", "--max-model-len", "256", "--block-size", "32",
                               "--max-num-seqs", "8", "--host", "127.0.0.1", "--port", str(port)],
                              env=_env(TORCHNEURON_DEVICE_MEMORY="256MiB"), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        while True:
            assert server.poll() is None, f"server exited:\n{server.stderr.read()[-4000:]}"
            try:
                if urllib.request.urlopen(base + "/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.5)

        body = {"model": model_dir, "prompt": PROMPTS[0], "max_tokens": MAX_TOKENS, "temperature": 0,
                "ignore_eos": True, "return_token_ids": True}
        answer = json.load(_post(base + "/v1/completions", body))
        assert answer["choices"][0]["token_ids"] == cpu_run["greedy"][0]
        text = answer["choices"][0]["text"]

        chunks = []
        with _post(base + "/v1/completions", {**body, "stream": True, "return_token_ids": False}) as stream:
            for line in stream:
                line = line.decode().strip()
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:])["choices"][0]["text"])
                elif line == "data: [DONE]":
                    chunks.append(None)
        assert chunks[-1] is None and len(chunks) > 2  # streamed in pieces, closed by [DONE]
        assert "".join(chunks[:-1]) == text

        chat = json.load(_post(base + "/v1/chat/completions", {
            "model": model_dir, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5,
            "temperature": 0, "ignore_eos": True}))
        assert chat["choices"][0]["message"]["role"] == "assistant"
        assert chat["usage"]["completion_tokens"] == 5 and chat["choices"][0]["finish_reason"] == "length"

        children = _descendants(server.pid)
        assert children, "the engine runs in processes of its own"
        ours = _shared_memory_of([server.pid, *children]) - shm_before
        assert ours, "the engine's processes share memory with the server (vLLM's message queues)"
        start = time.monotonic()
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
        took = time.monotonic() - start
        time.sleep(0.5)
        assert took < 5.0, f"server took {took:.1f} s to exit after SIGTERM"
        assert not [pid for pid in children if _alive(pid)], "engine processes left behind"
        # What the server's processes had in shared memory is gone with them (entries another program
        # made meanwhile, such as a second suite's server, are not the server's to remove).
        assert ours & set(os.listdir("/dev/shm")) == set(), "shared memory left behind"
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


# ================================ the switch ==========================================================

def test_plugin_switch(monkeypatch):
    import torchneuron.vllm as plugin

    monkeypatch.setenv("TORCHNEURON_VLLM", "1")
    assert plugin.register() == "torchneuron.vllm.platform.NeuronPlatform"
    monkeypatch.setenv("TORCHNEURON_VLLM", "0")
    assert plugin.register() is None
    monkeypatch.setenv("TORCHNEURON_VLLM", "maybe")
    with pytest.raises(ValueError, match="TORCHNEURON_VLLM='maybe'"):
        plugin.register()


def test_plugin_entry_point_in_both_environments():
    code = ("import importlib.metadata as m; print(sorted(e.value for e in m.entry_points(group='vllm.platform_plugins')"
            " if e.name == 'neuron'))")
    for python in (sys.executable, str(VLLM_PY)):
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
        assert out.stdout.strip() == "['torchneuron.vllm:register']", (python, out.stderr[-2000:])
