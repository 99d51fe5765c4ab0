"""CUDA training scripts run unchanged (layer) and rewritten (migrate); doctor and parity on them.

The scripts in ``tests/data/cuda_scripts/`` are written for CUDA. The reference is
each script run with CUDA standing for the CPU; runs on neuron draw their random
numbers from the CPU generator (``host_rng``), so they must print the same losses.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from torchneuron.migrate import cuda_compat
from torchneuron.migrate.host_rng import HostRNGMode
from torchneuron.migrate.parity import compare, format_result, run_parity
from torchneuron.migrate.rewrite import main as migrate
from torchneuron.migrate.runner import parse_printed_losses, run_script

SCRIPTS = Path(__file__).resolve().parent / "data" / "cuda_scripts"
# name -> (arguments, rtol): float16 autocast lists differ between the CPU and neuron (CUDA's lists).
CASES = {
    "cnn_amp.py": (["--steps", "3", "--batch-size", "8"], 1e-2),
    "transformer_ckpt.py": (["--steps", "2"], 1e-6),
}


def _run(path: Path, args, device=None, host_rng=False) -> list[float]:
    """Run a script in this process (layer on for ``device``), return the losses it printed."""
    out = io.StringIO()
    if device is not None:
        cuda_compat.enable(device, host_rng=host_rng)
    mode = HostRNGMode() if host_rng and device is None else contextlib.nullcontext()
    flags = (torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark)
    try:
        with contextlib.redirect_stdout(out), mode:
            result = run_script(str(path), args)
    finally:
        cuda_compat.disable()
        torch.set_float32_matmul_precision(flags[0])  # the scripts set CUDA flags (allow_tf32, ...)
        torch.backends.cudnn.benchmark = flags[1]
    assert result.exit_code == 0, result.error
    losses = parse_printed_losses(out.getvalue())
    assert losses and all(map(torch.isfinite, torch.tensor(losses))), out.getvalue()
    return losses


@pytest.fixture(scope="module")
def cpu_losses():
    """Each script's losses with CUDA standing for the CPU: the reference."""
    return {name: _run(SCRIPTS / name, args, "cpu") for name, (args, _) in CASES.items()}


@pytest.fixture(scope="module")
def migrated(tmp_path_factory):
    """A copy of the scripts rewritten by ``torchneuron migrate --write``."""
    out = tmp_path_factory.mktemp("migrated")
    for name in CASES:
        shutil.copy(SCRIPTS / name, out / name)
    assert migrate([str(out)], write=True, out=io.StringIO()) == 0
    return out


@pytest.mark.parametrize("name", CASES)
def test_script_runs_unchanged_on_neuron(name, cpu_losses, tmp_path):
    args, rtol = CASES[name]
    neuron = _run(SCRIPTS / name, args, "neuron", host_rng=True)
    torch.testing.assert_close(neuron, cpu_losses[name], rtol=rtol, atol=1e-6)
    assert len(set(neuron)) > 1


@pytest.mark.parametrize("name", CASES)
def test_migrated_script_runs_on_neuron(name, cpu_losses, migrated):
    text = (migrated / name).read_text().split('"""', 2)[2]  # the code after the docstring
    assert ".cuda(" not in text and "torch.cuda.amp" not in text and "torch.cuda.manual_seed" not in text
    args, rtol = CASES[name]
    neuron = _run(migrated / name, args, host_rng=True)  # no compatibility layer
    torch.testing.assert_close(neuron, cpu_losses[name], rtol=rtol, atol=1e-6)


