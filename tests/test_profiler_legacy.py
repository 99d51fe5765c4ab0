"""The legacy profiler on neuron: torch.autograd.profiler.profile(use_device="neuron").

PyTorch runs it in the state KINETO_PRIVATEUSE1_FALLBACK and times each op on the device with a
pair of events from the backend's registered ProfilerStubs (csrc/profiler/stubs.cpp), as it does
with cudaEvents for use_device="cuda". The API and its use are those of PyTorch's reference
PrivateUse1 backend's tests (torch_openreg).
"""

import json
import statistics
import time

import pytest
import torch
from torch.autograd.profiler import profile as legacy_profile
from torch.profiler import ProfilerActivity, profile

import torchneuron

ASYNC = torchneuron._C._async_mode()


def linears(n=20, width=64):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(n)]).to("neuron")


def test_every_op_has_non_negative_cpu_and_device_times(capfd):
    model = linears()
    x = torch.randn(32, 64, device="neuron")
    capfd.readouterr()
    with legacy_profile(use_device="neuron") as prof:
        with torch.no_grad():
            y = model(x)
    out, err = capfd.readouterr()
    # No per-op output: PyTorch logs a failing profiler callback with a backtrace, once per op.
    for marker in ("RecordFunction callback", "INTERNAL ASSERT", "frame #", "not enabled"):
        assert marker not in err, err[-2000:]
    assert len(err.splitlines()) < 10, err[-2000:]  # Kineto's start and stop lines at most
    events = prof.function_events
    ops = [e for e in events if e.name.startswith("aten::")]
    assert len(ops) >= 20 * 3  # linear, t, addmm, ... per layer
    for e in events:
        assert e.time_range.start >= 0 and e.time_range.end >= e.time_range.start, e
        assert e.cpu_time_total >= 0 and e.self_cpu_time_total >= 0, e
        assert e.device_time_total >= 0 and e.self_device_time_total >= 0, e
    # The profile's result is the computation's.
    torch.testing.assert_close(y.cpu(), model.cpu()(x.cpu()))


def test_ops_that_ran_on_the_device_have_device_time():
    a = torch.randn(256, 256, device="neuron")
    with legacy_profile(use_device="neuron") as prof:
        for _ in range(3):
            a = torch.mm(a, a).tanh()
    rows = {e.key: e for e in prof.key_averages()}
    mm = rows["aten::mm"]
    assert mm.count == 3
    assert mm.device_time_total > 0 and mm.self_device_time_total > 0
    assert rows["aten::tanh"].device_time_total > 0
    if not ASYNC:
        # The host waits for each kernel here: the device's time is within the op's, and most of it.
        assert mm.device_time_total <= mm.cpu_time_total * 1.01 + 3
        assert mm.device_time_total >= 0.5 * mm.cpu_time_total
    table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=5)
    assert "Self NEURON" in table and "NEURON total" in table and "aten::mm" in table
    assert "Self CPU time total" in table and "Self NEURON time total" in table


def test_a_parent_op_includes_its_childrens_device_time():
    model = linears(n=2, width=128)
    x = torch.randn(64, 128, device="neuron")
    with legacy_profile(use_device="neuron") as prof:
        with torch.no_grad():
            model(x)
    for linear in (e for e in prof.function_events if e.name == "aten::linear"):
        children = linear.cpu_children
        addmm = [c for c in children if c.name == "aten::addmm"]
        assert addmm and addmm[0].device_time_total > 0
        assert linear.device_time_total >= sum(c.device_time_total for c in children)
        assert linear.self_device_time_total >= 0


def test_device_time_is_measured_on_the_ops_device(two_devices):
    _, dev1 = two_devices
    a = torch.randn(256, 256, device=dev1)
    with legacy_profile(use_device="neuron") as prof:
        with torch.neuron.device(1):
            b = torch.mm(a, a)
    torch.testing.assert_close(b.cpu(), a.cpu() @ a.cpu())
    mm = [e for e in prof.function_events if e.name == "aten::mm"]
    assert len(mm) == 1 and mm[0].device_time_total > 0


def test_backward_and_export_chrome_trace(tmp_path):
    w = torch.randn(128, 128, device="neuron", requires_grad=True)
    x = torch.randn(64, 128, device="neuron")
    with legacy_profile(use_device="neuron", record_shapes=True) as prof:
        torch.mm(x, w).relu().sum().backward()
    names = {e.key for e in prof.key_averages() if e.device_time_total > 0}
    assert {"aten::mm", "aten::relu", "aten::threshold_backward"} <= names
    path = tmp_path / "legacy.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    ops = [e for e in events if e.get("ph") == "X" and e.get("name") == "aten::mm"]
    assert ops and all(e["dur"] >= 0 for e in ops)


def test_asynchronous_streams(run_python):
    """With asynchronous streams the events run on the stream's worker after the op's kernels."""
    code = """
import torch, torchneuron
from torch.autograd.profiler import profile
assert torchneuron._C._async_mode()
a = torch.randn(256, 256, device="neuron")
with profile(use_device="neuron") as prof:
    for _ in range(3):
        a = torch.mm(a, a).tanh()
rows = {e.key: e for e in prof.key_averages()}
assert rows["aten::mm"].device_time_total > 0, rows["aten::mm"]
assert all(e.cpu_time_total >= 0 and e.device_time_total >= 0 for e in prof.function_events)
print("ok")
"""
    proc = run_python(code, env={"TORCHNEURON_ASYNC": "1"})
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr[-3000:]
    assert "RecordFunction callback" not in proc.stderr, proc.stderr[-3000:]


