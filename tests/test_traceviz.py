"""torchneuron traceviz: a self-contained HTML timeline of a Chrome trace (processes, lanes, slices, flows)."""

import json
import os
import re

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import torchneuron  # noqa: F401
from torchneuron.cli import main

ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
DATA = os.path.join(os.path.dirname(__file__), "data", "traceviz")


def _page(tmp_path, trace, *extra, name="trace.html"):
    out = tmp_path / name
    assert main(["traceviz", str(trace), "-o", str(out), *extra]) == 0
    return out.read_text()


def _data(page):
    return json.loads(page.split('<script type="application/json" id="traceviz-data">', 1)[1].split("</script>", 1)[0])


def _flows(page):
    """(category, source slice, destination slice, y1, y2) of each arrow."""
    out = []
    for cat, a, b, d in re.findall(r'<path class="flow" data-cat="([^"]*)" data-a="(-?\d+)" data-b="(-?\d+)" d="([^"]+)"',
                                   page):
        nums = [float(v) for v in re.findall(r"-?[\d.]+", d)]
        out.append((cat, int(a), int(b), nums[1], nums[-1]))
    return out


def _assert_offline(page):
    lowered = page.lower()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page
    assert "http://" not in lowered and "https://" not in lowered
    assert not re.search(r"<script[^>]*\bsrc=", lowered) and "<link" not in lowered and "@import" not in lowered
    assert not re.search(r"url\((?!#)", lowered)          # only references inside the page (the arrowhead)


def test_neuron_profile_draws_host_ops_the_stream_lane_and_launch_arrows(tmp_path):
    x = torch.randn(64, 64, device="neuron")
    w = torch.randn(64, 64, device="neuron", requires_grad=True)
    with profile(activities=ACTIVITIES) as prof:
        y = torch.mm(x, w).relu().sum()
        y.backward()
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    timed = [e for e in events if e.get("ph") == "X"]
    span_us = max(e["ts"] + e["dur"] for e in timed) - min(e["ts"] for e in timed)
    shortest = min(e["dur"] for e in timed if e.get("cat") in ("kernel", "privateuse1_runtime"))
    width = int(span_us / shortest) + 400       # wide enough that no launch or kernel is under half a pixel
    page = _page(tmp_path, trace, "--width", str(width))
    _assert_offline(page)

    meta = {(e["name"], e["pid"], e.get("tid")): e["args"] for e in events if e.get("ph") == "M"}
    mm = next(e for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::mm")
    host_thread = meta[("thread_name", mm["pid"], mm["tid"])]["name"]  # the thread that ran the ops
    assert '<text class="proc" x="6"' in page and ">neuron 0 (pid 0)</text>" in page
    assert ">stream 0</text>" in page and f">{host_thread}</text>" in page

    slices = _data(page)["slices"]
    stream_lane = "neuron 0 (pid 0) / stream 0"
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    drawn_kernels = [s for s in slices if s[3] == stream_lane]
    assert [s[0] for s in drawn_kernels] == [k["name"] for k in kernels] and len(kernels) >= 3
    assert all(s[0] != "neuronLaunchKernel" for s in drawn_kernels)
    host_names = {s[0] for s in slices if s[3].endswith(" / " + host_thread)}
    assert {"aten::mm", "aten::relu", "neuronLaunchKernel"} <= host_names

    # One arrow per kernel, from its launch on the host thread down to it on the stream lane.
    arrows = [f for f in _flows(page) if f[0] == "ac2g"]
    assert len(arrows) == len(kernels)
    for _, a, b, y1, y2 in arrows:
        assert slices[a][0] == "neuronLaunchKernel" and slices[a][3].endswith(host_thread)
        assert slices[b][3] == stream_lane and y2 > y1
        assert slices[a][5]["correlation"] == slices[b][5]["correlation"]


def _synthetic(tmp_path):
    ev = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "host"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "main thread"}},
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "neuron 0"}},
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 0, "args": {"name": "stream 0"}},
        {"ph": "M", "name": "process_sort_index", "pid": 0, "args": {"sort_index": 5}},
        {"ph": "X", "name": "ProfilerStep#1", "pid": 1, "tid": 7, "ts": 1000, "dur": 100},
        {"ph": "X", "name": "early", "pid": 1, "tid": 7, "ts": 1010, "dur": 20},
        {"ph": "X", "name": "ProfilerStep#2", "pid": 1, "tid": 7, "ts": 1200, "dur": 100},
        {"ph": "B", "name": "outer", "pid": 1, "tid": 7, "ts": 1210},
        {"ph": "X", "name": "inner", "pid": 1, "tid": 7, "ts": 1220, "dur": 30},
        {"ph": "X", "name": "launch", "pid": 1, "tid": 7, "ts": 1225, "dur": 2},
        {"ph": "E", "pid": 1, "tid": 7, "ts": 1280},
        {"ph": "X", "name": "kernel", "pid": 0, "tid": 0, "ts": 1240, "dur": 40, "args": {"stream": 0}},
        {"ph": "s", "id": 9, "cat": "ac2g", "name": "ac2g", "pid": 1, "tid": 7, "ts": 1225},
        {"ph": "f", "id": 9, "cat": "ac2g", "name": "ac2g", "pid": 0, "tid": 0, "ts": 1240, "bp": "e"},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 7, "ts": 1230, "s": "t"},
    ]
    path = tmp_path / "synthetic.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    return path


