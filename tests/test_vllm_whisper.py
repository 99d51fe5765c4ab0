"""Whisper (speech to text) through vLLM on neuron, driven in vLLM's own environment (``.venv-vllm``).

The model is a small Whisper with random weights drawn so that greedy decoding gives varied
tokens that depend on the audio, with a Whisper tokenizer and feature extractor built offline
(tests/data/vllm_tiny_whisper.py); the audio is sine waves written with the ``wave`` module.

* Greedy tokens of vLLM's offline ``LLM`` (encoder-decoder prompts: the audio for the encoder,
  ``<|startoftranscript|><|en|><|transcribe|><|notimestamps|>`` for the decoder) on neuron
  equal vLLM on the CPU (``TORCHNEURON_VLLM=0``) and a greedy loop over Hugging Face's
  Whisper on the CPU, token for token.
* The OpenAI server's ``/v1/audio/transcriptions`` answers a multipart upload of a WAV file
  (decoded by PyAV, ``av``) on neuron with the text the same endpoint gives on the CPU, and the
  text of the offline run on the same decoded audio.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest
import torch

from test_vllm import DATA, RUN_TIMEOUT, VLLM_PY, _env, _free_port

MAX_TOKENS = 16
TONES_HZ = (220, 440, 880, 1760)

pytestmark = pytest.mark.skipif(not VLLM_PY.exists(), reason="no .venv-vllm: run scripts/bootstrap.sh")


def _tiny_whisper():
    spec = importlib.util.spec_from_file_location("vllm_tiny_whisper", DATA / "vllm_tiny_whisper.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _has_av() -> bool:
    return subprocess.run([str(VLLM_PY), "-c", "import av"], capture_output=True, timeout=60).returncode == 0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny_whisper")
    proc = subprocess.run([sys.executable, str(DATA / "vllm_tiny_whisper.py"), str(path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return str(path)


@pytest.fixture(scope="module")
def wavs(tmp_path_factory) -> list[str]:
    root = tmp_path_factory.mktemp("tones")
    return [_tiny_whisper().sine_wav(root / f"{hz}.wav", hz) for hz in TONES_HZ]


def _start(args: list[str], **env: str) -> subprocess.Popen:
    return subprocess.Popen([str(VLLM_PY), *args], env=_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=RUN_TIMEOUT)
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"vLLM run failed ({proc.returncode}):\n{err[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


# Two runs side by side on the 2 cores, each bound to one of them.
NEURON_ENV = {"TORCHNEURON_DEVICE_MEMORY": "256MiB", "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "0"}
CPU_ENV = {"TORCHNEURON_VLLM": "0", "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "1"}


@pytest.fixture(scope="module")
def runs(model_dir, wavs) -> dict:
    """vLLM's offline LLM on neuron and on the CPU (its KV cache given explicitly), run at the same time."""
    spec = {"model": model_dir, "wavs": wavs, "max_tokens": MAX_TOKENS, "endpoint_wav": wavs[0]}
    script = str(DATA / "vllm_whisper.py")
    started = time.monotonic()
    neuron = _start([script, json.dumps({**spec, "util": 0.5})], **NEURON_ENV)
    cpu = _start([script, json.dumps({**spec, "kv_bytes": 64 << 20})], **CPU_ENV)
    result = {"neuron": _result(neuron), "cpu": _result(cpu), "seconds": time.monotonic() - started}
    assert result["neuron"]["platform"] == "neuron" and result["cpu"]["platform"] == "cpu"
    return result


@pytest.fixture(scope="module")
def hf_tokens(model_dir, wavs, runs) -> list[list[int]]:
    """A greedy loop over Hugging Face's Whisper on the CPU, from the decoder prompt vLLM tokenized."""
    import numpy as np
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    tiny = _tiny_whisper()
    model = WhisperForConditionalGeneration.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    features = WhisperFeatureExtractor.from_pretrained(model_dir)
    out = []
    for path, prompt in zip(wavs, runs["cpu"]["prompt_ids"]):
        audio = np.array(tiny.read_wav(path), dtype=np.float32)
        mel = features(audio, sampling_rate=tiny.SAMPLE_RATE, return_tensors="pt").input_features
        ids = torch.tensor([prompt])
        with torch.no_grad():
            encoded = model.model.encoder(mel).last_hidden_state
            for _ in range(MAX_TOKENS):
                logits = model(encoder_outputs=(encoded,), decoder_input_ids=ids).logits[0, -1]
                ids = torch.cat([ids, logits.argmax().view(1, 1)], dim=1)
        out.append(ids[0, len(prompt):].tolist())
    return out


