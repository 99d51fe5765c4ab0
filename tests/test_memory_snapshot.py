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
    assert "Active memory timeline" in html and "add_local_files" not in html   # the offline page by default
    assert main(["memviz", str(snap), "-o", str(tmp_path / "trace.html"), "--kind", "trace"]) == 0
    assert "Active Memory Timeline" in (tmp_path / "trace.html").read_text()
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


# The offline page (torchneuron memviz, the default --kind).

def _offline_page(tmp_path, snapshot_path, *extra):
    from torchneuron.cli import main

    out = tmp_path / "page.html"
    assert main(["memviz", str(snapshot_path), "-o", str(out), *extra]) == 0
    return out.read_text()


def _summary_row(html, device):
    import re

    m = re.search(r'<tr data-device="%d"([^>]*)>' % device, html)
    assert m, html[:2000]
    return {k: v for k, v in re.findall(r'data-(\w+)="([^"]*)"', m.group(1))}


def _bands(html, device=0):
    """(class, data-size) of each band of the device's timeline, in drawing order."""
    import re

    section = html.split('<section class="device" data-device="%d"' % device, 1)[1].split("</section>", 1)[0]
    return re.findall(r'<path class="(band(?: pre)?)" data-i="\d+" data-size="(\d+)"', section), section


def _assert_offline(html):
    import re

    assert html.startswith("<!DOCTYPE html>")
    lowered = html.lower()
    assert "http://" not in lowered and "https://" not in lowered and "//cdn" not in lowered
    assert not re.search(r"<script[^>]*\bsrc=", lowered) and "<link" not in lowered
    assert "@import" not in lowered and "url(" not in lowered and "<iframe" not in lowered
    assert "<svg" in html


def test_offline_page_draws_one_band_per_allocation_and_the_allocators_numbers(tmp_path):
    import json

    base = torch.neuron.memory_allocated(0)
    torch.neuron.reset_peak_memory_stats(0)
    _record()
    a = torch.empty(MiB, dtype=torch.uint8, device="neuron")
    b = torch.empty(3 * MiB, dtype=torch.uint8, device="neuron")
    del b
    c = torch.empty(5 * MiB, dtype=torch.uint8, device="neuron")
    path = tmp_path / "snap.pickle"
    torch.neuron.memory._dump_snapshot(str(path))
    stats = torch.neuron.memory_stats(0)
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    html = _offline_page(tmp_path, path)
    _assert_offline(html)

    trace = snapshot["device_traces"][0]
    allocs = [e["size"] for e in trace if e["action"] == "alloc"]
    assert allocs == [MiB, 3 * MiB, 5 * MiB]
    bands, section = _bands(html)
    assert [int(size) for cls, size in bands if cls == "band"] == allocs
    # Blocks alive before the history started (other tests' tensors, if any) are drawn too, marked as such.
    before = {blk["address"] for s in _device0_segments(snapshot) for blk in s["blocks"]
              if blk["state"] == "active_allocated"} - {e["addr"] for e in trace if e["action"] == "alloc"}
    assert sum(cls == "band pre" for cls, _ in bands) == len(before)

    row = _summary_row(html, 0)
    assert int(row["allocated"]) == torch.neuron.memory_allocated(0) == stats["allocated_bytes.all.current"]
    assert int(row["reserved"]) == torch.neuron.memory_reserved(0) == stats["reserved_bytes.all.current"]
    assert int(row["segments"]) == stats["segment.all.current"] == len(_device0_segments(snapshot))
    assert int(row["allocations"]) == 3
    assert int(row["peak"]) == base + 6 * MiB == stats["allocated_bytes.all.peak"]

    # The segment view: every segment and every block of the state is drawn, allocated vs cached.
    import re
    segs = {int(i) for i in re.findall(r'<rect class="seg" data-s="(\d+)"', section)}
    assert segs == set(range(len(_device0_segments(snapshot))))
    allocated_blocks = set(re.findall(r'<rect class="blk alloc" data-s="(\d+)" data-b="(\d+)"', section))
    cached_blocks = set(re.findall(r'<rect class="blk cached" data-s="(\d+)" data-b="(\d+)"', section))
    states = [blk["state"] for s in _device0_segments(snapshot) for blk in s["blocks"]]
    assert len(allocated_blocks) == states.count("active_allocated") and len(cached_blocks) == states.count("inactive")
    assert len(cached_blocks) >= 1                       # b's block, cached after del b

    # What hovering shows: size, address and this test's line in the top Python frames of each allocation.
    data = json.loads(html.split('<script type="application/json" id="memviz-data">', 1)[1].split("</script>", 1)[0])
    drawn = [entry for entry in data["devices"]["0"]["bands"] if not entry[6]]
    assert [entry[0] for entry in drawn] == allocs
    assert drawn[0][1] == f"0x{a.data_ptr():x}" and drawn[2][1] == f"0x{c.data_ptr():x}"
    assert drawn[0][3] is None and drawn[1][3] is not None     # a is alive at the end, b was freed
    for entry in drawn:
        python_frames = [data["frames"][i] for i in entry[4][0]]
        assert any(THIS_FILE in line and "test_offline_page_draws_one_band" in line for line in python_frames)
    del a, c