def test_nesting_flows_steps_and_errors_of_a_written_trace(tmp_path):
    path = _synthetic(tmp_path)
    page = _page(tmp_path, path)
    _assert_offline(page)
    slices = _data(page)["slices"]
    names = [s[0] for s in slices]
    assert sorted(names) == sorted(["ProfilerStep#1", "early", "ProfilerStep#2", "outer", "inner", "launch", "kernel"])
    assert "1 instant and 0 counter events not drawn" in page
    # Processes in sort-index order: host (its pid, 1, for want of an index) before neuron 0 (index 5).
    assert page.index(">host (pid 1)</text>") < page.index(">neuron 0 (pid 0)</text>")

    def y_of(name):
        i = names.index(name)
        return float(re.search(r'<g class="sl" data-i="%d"><rect x="[\d.]+" y="([\d.]+)"' % i, page).group(1))

    # outer (a B/E pair) holds inner, which holds launch: three rows, one under the other.
    assert y_of("ProfilerStep#2") < y_of("outer") < y_of("inner") < y_of("launch")
    (arrow,) = _flows(page)
    assert slices[arrow[1]][0] == "launch" and slices[arrow[2]][0] == "kernel" and arrow[4] > arrow[3]

    # --step 2: only what overlaps ProfilerStep#2; the levels without a slice there take no room.
    step = _page(tmp_path, path, "--step", "2", name="step.html")
    step_slices = _data(step)["slices"]
    assert "ProfilerStep#1" not in [s[0] for s in step_slices] and "early" not in [s[0] for s in step_slices]
    assert "ProfilerStep#2: 0.2 ms to 0.3 ms" in step
    window = _page(tmp_path, path, "--window", "0:0.05", name="window.html")
    assert [s[0] for s in _data(window)["slices"]] == ["ProfilerStep#1", "early"]
    assert _flows(window) == []

    assert main(["traceviz", str(path), "--step", "5", "-o", str(tmp_path / "x.html")]) == 2
    assert main(["traceviz", str(path), "--window", "a:b", "-o", str(tmp_path / "x.html")]) == 2
    bad = tmp_path / "bad.json"
    bad.write_text('{"no": "events"}')
    assert main(["traceviz", str(bad)]) == 2
    bad.write_text("not json")
    assert main(["traceviz", str(bad)]) == 2


def test_flow_categories_can_be_chosen(tmp_path):
    path = _synthetic(tmp_path)
    assert len(_flows(_page(tmp_path, path, "--flows", "ac2g"))) == 1
    assert _flows(_page(tmp_path, path, "--flows", "fwdbwd", name="none.html")) == []


@pytest.mark.parametrize("expected, kwargs", [("synthetic.html", {}), ("synthetic_step2.html", {"step": 2})])
def test_page_is_unchanged(tmp_path, expected, kwargs):
    # The page of the synthetic trace byte for byte, but for the style and the script (the module's
    # constants). After a change meant to alter the drawing, write the files anew with _bare(...).
    from torchneuron.tools import traceviz

    def _bare(page):
        return page.replace(traceviz._STYLE, "").replace(traceviz._SCRIPT, "")

    events = traceviz.load_trace(str(_synthetic(tmp_path)))
    with open(os.path.join(DATA, expected), encoding="utf-8", newline="") as f:
        assert _bare(traceviz.render_html(events, title="synthetic.json", **kwargs)) == f.read()


@pytest.mark.parametrize("bad_width", ["0", "-3"])
def test_width_must_be_positive(tmp_path, bad_width):
    with pytest.raises(SystemExit):
        main(["traceviz", str(_synthetic(tmp_path)), "--width", bad_width])


def test_the_viewers_import_nothing_of_the_device():
    # They read files a run wrote: a page can be made where the device is not.
    import ast
    import pathlib

    import torchneuron.tools

    device_free = {"torchneuron/_units.py": ".._units"}  # modules that import nothing at all, shared by every layer
    root = pathlib.Path(torchneuron.tools.__file__).parent
    for rel in device_free:
        tree = ast.parse((root.parent.parent / rel).read_text())
        assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and n.module != "__future__"]
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "")]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name in device_free.values():
                    continue
                assert not name.startswith(("torch", "..")), f"{path.name} imports {name}"
