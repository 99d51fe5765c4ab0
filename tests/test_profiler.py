"""torch.profiler on neuron: device activity through PyTorch's PrivateUse1 profiler extension point.

Kernels, copies, compiled graphs' kernels and collectives appear as device events of their
device and stream, linked to the op that launched them, with device time in key_averages()
and the device allocator's blocks as memory events.
"""

import json
import os

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

import torchneuron

ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def trace_events(prof, tmp_path, name="trace.json"):
    path = tmp_path / name
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text())["traceEvents"]


def device_events(events):
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS]


def test_kernels_are_device_events_linked_to_their_ops(tmp_path):
    x = torch.randn(64, 64, device="neuron")
    w = torch.randn(64, 64, device="neuron", requires_grad=True)
    with profile(activities=ACTIVITIES) as prof:
        y = torch.mm(x, w).relu().sum()
        y.backward()
    events = trace_events(prof, tmp_path)
    kernels = device_events(events)
    names = [e["name"] for e in kernels]
    assert "mm" in names and "relu" in names and "threshold_backward" in names
    ops = {e["args"]["External id"]: e for e in events if e.get("cat") == "cpu_op"}
    for k in kernels:
        assert k["pid"] == 0 and k["tid"] == 0 and k["args"]["stream"] == 0
        op = ops[k["args"]["External id"]]  # the op that launched it
        assert op["name"].endswith("::" + k["name"]) or op["name"] == "aten::" + k["name"], (op["name"], k["name"])
        assert op["ts"] <= k["ts"]
        if not torchneuron._C._async_mode():  # with asynchronous streams a kernel may end after its op returned
            assert k["ts"] + k["dur"] <= op["ts"] + op["dur"] + 1e-3
    # Launch order is device order on one stream: no overlap, increasing.
    starts = [k["ts"] for k in kernels]
    assert starts == sorted(starts)
    for a, b in zip(kernels, kernels[1:]):
        assert a["ts"] + a["dur"] <= b["ts"] + 1e-3
    # Each kernel has a launch event on the host thread, joined by a flow arrow.
    launches = {e["args"]["correlation"]: e for e in events if e.get("cat") == "privateuse1_runtime"}
    flows = [e for e in events if e.get("cat") == "ac2g"]
    for k in kernels:
        launch = launches[k["args"]["correlation"]]
        assert launch["name"] == "neuronLaunchKernel" and launch["pid"] == os.getpid()
        ids = {f["id"] for f in flows if f["ph"] in ("s", "f") and f["id"] == k["args"]["correlation"]}
        assert ids, k
    # The device is a process of its own, named, and its stream a lane.
    meta = [e for e in events if e.get("ph") == "M" and e.get("pid") == 0]
    assert {"name": "neuron 0"} in [e["args"] for e in meta if e["name"] == "process_name"]
    assert {"name": "stream 0"} in [e["args"] for e in meta if e["name"] == "thread_name"]


def test_key_averages_has_device_time_per_op():
    a = torch.randn(128, 128, device="neuron")
    with profile(activities=ACTIVITIES) as prof:
        for _ in range(3):
            a = torch.mm(a, a).tanh()
    rows = {e.key: e for e in prof.key_averages()}
    mm = rows["aten::mm"]
    assert mm.count == 3 and mm.device_time_total > 0 and mm.self_device_time_total > 0
    if not torchneuron._C._async_mode():
        assert mm.device_time_total <= mm.cpu_time_total * 1.01  # the host waits for the device here
    table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=5)
    assert "Self NEURON" in table and "NEURON total" in table and "aten::mm" in table


def test_copies_are_memcpy_events(tmp_path):
    host = torch.randn(1000)
    pinned = torch.randn(1000).pin_memory()
    with profile(activities=ACTIVITIES) as prof:
        d = host.to("neuron")
        d2 = pinned.to("neuron", non_blocking=True)
        back = (d + d2).cpu()
        d3 = d.clone()
        d.copy_(d3)
        value = d[0].item()
    copies = [e for e in device_events(trace_events(prof, tmp_path)) if e["cat"] == "gpu_memcpy"]
    names = [c["name"] for c in copies]
    assert names.count("Memcpy HtoD (Pageable -> Device)") == 1
    assert names.count("Memcpy HtoD (Pinned -> Device)") == 1
    assert names.count("Memcpy DtoH (Device -> Pageable)") == 2  # .cpu() and .item()
    assert names.count("Memcpy DtoD (Device -> Device)") == 2  # clone() and copy_()
    assert sorted(c["args"]["bytes"] for c in copies if "HtoD" in c["name"]) == [4000, 4000]
    torch.testing.assert_close(back, host + pinned)
    assert value == host[0].item()