def test_migrated_script_runs_on_a_cpu_only_torch(cpu_losses, migrated):
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")  # no torchneuron, no accelerator
    args, rtol = CASES["transformer_ckpt.py"]
    proc = subprocess.run([sys.executable, str(migrated / "transformer_ckpt.py"), *args],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    torch.testing.assert_close(parse_printed_losses(proc.stdout), cpu_losses["transformer_ckpt.py"],
                               rtol=rtol, atol=1e-6)


def test_doctor_names_the_sync_line(tmp_path, capsys):
    from torchneuron.cli import main

    report_path = tmp_path / "report.json"
    script = SCRIPTS / "mlp_item.py"
    assert main(["doctor", str(script), "4", "--json", str(report_path)]) == 0
    out = capsys.readouterr().out
    report = json.loads(report_path.read_text())
    item_line = next(i for i, line in enumerate(script.read_text().splitlines(), 1)
                     if line.strip().startswith("running += loss.item()"))
    site = next(s for s in report["syncs"] if s["line"] == item_line)
    assert site["file"] == str(script) and site["count"] == 4 and "item()" in site["code"]
    assert "scalar read" in site["kind"]
    assert f"mlp_item.py:{item_line}" in out and "Host-device syncs" in out
    ops = {o["op"]: o for o in report["ops"]}
    assert ops["aten::addmm"]["calls"] >= 8 and ops["aten::addmm"]["time_ms"] > 0
    assert report["transfers"]["host_to_device_bytes"] > 0 and report["transfers"]["scalar_reads"] >= 4
    assert report["peak_memory_bytes"]["neuron:0"] > 0 and report["compile"]["used"] is False
    apis = {c["api"] for c in report["cuda_calls"]}
    assert {"Tensor.cuda()", "torch.cuda.manual_seed_all"} <= apis


def test_doctor_counts_graph_breaks(tmp_path):
    from torchneuron.migrate.doctor import diagnose

    script = tmp_path / "compiled.py"
    script.write_text(textwrap.dedent("""
        import torch

        @torch.compile(backend="eager")
        def f(x):
            y = x.sin()
            if y.sum() > 0:          # data-dependent branch: a graph break and a sync
                y = y * 2
            return y.cos()

        for n in (4, 4, 5):
            print(f(torch.ones(n, device="cuda")))
    """))
    torch._dynamo.reset()
    report = diagnose(str(script))
    assert report["exit_code"] == 0, report["error"]
    c = report["compile"]
    assert c["used"] and c["graph_breaks"] >= 1 and c["graphs"] >= 2
    kinds = {(s["kind"].split(" ")[0], s["line"]) for s in report["syncs"]}
    assert ("scalar", 7) in kinds and ("printing/formatting", 12) in kinds


def test_doctor_trace_writes_the_profile_and_lists_device_time(tmp_path, capsys):
    from torchneuron.cli import main

    trace_path, report_path = tmp_path / "trace.json", tmp_path / "report.json"
    script = SCRIPTS / "mlp_item.py"
    assert main(["doctor", "--trace", str(trace_path), str(script), "3", "--json", str(report_path)]) == 0
    out = capsys.readouterr().out
    report = json.loads(report_path.read_text())
    assert report["trace"] == str(trace_path)
    device_ops = {o["op"]: o for o in report["device_ops"]}
    assert device_ops["aten::addmm"]["calls"] >= 6 and device_ops["aten::addmm"]["device_time_ms"] > 0
    times = [o["device_time_ms"] for o in report["device_ops"]]
    assert times == sorted(times, reverse=True)
    assert "Device time by op (torch.profiler)" in out and "aten::addmm" in out
    events = json.loads(trace_path.read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert any(k["name"] == "addmm" and k["pid"] == 0 for k in kernels)
    assert any(e.get("cat") == "gpu_memcpy" for e in events)  # the batches' copies to the device


def test_doctor_leaves_dynamos_counters_as_it_found_them(tmp_path):
    import torch._dynamo.utils

    from torchneuron.migrate.doctor import diagnose

    counters = torch._dynamo.utils.counters
    counters["stats"]["sentinel_from_before"] += 3
    script = tmp_path / "compiled.py"
    script.write_text(textwrap.dedent("""
        import torch
        f = torch.compile(lambda x: x.sin() + 1, backend="eager")
        print(f(torch.ones(3, device="cuda")).sum().item())
    """))
    report = diagnose(str(script))
    assert report["exit_code"] == 0, report["error"]
    assert counters["stats"]["sentinel_from_before"] == 3  # what was there stays
    assert "sentinel_from_before" not in report["compile"]  # and the report counts the program's only
    assert report["compile"]["used"] and report["compile"]["frames_compiled"] >= 1
    del counters["stats"]["sentinel_from_before"]


def test_parity_passes_on_a_correct_script(tmp_path):
    result = run_parity(str(SCRIPTS / "mlp_item.py"), ["3"], timeout=300)
    text = format_result(result, "mlp_item.py")
    assert result.ok, text
    assert result.source == "backward" and len(result.cpu) == 3 and result.first_divergence is None
    assert "PASS" in text


def test_parity_reports_the_first_divergence():
    assert compare([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], 1e-4, 1e-5) is None
    assert compare([1.0, 2.0, 3.0], [1.0, 2.1, 3.5], 1e-4, 1e-5) == 1
    assert compare([1.0, 2.0, 3.0], [1.0, 2.0], 1e-4, 1e-5) == 2
    from torchneuron.migrate.parity import ParityResult

    r = ParityResult(False, "backward", [1.0, 2.0], [1.0, 2.5], 1, 1e-4, 1e-5,
                     {d: {"exit_code": 0, "wall_time_s": 0.1, "autocast": False, "stderr_tail": ""}
                      for d in ("cpu", "neuron")})
    assert "FAIL: first divergence at loss 1: cpu 2 vs neuron 2.5" in format_result(r, "x.py")


def test_printed_losses_are_parsed():
    text = "step 0 loss=1.5\nepoch 1 | train loss: 2.5e-01 | acc 3\nno number here\nLoss 7\n"
    assert parse_printed_losses(text) == [1.5, 0.25, 7.0]