def test_greedy_tokens_are_not_trivial(hf_tokens):
    # Each transcription has several distinct tokens, and the audio changes them: equality below means something.
    assert all(len(t) == MAX_TOKENS and len(set(t)) >= 3 for t in hf_tokens), hf_tokens
    assert len({tuple(t) for t in hf_tokens}) == len(TONES_HZ), hf_tokens


def test_whisper_greedy_neuron_equals_cpu_vllm_and_hf(runs, hf_tokens):
    neuron, cpu = runs["neuron"], runs["cpu"]
    assert neuron["prompt_ids"] == cpu["prompt_ids"]
    assert len(set(map(tuple, cpu["prompt_ids"]))) == 1 and len(cpu["prompt_ids"][0]) == 4  # the 4 special tokens
    assert neuron["tokens"] == cpu["tokens"]
    assert neuron["text"] == cpu["text"]
    assert neuron["tokens"][:len(TONES_HZ)] == hf_tokens
    (worker,) = neuron["worker_memory"]
    assert worker["device"] == "neuron:0" and worker["kv_cache_bytes"] > 0


# ================================ the transcription endpoint ==========================================

def _transcribe(base: str, model: str, wav: str) -> dict:
    boundary = uuid.uuid4().hex
    fields = {"model": model, "language": "en", "temperature": "0", "response_format": "json",
              "max_completion_tokens": str(MAX_TOKENS)}
    body = b"".join(f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
                    for k, v in fields.items())
    body += (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="tone.wav"\r\n'
             f"Content-Type: audio/wav\r\n\r\n").encode() + open(wav, "rb").read() + f"\r\n--{boundary}--\r\n".encode()
    request = urllib.request.Request(base + "/v1/audio/transcriptions", data=body,
                                     headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        assert answer.status == 200
        return json.load(answer)


def _wait_healthy(server: subprocess.Popen, base: str) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT
    while True:
        assert server.poll() is None, f"server exited:\n{server.stderr.read()[-4000:]}"
        try:
            if urllib.request.urlopen(base + "/health", timeout=2).status == 200:
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.5)


def test_transcription_endpoint_neuron_equals_cpu(model_dir, wavs, runs):
    if not _has_av():
        pytest.fail("PyAV (av) is missing from .venv-vllm: run scripts/bootstrap.sh")
    args = ["-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--dtype", "float32", "--enforce-eager",
            "--max-model-len", "128", "--block-size", "32", "--max-num-seqs", "8", "--max-num-batched-tokens", "256",
            "--host", "127.0.0.1"]
    ports = {"neuron": _free_port(), "cpu": _free_port()}
    servers = {
        "neuron": subprocess.Popen([str(VLLM_PY), *args, "--port", str(ports["neuron"]),
                                    "--gpu-memory-utilization", "0.5"], env=_env(**NEURON_ENV),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True),
        "cpu": subprocess.Popen([str(VLLM_PY), *args, "--port", str(ports["cpu"]),
                                 "--kv-cache-memory-bytes", str(64 << 20)], env=_env(**CPU_ENV),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True),
    }
    try:
        texts = {}
        for name, server in servers.items():
            base = f"http://127.0.0.1:{ports[name]}"
            _wait_healthy(server, base)
            texts[name] = _transcribe(base, model_dir, wavs[0])["text"]
        # The offline run's last request is the same file decoded as the endpoint decodes it.
        offline = runs["cpu"]["text"][-1]
        assert len(runs["cpu"]["tokens"][-1]) == MAX_TOKENS and len(set(runs["cpu"]["tokens"][-1])) >= 3
        assert texts["neuron"] == texts["cpu"], texts
        assert texts["neuron"].strip() == offline.strip(), (texts, offline)
        assert runs["neuron"]["tokens"][-1] == runs["cpu"]["tokens"][-1]
    finally:
        for server in servers.values():
            if server.poll() is None:
                server.send_signal(signal.SIGTERM)
        for server in servers.values():
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