def test_side_stream_kernels_are_on_their_lane(tmp_path):
    x = torch.randn(256, 256, device="neuron")
    side = torch.neuron.Stream()
    with profile(activities=ACTIVITIES) as prof:
        a = x.sin()
        side.wait_stream(torch.neuron.current_stream())
        with torch.neuron.stream(side):
            b = x.cos()
        torch.neuron.current_stream().wait_stream(side)
        c = a + b
    kernels = device_events(trace_events(prof, tmp_path))
    lanes = {k["name"]: k["tid"] for k in kernels}
    assert lanes["sin"] == 0 and lanes["add"] == 0
    assert lanes["cos"] == side.stream_id != 0
    torch.testing.assert_close(c.cpu(), x.cpu().sin() + x.cpu().cos())


@pytest.mark.skipif(torch.neuron.device_count() < 2, reason="needs two neuron devices")
def test_two_devices_are_two_processes(tmp_path):
    a = torch.randn(32, 32, device="neuron:0")
    b = torch.randn(32, 32, device="neuron:1")
    with profile(activities=ACTIVITIES) as prof:
        a.exp()
        with torch.neuron.device(1):
            torch.neuron._sleep(50_000_000)  # asynchronous streams: device 1 is still busy at the end
        b.log1p()
    events = trace_events(prof, tmp_path)
    pids = {k["name"]: k["pid"] for k in device_events(events)}
    assert pids["exp"] == 0 and pids["log1p"] == 1
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    assert names[0] == "neuron 0" and names[1] == "neuron 1"


def test_memory_events_sum_to_the_allocators_statistics():
    torch.neuron.synchronize()
    before = torch.neuron.memory_allocated()
    with profile(activities=ACTIVITIES, profile_memory=True) as prof:
        kept = [torch.empty(1000 * (i + 1), device="neuron") for i in range(4)]
        dropped = torch.ones(5000, device="neuron") * 2
        del dropped
    after = torch.neuron.memory_allocated()
    records = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    neuron = [e for e in records if e.device_type() == torch.autograd.DeviceType.PrivateUse1]
    neuron_bytes = sum(e.nbytes() for e in neuron)
    assert neuron_bytes == after - before > 0
    assert sum(e.nbytes() for e in neuron if e.nbytes() < 0) <= -20000  # the dropped block's free is there too
    assert sum(t.numel() * 4 for t in kept) <= neuron_bytes
    rows = {e.key: e for e in prof.key_averages()}
    assert rows["aten::empty"].self_device_memory_usage >= 4000


def test_compiled_graph_kernels_are_device_events(tmp_path):
    def f(x, y):
        return (x.sin() * y).cos().sum(dim=1)

    compiled = torch.compile(f, backend="neuron")
    x = torch.randn(64, 64, device="neuron")
    y = torch.randn(64, 64, device="neuron")
    expected = f(x.cpu(), y.cpu())
    compiled(x, y)  # compile outside the profile
    with profile(activities=ACTIVITIES) as prof:
        out = compiled(x, y)
    torch.testing.assert_close(out.cpu(), expected)
    events = trace_events(prof, tmp_path)
    fused = [k for k in device_events(events) if k["name"].startswith("cpp_fused")]
    assert fused, [k["name"] for k in device_events(events)]
    ops = {e["args"]["External id"]: e["name"] for e in events if e.get("cat") in ("cpu_op", "user_annotation")}
    assert all(k["args"]["External id"] in ops for k in fused)