def test_offline_page_without_recording_says_so(tmp_path):
    x = torch.empty(MiB, dtype=torch.uint8, device="neuron")
    path = tmp_path / "snap.pickle"
    torch.neuron.memory._dump_snapshot(str(path))   # history off: state only
    html = _offline_page(tmp_path, path)
    _assert_offline(html)
    bands, section = _bands(html)
    assert bands == [] and "recording was off" in section
    assert '<rect class="blk alloc"' in section          # the state is drawn all the same
    row = _summary_row(html, 0)
    assert row["peak"] == "" and int(row["allocations"]) == 0
    assert int(row["allocated"]) == torch.neuron.memory_allocated(0)
    del x


def test_offline_page_caps_long_traces_and_shows_each_device(tmp_path):
    _record()
    keep = torch.empty(2 * MiB, dtype=torch.uint8, device="neuron")
    for _ in range(30):
        t = torch.empty(4096, device="neuron")
        del t
    other = torch.empty(3 * MiB, dtype=torch.uint8, device="neuron:1")
    path = tmp_path / "snap.pickle"
    torch.neuron.memory._dump_snapshot(str(path))
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    n = len(snapshot["device_traces"][0])
    assert n > 60
    html = _offline_page(tmp_path, path, "--max-actions", "20")
    _assert_offline(html)
    assert f"The trace has {n} actions; the timeline draws the newest 20" in html
    bands, _ = _bands(html)
    window = snapshot["device_traces"][0][-20:]
    assert sum(cls == "band" for cls, _ in bands) == sum(e["action"] == "alloc" for e in window)
    assert ("band pre", str(2 * MiB)) in bands          # keep, allocated before the window, drawn from the left
    assert int(_summary_row(html, 0)["allocations"]) == sum(e["action"] == "alloc" for e in snapshot["device_traces"][0])

    # neuron:1 has its own section, selectable, with its one allocation.
    assert '<select id="device">' in html and '<option value="1">neuron:1</option>' in html
    bands1, _ = _bands(html, 1)
    assert [size for cls, size in bands1 if cls == "band"] == [str(3 * MiB)]
    assert int(_summary_row(html, 1)["allocated"]) == torch.neuron.memory_allocated(1)
    del keep, other


def test_offline_page_marks_an_out_of_memory_error(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHNEURON_OOM_SNAPSHOT", str(tmp_path))
    _record()
    x = torch.empty(MiB, dtype=torch.uint8, device="neuron")
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(1 << 50, dtype=torch.uint8, device="neuron")
    (dump,) = tmp_path.glob("neuron_oom_snapshot_dev0_*.pickle")
    html = _offline_page(tmp_path, dump)
    _assert_offline(html)
    assert '<line class="oom"' in html and "tried to allocate 1048576.0 GiB" in html
    assert int(_summary_row(html, 0)["ooms"]) == 1
    del x
