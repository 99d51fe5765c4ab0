"""Memory history and snapshots in PyTorch's CUDA structure, their HTML views and the OOM dump."""

import os
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.cuda import _memory_viz

MiB = 1 << 20
THIS_FILE = os.path.basename(__file__)


@pytest.fixture(autouse=True)
def _history_off():
    torch.neuron.empty_cache()
    yield
    torch.neuron.memory._record_memory_history(enabled=None)
    torch.neuron.empty_cache()


def _record(**kwargs):
    kwargs.setdefault("stacks", "python")
    torch.neuron.memory._record_memory_history(clear_history=True, **kwargs)


def _device0_segments(snapshot):
    return [s for s in snapshot["segments"] if s["device"] == 0]


def _check_consistent(snapshot):
    segments = _device0_segments(snapshot)
    assert sum(s["total_size"] for s in segments) == torch.neuron.memory_reserved(0)
    active = sum(b["size"] for s in segments for b in s["blocks"] if b["state"] == "active_allocated")
    assert active == torch.neuron.memory_allocated(0)
    assert sum(s["allocated_size"] for s in segments) == active
    stats = torch.neuron.memory_stats(0)
    assert len(segments) == stats["segment.all.current"]
    for s in segments:
        assert s["segment_type"] in ("small", "large") and s["stream"] == 0
        assert sum(b["size"] for b in s["blocks"]) == s["total_size"]
        assert s["blocks"][0]["address"] == s["address"]


def test_snapshot_matches_memory_stats_and_records_python_frames():
    _record()
    a = torch.empty(MiB, dtype=torch.uint8, device="neuron")
    b = torch.empty(3 * MiB, dtype=torch.uint8, device="neuron")
    a_ptr, b_ptr = a.data_ptr(), b.data_ptr()
    del a
    snapshot = torch.neuron.memory._snapshot()
    assert set(snapshot) >= {"segments", "device_traces"}
    assert len(snapshot["device_traces"]) == torch.neuron.device_count()
    _check_consistent(snapshot)

    blocks = {blk["address"]: blk for s in snapshot["segments"] for blk in s["blocks"]}
    assert blocks[a_ptr]["state"] == "inactive"            # cached
    live = blocks[b_ptr]
    assert live["state"] == "active_allocated" and live["requested_size"] == 3 * MiB
    assert any(f["filename"].endswith(THIS_FILE) and f["name"] == "test_snapshot_matches_memory_stats_and_records_python_frames"
               for f in live["frames"]), live["frames"]

    # The trace: each new block's segment, its allocation, then a's free, in order, with sizes.
    trace = [(e["action"], e["addr"], e["size"]) for e in snapshot["device_traces"][0]]
    assert trace == [
        ("segment_alloc", a_ptr, MiB), ("alloc", a_ptr, MiB),
        ("segment_alloc", b_ptr, 3 * MiB), ("alloc", b_ptr, 3 * MiB),
        ("free_requested", a_ptr, MiB), ("free_completed", a_ptr, MiB),
    ], trace
    for e in snapshot["device_traces"][0]:
        assert e["stream"] == 0 and e["time_us"] > 0
        assert any(f["filename"].endswith(THIS_FILE) for f in e["frames"]), e

    torch.neuron.empty_cache()
    after = torch.neuron.memory._snapshot()
    assert after["device_traces"][0][-1]["action"] == "segment_free"
    assert after["device_traces"][0][-1]["addr"] == a_ptr
    _check_consistent(after)
    del b


def test_training_step_snapshot_is_consistent():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    _record(context="all")
    for _ in range(2):
        loss = model(torch.randn(16, 32, device="neuron")).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    snapshot = torch.neuron.memory._snapshot()
    _check_consistent(snapshot)
    actions = {e["action"] for e in snapshot["device_traces"][0]}
    assert {"alloc", "free_requested", "free_completed"} <= actions
    # Every free names a block that was allocated (or alive) at an address the trace saw.
    names = {f["name"] for e in snapshot["device_traces"][0] for f in e["frames"]}
    assert "test_training_step_snapshot_is_consistent" in names
    assert "backward" in names or "step" in names


def test_context_and_stacks_options():
    _record(context="state")
    x = torch.empty(1000, device="neuron")
    snapshot = torch.neuron.memory._snapshot()
    trace = snapshot["device_traces"][0]
    assert trace and all(e["frames"] == [] for e in trace)  # tracebacks for live blocks only
    block = next(b for s in snapshot["segments"] for b in s["blocks"] if b["address"] == x.data_ptr())
    assert block["frames"]

    _record(enabled="state")
    y = torch.empty(1000, device="neuron")
    snapshot = torch.neuron.memory._snapshot()
    assert snapshot["device_traces"][0] == []               # no history, only state
    block = next(b for s in snapshot["segments"] for b in s["blocks"] if b["address"] == y.data_ptr())
    assert any(f["filename"].endswith(THIS_FILE) for f in block["frames"])

    _record(stacks="all", max_entries=8)
    z = torch.empty(1000, device="neuron")
    frames = torch.neuron.memory._snapshot()["device_traces"][0][-1]["frames"]
    assert any(f["filename"].endswith(THIS_FILE) for f in frames)
    assert any("allocator.cpp" in f["filename"] or "torchneuron" in f["name"] for f in frames)
    del x, y, z

    with pytest.raises(ValueError, match="enabled must be"):
        torch.neuron.memory._record_memory_history(enabled="sometimes")
    with pytest.raises(ValueError, match="max_entries"):
        torch.neuron.memory._record_memory_history(max_entries=0)


