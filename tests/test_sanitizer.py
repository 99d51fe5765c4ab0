"""The stream sanitizer: the bug corpus (tests/data/async_bugs), its reports, its API and its command."""

import glob
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torchneuron

from torchneuron.neuron import _sanitizer

CORPUS = os.path.join(os.path.dirname(__file__), "data", "async_bugs")

# What the sanitizer must report for each buggy program (its twin, *_fixed.py, must give nothing).
EXPECTED = {
    "d2h_read_before_sync": "host-read-before-sync",
    "sync_wrong_stream": "host-read-before-sync",
    "side_stream_producer": "unsynchronized-access",
    "side_stream_consumer": "unsynchronized-access",
    "prefetch_without_wait": "unsynchronized-access",
    "overwrite_in_use_buffer": "unsynchronized-access",
    "free_without_record_stream": "free-without-record-stream",
    "elapsed_time_without_sync": "elapsed-time-before-sync",
    "pinned_buffer_reuse": "pinned-buffer-reused",
}

# With asynchronous streams (TORCHNEURON_ASYNC=1, strict mode) these bugs may also raise by themselves.
FAILS_ASYNCHRONOUSLY = {
    "elapsed_time_without_sync": "must be completed before calculating elapsed time",
}


def _bug_line(path):
    with open(path) as f:
        marked = [i for i, line in enumerate(f, 1) if "# BUG" in line]
    assert len(marked) == 1, f"{path}: mark the one buggy line with '# BUG'"
    return marked[0]


def test_corpus_is_complete():
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(CORPUS, "*.py")))
    assert len(EXPECTED) >= 8
    assert names == sorted([f"{n}_bug.py" for n in EXPECTED] + [f"{n}_fixed.py" for n in EXPECTED])


_RUN_ALL = textwrap.dedent("""
    import json, sys
    from torchneuron.migrate.doctor import sanitize
    print(json.dumps({path: sanitize(path) for path in sys.argv[1:]}))
""")