def test_collective_is_a_device_event(tmp_path):
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("neuron", store=store, rank=0, world_size=1)
    try:
        t = torch.ones(1000, device="neuron")
        with profile(activities=ACTIVITIES) as prof:
            dist.all_reduce(t)
        torch.testing.assert_close(t.cpu(), torch.ones(1000))
    finally:
        dist.destroy_process_group()
    kernels = device_events(trace_events(prof, tmp_path))
    allreduce = [k for k in kernels if k["name"] == "all_reduce"]
    assert len(allreduce) == 1 and allreduce[0]["args"]["bytes"] == 4000


def test_schedule_and_tensorboard_handler(tmp_path):
    x = torch.randn(64, 64, device="neuron")
    steps_seen = []
    with profile(
        activities=ACTIVITIES,
        schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
        on_trace_ready=tensorboard_trace_handler(str(tmp_path / "tb")),
    ) as prof:
        for step in range(5):
            x = (x @ x).tanh()
            steps_seen.append(step)
            prof.step()
    files = list((tmp_path / "tb").glob("*.pt.trace.json*"))
    assert len(files) == 1
    events = json.loads(files[0].read_text())["traceEvents"]
    kernels = [k for k in device_events(events) if k["name"] == "mm"]
    assert len(kernels) == 2  # the two active steps
    assert {e["name"] for e in events if e.get("cat") == "user_annotation"} >= {"ProfilerStep#2", "ProfilerStep#3"}


def test_cpu_only_profile_records_no_device_events(tmp_path):
    x = torch.randn(64, 64, device="neuron")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        x.exp()
    events = trace_events(prof, tmp_path)
    assert not device_events(events)
    assert any(e.get("name") == "aten::exp" for e in events)


def test_errors_in_a_kernel_still_close_its_event(tmp_path):
    a = torch.randn(3, 4, device="neuron")
    b = torch.randn(5, 6, device="neuron")
    with profile(activities=ACTIVITIES) as prof:
        with pytest.raises(RuntimeError, match="cannot be multiplied"):
            torch.mm(a, b)
        a.exp()
    kernels = device_events(trace_events(prof, tmp_path))
    assert [k["name"] for k in kernels if k["name"] == "exp"] == ["exp"]
    assert all(k["dur"] >= 0 for k in kernels)


def test_holistic_trace_analysis_reads_the_trace(tmp_path):
    """HTA's temporal and kernel breakdowns of a GPT training step's trace."""
    hta = pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis is installed by scripts/bootstrap.sh")
    import torch.nn.functional as F

    from torchneuron.models import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=64)).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    x = torch.randint(0, 65, (4, 32), device="neuron")
    with profile(activities=ACTIVITIES, schedule=schedule(wait=0, warmup=1, active=1, repeat=1),
                 on_trace_ready=tensorboard_trace_handler(str(tmp_path))) as prof:
        for _ in range(2):
            logits = model(x)
            logits = logits[0] if isinstance(logits, tuple) else logits
            F.cross_entropy(logits.flatten(0, 1), x.flatten()).backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    analysis = hta.TraceAnalysis(trace_dir=str(tmp_path))
    temporal = analysis.get_temporal_breakdown(visualize=False)
    row = temporal.iloc[0]
    assert row["kernel_time(us)"] > 0 and row["compute_time(us)"] > 0
    # The device's time splits into compute, copies and idle (the host's time between launches).
    assert row["idle_time_pctg"] + row["compute_time_pctg"] + row["non_compute_time_pctg"] == pytest.approx(100, abs=0.5)
    assert row["compute_time(us)"] > row["non_compute_time(us)"]  # the step computes more than it copies
    # Every kernel, not HTA's default top 10 making up 80% of the time: which ones those are depends on
    # the host's speed (a loaded machine stretches some kernels more than others).
    kernel_types, kernels = analysis.get_gpu_kernel_breakdown(visualize=False, duration_ratio=1.0, num_kernels=100000)
    assert "COMPUTATION" in set(kernel_types["kernel_type"])
    names = set(kernels["name"])
    assert "mm" in names or "addmm" in names, names
    # HTA's total kernel time is the trace's.
    trace = json.loads(next(tmp_path.glob("*.pt.trace.json")).read_text())["traceEvents"]
    total = sum(e["dur"] for e in device_events(trace))
    assert abs(kernel_types["sum"].sum() - total) <= 0.01 * total + len(device_events(trace))