def test_recording_off_keeps_nothing():
    _record()
    torch.neuron.memory._record_memory_history(enabled=None)
    x = torch.empty(1000, device="neuron")
    snapshot = torch.neuron.memory._snapshot()
    assert all(t == [] for t in snapshot["device_traces"])
    assert all(b["frames"] == [] for s in snapshot["segments"] for b in s["blocks"])
    _check_consistent(snapshot)  # the state is there without recording
    del x


def test_max_entries_bounds_the_ring_and_keeps_the_newest():
    _record(max_entries=10)
    sizes = [512 * (i + 1) for i in range(20)]
    for n in sizes:
        t = torch.empty(n, dtype=torch.uint8, device="neuron")
        del t
    trace = torch.neuron.memory._snapshot()["device_traces"][0]
    assert len(trace) == 10
    # The last tensor's segment_alloc, alloc, free_requested and free_completed end the history.
    assert [e["action"] for e in trace[-4:]] == ["segment_alloc", "alloc", "free_requested", "free_completed"]
    assert all(e["size"] == sizes[-1] for e in trace[-4:])
    assert [e["time_us"] for e in trace] == sorted(e["time_us"] for e in trace)


def test_dump_snapshot_round_trips_and_renders(tmp_path):
    _record()
    x = torch.ones(4096, device="neuron") * 2
    path = tmp_path / "snap.pickle"
    torch.neuron.memory._dump_snapshot(str(path))
    with open(path, "rb") as f:
        loaded = pickle.load(f)
    assert loaded == torch.neuron.memory._snapshot()
    assert loaded["device_traces"][0] and loaded["segments"]

    trace_html = _memory_viz.trace_plot(loaded)
    segment_html = _memory_viz.segment_plot(loaded)
    for html in (trace_html, segment_html):
        assert html.lstrip().startswith("<!DOCTYPE html>") and "add_local_files" in html and "snapshot.pickle" in html
    assert "Active Memory Timeline" in trace_html and "Allocator State History" in segment_html
    # PyTorch's text renderers read the same keys.
    assert "segments:" in _memory_viz.segsum(loaded)
    assert "Device 0" in _memory_viz.trace(loaded)
    assert THIS_FILE in _memory_viz.memory(loaded, format_flamegraph=lambda lines: lines)
    del x


def test_memviz_cli_writes_html(tmp_path):
    _record()
    x = torch.empty(2048, device="neuron")
    snap = tmp_path / "snap.pickle"
    torch.neuron.memory._dump_snapshot(str(snap))
    del x
    from torchneuron.cli import main

    assert main(["memviz", str(snap)]) == 0
    html = (tmp_path / "snap.html").read_text()
    assert "Active Memory Timeline" in html and "add_local_files" in html
    out = tmp_path / "segments.html"
    assert main(["memviz", str(snap), "-o", str(out), "--kind", "segments"]) == 0
    assert "Allocator State History" in out.read_text()

    bad = tmp_path / "bad.pickle"
    bad.write_bytes(pickle.dumps({"not": "a snapshot"}))
    assert main(["memviz", str(bad)]) == 2


def test_out_of_memory_with_history_on_writes_a_snapshot(tmp_path):
    code = textwrap.dedent('''
        import os, pickle, re, sys
        import torch
        MiB = 1 << 20
        torch.neuron.memory._record_memory_history(stacks="python")
        keep = torch.empty(40 * MiB, dtype=torch.uint8, device="neuron")
        try:
            torch.empty(40 * MiB, dtype=torch.uint8, device="neuron")
        except torch.OutOfMemoryError as e:
            msg = str(e)
        else:
            raise AssertionError("no OutOfMemoryError")
        m = re.search(r"A memory snapshot was written to (\\S+) \\(open it with `torchneuron memviz`", msg)
        assert m and "neuron:0" in msg and "40.00 MiB" in msg, msg
        path = m.group(1)
        assert os.path.dirname(path) == os.environ["TORCHNEURON_OOM_SNAPSHOT"], path
        assert str(os.getpid()) in os.path.basename(path)
        with open(path, "rb") as f:
            snap = pickle.load(f)
        oom = [e for e in snap["device_traces"][0] if e["action"] == "oom"]
        assert len(oom) == 1 and oom[0]["size"] == 40 * MiB and oom[0]["device_free"] < 40 * MiB, oom
        assert any(f["filename"] == "<string>" for f in oom[0]["frames"]), oom
        assert sum(s["total_size"] for s in snap["segments"] if s["device"] == 0) == torch.neuron.memory_reserved()
        # A kernel's output (the zero-copy path) names a snapshot too.
        try:
            keep + 1
        except torch.OutOfMemoryError as e:
            assert "A memory snapshot was written to" in str(e), str(e)
        else:
            raise AssertionError("no OutOfMemoryError from a kernel output")
        # With the history off, the message is the usual one.
        torch.neuron.memory._record_memory_history(enabled=None)
        try:
            torch.empty(40 * MiB, dtype=torch.uint8, device="neuron")
        except torch.OutOfMemoryError as e:
            assert "snapshot" not in str(e), str(e)
        print("ok")
    ''')
    env = dict(os.environ, TORCHNEURON_DEVICE_MEMORY="64MiB", TORCHNEURON_OOM_SNAPSHOT=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "ok"
    assert len(list(tmp_path.glob("neuron_oom_snapshot_dev0_pid*.pickle"))) == 2
