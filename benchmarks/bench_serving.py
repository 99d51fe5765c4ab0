"""Serving with vLLM: neuron (torchneuron's platform plugin) against vLLM on the CPU, through the OpenAI server.

    python benchmarks/bench_serving.py            # concurrencies 1, 4, 8; 3 rounds
    python benchmarks/bench_serving.py --quick    # concurrencies 1, 4; 2 rounds, fewer requests

Two OpenAI servers run side by side from ``.venv-vllm`` (made by
scripts/bootstrap.sh): one on neuron, one on the CPU (``TORCHNEURON_VLLM=0``),
each in eager mode with the same model (a Llama with random weights built
here: hidden 512, 4 layers, 8 heads), the same KV cache size, prefix caching
and chunked prefill, and the same fixed number of OpenMP threads bound to the
same cores. For each concurrency a fixed set of requests (prompts of 24-72
tokens, 64 output tokens each, ``ignore_eos``) is sent with at most that many
in flight, streamed, and timed at the client: output tokens per second over
the whole set, time to first token (TTFT) and time per output token after the
first (TPOT), medians over requests. Rounds alternate which server goes first,
and figures are medians over rounds; the ratio is neuron's throughput over the
CPU's (target >= 0.95). Results go to benchmarks/results/serving.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
RESULTS = ROOT / "benchmarks" / "results"
WORDS = "the quick brown fox jumps over the lazy dog hello world this is a small test of serving".split()
TARGET = 0.95


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, side: str, threads: int, kv_bytes: int) -> tuple[subprocess.Popen, str]:
    port = _port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env.update({"OMP_NUM_THREADS": str(threads), "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}",
                "TORCHNEURON_VLLM": "1" if side == "neuron" else "0", "VLLM_LOGGING_LEVEL": "WARNING"})
    # Both servers with PyTorch's libgomp preloaded, as vLLM's CPU install guide asks
    # (https://docs.vllm.ai/en/latest/getting_started/installation/cpu/): vLLM's CPU platform adds it to
    # LD_PRELOAD by itself, the neuron platform writes no environment.
    gomp = sorted((VLLM_PY.parents[1] / "lib").glob("python3*/site-packages/torch/lib/libgomp*.so*"))
    if gomp and "libgomp" not in env.get("LD_PRELOAD", ""):
        env["LD_PRELOAD"] = ":".join(filter(None, [env.get("LD_PRELOAD"), str(gomp[0])]))
    cmd = [str(VLLM_PY), "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--dtype", "float32",
           "--enforce-eager", "--max-model-len", "512", "--block-size", "32", "--max-num-seqs", "16",
           "--kv-cache-memory-bytes", str(kv_bytes), "--enable-prefix-caching", "--host", "127.0.0.1",
           "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(proc: subprocess.Popen, base: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if urllib.request.urlopen(base + "/health", timeout=2).status == 200:
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError("server did not start")


def one_request(base: str, model: str, prompt: str, max_tokens: int) -> tuple[float, float, int]:
    """(TTFT s, end s, output tokens) of a streamed completion."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    request = urllib.request.Request(base + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    first = None
    tokens = 0
    with urllib.request.urlopen(request, timeout=600) as stream:
        for line in stream:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if first is None and chunk.get("choices") and chunk["choices"][0].get("text") is not None:
                first = time.perf_counter() - start
    return first or 0.0, time.perf_counter() - start, tokens


def run_set(base: str, model: str, prompts: list[str], concurrency: int, max_tokens: int) -> dict:
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        done = list(pool.map(lambda p: one_request(base, model, p, max_tokens), prompts))
    wall = time.perf_counter() - start
    tokens = sum(t for _, _, t in done)
    return {"throughput": tokens / wall, "ttft": statistics.median(f for f, _, _ in done),
            "tpot": statistics.median((e - f) / max(t - 1, 1) for f, e, t in done), "tokens": tokens}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--concurrency", type=str, default=None, help="comma-separated (default 1,4,8)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--requests", type=int, default=None, help="requests per set (default 16)")
    parser.add_argument("--threads", type=int, default=1, help="OpenMP threads of each server (default 1)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path, default=RESULTS / "serving.json")
    args = parser.parse_args(argv)
    if not VLLM_PY.exists():
        parser.error("no .venv-vllm: run scripts/bootstrap.sh")
    concurrencies = [int(c) for c in (args.concurrency or ("1,4" if args.quick else "1,4,8")).split(",")]
    rounds = args.rounds or (2 if args.quick else 3)
    n = args.requests or (8 if args.quick else 16)
    prompts = [" ".join(WORDS[(i * 3 + j) % len(WORDS)] for j in range(24 + (i * 7) % 48)) for i in range(n)]

    tmp = tempfile.mkdtemp(prefix="bench_serving_")
    subprocess.run([sys.executable, str(ROOT / "tests" / "data" / "vllm_tiny_llama.py"), tmp, "512", "4", "8"],
                   check=True, capture_output=True)
    # A terminated benchmark stops its servers too: SIGTERM unwinds through the finally below.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    servers = {side: start_server(tmp, side, args.threads, 256 << 20) for side in ("cpu", "neuron")}
    try:
        for proc, base in servers.values():
            wait_ready(proc, base)
        for side, (_, base) in servers.items():  # warm-up
            run_set(base, tmp, prompts[:4], 4, 8)
        samples = {(side, c): [] for side in servers for c in concurrencies}
        for r in range(rounds):
            order = ["cpu", "neuron"] if r % 2 == 0 else ["neuron", "cpu"]
            for c in concurrencies:
                for side in order:
                    samples[(side, c)].append(run_set(servers[side][1], tmp, prompts, c, args.max_tokens))
    finally:
        for proc, _ in servers.values():
            proc.send_signal(signal.SIGTERM)
        for proc, _ in servers.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()

    def med(side, c, key):
        return statistics.median(s[key] for s in samples[(side, c)])

    rows = []
    print(f"vLLM serving, {n} requests x {args.max_tokens} output tokens, {args.threads} OpenMP thread(s), "
          f"medians of {rounds} interleaved rounds")
    print(f"{'concurrency':>11} | {'CPU tok/s':>9} | {'neuron tok/s':>12} | {'ratio':>5} | {'CPU TTFT':>8} | "
          f"{'neuron TTFT':>11} | {'CPU TPOT':>8} | {'neuron TPOT':>11}")
    for c in concurrencies:
        row = {"concurrency": c, **{f"{side}_{key}": med(side, c, key) for side in servers
                                    for key in ("throughput", "ttft", "tpot")}}
        row["ratio"] = row["neuron_throughput"] / row["cpu_throughput"]
        rows.append(row)
        print(f"{c:>11} | {row['cpu_throughput']:>9.1f} | {row['neuron_throughput']:>12.1f} | {row['ratio']:>5.2f} | "
              f"{row['cpu_ttft'] * 1e3:>6.1f}ms | {row['neuron_ttft'] * 1e3:>9.1f}ms | "
              f"{row['cpu_tpot'] * 1e3:>6.2f}ms | {row['neuron_tpot'] * 1e3:>9.2f}ms")
    worst = min(r["ratio"] for r in rows)
    print(f"throughput ratio neuron/CPU: worst {worst:.2f} (target >= {TARGET})")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"suite": "serving", "threads": args.threads, "rounds": rounds, "requests": n,
                                     "max_tokens": args.max_tokens, "target": TARGET, "rows": rows,
                                     "samples": {f"{s}@{c}": v for (s, c), v in samples.items()}}, indent=1))
    print(f"wrote {args.json}")
    return 0 if worst >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