def test_torch_profiler_still_records_the_device_timeline():
    """The legacy profiler's registration leaves torch.profiler's PrivateUse1 activity as it was."""
    a = torch.randn(128, 128, device="neuron")
    with legacy_profile(use_device="neuron"):
        torch.mm(a, a)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        torch.mm(a, a)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1]
    assert [k.name for k in kernels] == ["mm"]
    assert {e.key: e for e in prof.key_averages()}["aten::mm"].device_time_total > 0


def test_overhead_is_that_of_torch_profiler():
    """The same loop plain, under torch.profiler and under the legacy profiler, interleaved; medians.

    Before the stubs were registered the legacy profile was hundreds of times slower than the plain
    loop (two exceptions with backtraces per op); the bound here is generous for a loaded machine,
    benchmarks/bench_profiler.py measures it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = linears()
        x = torch.randn(32, 64, device="neuron")

        def loop():
            with torch.no_grad():
                for _ in range(5):
                    model(x)
            torch.neuron.synchronize()

        def timed(kind):
            t0 = time.perf_counter()
            if kind == "plain":
                loop()
            elif kind == "kineto":
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]):
                    loop()
            else:
                with legacy_profile(use_device="neuron"):
                    loop()
            return time.perf_counter() - t0

        for kind in ("plain", "kineto", "legacy"):
            timed(kind)
        times = {"plain": [], "kineto": [], "legacy": []}
        for _ in range(5):
            for kind in times:
                times[kind].append(timed(kind))
        med = {k: statistics.median(v) for k, v in times.items()}
        assert med["legacy"] <= 2.0 * med["kineto"], med
        # Far from the thousands of times the plain loop's time it took before (fused eager runs the
        # plain loop as compiled groups, and either profiler then costs some ten times its time).
        assert med["legacy"] <= 100 * med["plain"], med
    finally:
        torch.set_num_threads(threads)


def test_use_kineto_is_the_device_timeline():
    """use_kineto=True with use_device="neuron" is torch.profiler's PrivateUse1 activity (kineto.cpp)."""
    a = torch.randn(128, 128, device="neuron")
    with legacy_profile(use_device="neuron", use_kineto=True) as prof:
        torch.mm(a, a)
    rows = {e.key: e for e in prof.key_averages()}
    assert rows["mm"].device_time_total > 0  # the kernel's own row, as on CUDA
    assert rows["aten::mm"].device_time_total == pytest.approx(rows["mm"].device_time_total)


def test_a_range_that_switches_stream_counts_only_its_childrens_device_time():
    """A range whose end is recorded on another stream bounds no interval of one stream's work."""
    a = torch.randn(256, 256, device="neuron")
    side = torch.neuron.Stream()
    with legacy_profile(use_device="neuron") as prof:
        with torch.autograd.profiler.record_function("switch"):
            b = a @ a
            torch.neuron.set_stream(side)
    torch.neuron.set_stream(torch.neuron.default_stream(0))
    torch.testing.assert_close(b.cpu(), a.cpu() @ a.cpu())
    events = prof.function_events
    switch = next(e for e in events if e.name == "switch")
    matmul = next(e for e in events if e.name == "aten::matmul")
    assert matmul.device_time_total > 0
    assert switch.device_time_total == matmul.device_time_total and switch.self_device_time_total == 0
    assert all(e.self_device_time_total >= 0 and e.self_cpu_time_total >= 0 for e in events)


def test_training_step_on_side_streams_with_ranges(capfd):
    """The scenarios PyTorch's reference backend tests: a training step in named ranges, ops on side
    streams, many small ranges; every event's times non-negative and no output per op."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.ReLU(), torch.nn.Linear(20, 10)).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 10, device="neuron")
    target = torch.randn(32, 10, device="neuron")
    s1, s2 = torch.neuron.Stream(), torch.neuron.Stream()
    capfd.readouterr()
    with legacy_profile(use_device="neuron", record_shapes=True) as prof:
        with torch.autograd.profiler.record_function("forward"):
            loss = torch.nn.functional.mse_loss(model(x), target)
        with torch.autograd.profiler.record_function("backward"):
            loss.backward()
        with torch.autograd.profiler.record_function("optimizer_step"):
            opt.step()
            opt.zero_grad()
        with torch.neuron.stream(s1):
            a = x * 2
        with torch.neuron.stream(s2):
            b = x + 1
        torch.neuron.synchronize()
        for i in range(50):
            with torch.autograd.profiler.record_function(f"op_{i}"):
                b = b + 1
    err = capfd.readouterr().err
    assert "RecordFunction callback" not in err and "frame #" not in err, err[-2000:]
    torch.testing.assert_close(a.cpu(), x.cpu() * 2)
    torch.testing.assert_close(b.cpu(), x.cpu() + 51)
    events = prof.function_events
    names = {e.name for e in events}
    assert {"forward", "backward", "optimizer_step", "op_0", "op_49"} <= names
    for e in events:
        assert e.cpu_time_total >= 0 and e.self_cpu_time_total >= 0, e
        assert e.device_time_total >= 0 and e.self_device_time_total >= 0, e
    timed = {e.key for e in prof.key_averages(group_by_input_shape=True) if e.device_time_total > 0}
    assert "forward" in timed and "aten::addmm" in timed and "aten::mul" in timed


def test_an_exception_inside_the_profile_and_an_empty_profile():
    with pytest.raises(RuntimeError, match="raised inside"):
        with legacy_profile(use_device="neuron") as prof:
            torch.randn(10, 10, device="neuron").exp()
            raise RuntimeError("raised inside")
    assert any(e.name == "aten::exp" and e.device_time_total >= 0 for e in prof.function_events)
    with legacy_profile(use_device="neuron") as empty:
        pass
    # Nothing ran: no op's events to time (PyTorch still reads the profile back without an error).
    assert not [e for e in empty.function_events if e.name.startswith("aten::")]
    assert empty.key_averages().table() == ""