@pytest.fixture(scope="module")
def corpus_reports():
    """Every corpus program run under the sanitizer in one fresh process (`doctor.sanitize`)."""
    paths = sorted(glob.glob(os.path.join(CORPUS, "*.py")))
    proc = subprocess.run([sys.executable, "-c", _RUN_ALL, *paths], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_buggy_program_is_caught_at_its_line(corpus_reports, name):
    path = os.path.join(CORPUS, f"{name}_bug.py")
    report = corpus_reports[path]
    if report["error"] is not None and torchneuron._C._async_mode() and name in FAILS_ASYNCHRONOUSLY:
        # With asynchronous streams the bug also fails on its own, as on a real device.
        assert FAILS_ASYNCHRONOUSLY[name] in report["error"], report["error"]
    else:
        assert report["exit_code"] == 0 and report["error"] is None
    assert report["findings"], f"{name}: no finding"
    kinds = {f["kind"] for f in report["findings"]}
    assert kinds == {EXPECTED[name]}, report["findings"]
    line = _bug_line(path)
    for finding in report["findings"]:
        here = finding["sites"][0]
        assert os.path.samefile(here["file"], path) and here["line"] == line, finding
        assert f"{os.path.basename(path)}:{line}" in finding["title"]
        assert finding["title"].startswith(_sanitizer.KINDS[EXPECTED[name]])
        if EXPECTED[name] != "elapsed-time-before-sync":  # the other access, on its own line
            other = finding["sites"][1]
            assert os.path.samefile(other["file"], path) and other["line"] != line and other["code"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixed_twin_passes(corpus_reports, name):
    report = corpus_reports[os.path.join(CORPUS, f"{name}_fixed.py")]
    assert report["exit_code"] == 0 and report["error"] is None
    assert report["findings"] == []


def test_doctor_command_lists_findings_and_fails(tmp_path):
    out = tmp_path / "report.json"
    bug = os.path.join(CORPUS, "side_stream_producer_bug.py")
    proc = subprocess.run([sys.executable, "-m", "torchneuron", "doctor", "--sanitize", "--json", str(out), bug],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "unsynchronized access between streams at side_stream_producer_bug.py:11" in proc.stdout
    assert "side_stream_producer_bug.py:10: features = encoder(x).relu()" in proc.stdout
    assert json.loads(out.read_text())["findings"][0]["kind"] == "unsynchronized-access"
    fixed = os.path.join(CORPUS, "side_stream_producer_fixed.py")
    proc = subprocess.run([sys.executable, "-m", "torchneuron", "doctor", fixed, "--sanitize"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "no synchronization bug found" in proc.stdout, proc.stdout + proc.stderr


def test_env_variable_raises_at_the_first_bug():
    bug = os.path.join(CORPUS, "d2h_read_before_sync_bug.py")
    proc = subprocess.run([sys.executable, bug], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TORCHNEURON_SANITIZER": "1"})
    assert proc.returncode == 1
    assert "NeuronSanitizerError" in proc.stderr
    assert f"before synchronization at {bug}:14" in proc.stderr
    fixed = os.path.join(CORPUS, "d2h_read_before_sync_fixed.py")
    proc = subprocess.run([sys.executable, fixed], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TORCHNEURON_SANITIZER": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.fixture
def sanitizer():
    _sanitizer.enable("record")
    try:
        yield _sanitizer
    finally:
        _sanitizer.disable()


def test_api_records_and_disable_restores(sanitizer):
    assert sanitizer.is_enabled()
    side = torch.neuron.Stream()
    assert type(side).__name__ == "_TracedStream" and isinstance(side, torch.neuron.Stream)
    x = torch.ones(16, device="neuron")
    with torch.neuron.stream(side):
        y = x + 1
    assert [r.kind for r in sanitizer.reports()] == ["unsynchronized-access"]
    torch.neuron.current_stream().wait_stream(side)
    (y * 2).sum()
    assert len(sanitizer.reports()) == 1
    found = sanitizer.disable()
    assert len(found) == 1 and not sanitizer.is_enabled()
    assert type(torch.neuron.Stream()) is torch.Stream
    with torch.neuron.stream(torch.neuron.Stream()):
        x + 1
    assert sanitizer.reports() == []
    freed = []  # the allocator stops firing PyTorch's GPU trace (which stays on) once the sanitizer is off
    note = freed.append
    torch.neuron._gpu_trace.MemoryDeallocationCallbacks.add_callback(note)
    try:
        del y, x
        assert freed == []
    finally:
        torch.neuron._gpu_trace.remove_callback(torch.neuron._gpu_trace.MemoryDeallocationCallbacks, note)
    sanitizer.enable("record")  # the fixture turns it off


def test_events_order_streams(sanitizer):
    side = torch.neuron.Stream()
    x = torch.randn(32, device="neuron")
    ready = torch.neuron.Event()
    ready.record()
    ready.wait(side)
    with torch.neuron.stream(side):
        y = x * 2
    done = side.record_event()
    torch.neuron.current_stream().wait_event(done)
    z = y + x
    assert sanitizer.reports() == []
    start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    start.record()
    z.sum()
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 0
    assert sanitizer.reports() == []


def test_record_stream_and_host_sync_make_frees_safe(sanitizer):
    side = torch.neuron.Stream()
    a, b, c = (torch.randn(64, device="neuron") for _ in range(3))
    side.wait_stream(torch.neuron.current_stream())
    with torch.neuron.stream(side):
        a.sum(), b.sum(), c.sum()
    a.record_stream(side)
    del a                      # recorded
    side.synchronize()
    del b                      # the host waited for the side stream
    torch.neuron.current_stream().wait_stream(side)
    del c                      # the allocating stream waited
    assert sanitizer.reports() == []
    d = torch.randn(64, device="neuron")
    side.wait_stream(torch.neuron.current_stream())
    with torch.neuron.stream(side):
        d.sum()
    del d                      # none of these
    assert [r.kind for r in sanitizer.reports()] == ["free-without-record-stream"]


def test_blocking_copy_and_item_synchronize_the_host(sanitizer):
    x = torch.randn(8, device="neuron")
    host = x.to("cpu", non_blocking=True)
    x.sum().item()             # waits for the current stream, hence for the copy too
    host.sum()
    assert sanitizer.reports() == []
    pageable = torch.randn(8)
    y = pageable.to("neuron", non_blocking=True)  # from pageable memory: a synchronous copy on any device
    pageable.add_(1)
    assert sanitizer.reports() == []


def test_raise_mode_raises_pytorch_style_error():
    _sanitizer.enable("raise")
    try:
        side = torch.neuron.Stream()
        x = torch.ones(4, device="neuron")
        with pytest.raises(_sanitizer.NeuronSanitizerError, match="unsynchronized access between streams at") as e:
            with torch.neuron.stream(side):
                x * 3
        assert isinstance(e.value, RuntimeError) and e.value.reports[0].sites[0].lineno > 0
    finally:
        _sanitizer.disable()


def test_bad_mode_is_a_clear_error():
    with pytest.raises(ValueError, match="on_report must be one of raise, warn, record"):
        torch.neuron.enable_sanitizer("loud")
    assert not _sanitizer.is_enabled()
