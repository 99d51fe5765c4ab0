"""NKI kernels seen by the tools: torch.profiler shows a kernel and its instructions as device events
of the stream it ran on, and ``torchneuron project`` costs an op registered with ``nki_op`` by its
kernels' own estimate on Trainium (the roofline on GPUs), in a real run and in fake mode."""

import json
import math
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import torchneuron
import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron import projection
from torchneuron.projection.model import get_target

import nki_ops
from rmsnorm import rmsnorm

ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
RMS_OP = "nki_examples.rms_norm.default"


def device_events(prof, tmp_path):
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    return events, [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]


def inside(inner, outer) -> bool:
    return outer["ts"] - 1e-3 <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + 1e-3


@nki.jit
def matmul_one_tile(lhsT, rhs):
    out = nl.ndarray((lhsT.shape[1], rhs.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    x = nl.load(lhsT)
    y = nl.ndarray(rhs.shape, dtype=rhs.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=y, src=rhs)
    acc = nisa.nc_matmul(x, y)
    nl.store(out, value=nl.copy(acc))
    return out


def test_a_kernel_and_its_instructions_are_device_events_of_its_stream(tmp_path):
    lhsT, rhs = torch.randn(128, 64, device="neuron"), torch.randn(128, 512, device="neuron")
    side = torch.neuron.Stream()
    side.wait_stream(torch.neuron.current_stream())
    with profile(activities=ACTIVITIES) as prof:
        with torch.neuron.stream(side):
            out = matmul_one_tile(lhsT, rhs)
        torch.neuron.current_stream().wait_stream(side)
    torch.testing.assert_close(out.cpu(), lhsT.cpu().t() @ rhs.cpu())
    _, kernels = device_events(prof, tmp_path)
    (kernel,) = [k for k in kernels if k["name"] == "nki:matmul_one_tile"]
    assert kernel["pid"] == 0 and kernel["tid"] == kernel["args"]["stream"] == side.stream_id != 0
    instructions = sorted((k for k in kernels if k["name"].startswith("nki.")), key=lambda k: k["ts"])
    # The kernel's instructions in program order, each once, on the kernel's lane and inside its span.
    assert [k["name"] for k in instructions] == ["nki.load", "nki.dma_copy", "nki.nc_matmul", "nki.copy", "nki.store"]
    assert len(instructions) == matmul_one_tile.last_estimate.instructions
    for k in instructions:
        assert k["tid"] == side.stream_id and inside(k, kernel), k
    # The device ops an instruction runs are inside its event (the matmul's among nc_matmul's).
    (matmul,) = [k for k in instructions if k["name"] == "nki.nc_matmul"]
    ops = [k for k in kernels if not k["name"].startswith("nki") and inside(k, matmul)]
    assert ops and all(k["tid"] == side.stream_id for k in ops)


def test_the_rmsnorm_op_is_a_device_event_of_its_op(tmp_path):
    rows, n = 300, 256  # three tiles of rows, the last masked
    x, w = torch.randn(rows, n, device="neuron"), torch.randn(n, device="neuron")
    with profile(activities=ACTIVITIES) as prof:
        y = nki_ops.rms_norm(x, w, 1e-6)
    torch.testing.assert_close(y.cpu(), F.rms_norm(x.cpu(), (n,), w.cpu(), 1e-6))
    events, kernels = device_events(prof, tmp_path)
    (kernel,) = [k for k in kernels if k["name"] == "nki:rmsnorm"]
    assert kernel["tid"] == kernel["args"]["stream"] == torch.neuron.current_stream().stream_id
    ops = {e["args"]["External id"]: e["name"] for e in events if e.get("cat") == "cpu_op"}
    assert ops[kernel["args"]["External id"]] == "nki_examples::rms_norm"
    # What the kernel's source runs: one load of the weight, then per tile of 128 rows a load, square,
    # sum, divide and add (the mean plus eps), rsqrt, two multiplies, the weight's broadcast, a store.
    tiles = math.ceil(rows / 128)
    per_tile = ["load", "square", "sum", "divide", "add", "rsqrt", "multiply", "multiply", "broadcast_to", "store"]
    want = Counter({"nki.load": 1})
    want.update("nki." + name for name in per_tile * tiles)
    got = Counter(k["name"] for k in kernels if k["name"].startswith("nki.") and inside(k, kernel))
    assert got == want
    # The op's device time is its own work once: the kernel's instructions (and the device ops inside
    # them) run inside the kernel's launch, so they are marked nested and linked to no op.
    linked = [k for k in kernels if k["args"].get("External id") == kernel["args"]["External id"]]
    assert kernel in linked and not any(k["args"].get("nested") for k in linked), linked
    assert all(k["args"].get("nested") == 1 and "External id" not in k["args"]
               for k in kernels if inside(k, kernel) and k is not kernel)
    rows_ = {e.key: e for e in prof.key_averages()}
    assert rows_["nki_examples::rms_norm"].device_time_total == pytest.approx(sum(k["dur"] for k in linked), rel=0.01)


def test_kernel_and_instruction_events_say_what_they_would_cost_on_silicon(tmp_path):
    x, w = torch.randn(256, 512, device="neuron"), torch.randn(512, device="neuron")
    with profile(activities=ACTIVITIES) as prof:
        rmsnorm(x, w)
    _, kernels = device_events(prof, tmp_path)
    (kernel,) = [k for k in kernels if k["name"] == "nki:rmsnorm"]
    estimate = rmsnorm.estimate(x, w)  # the kernel's target: trn2 unless overridden
    assert kernel["args"]["bound engine"] == estimate.bound
    assert kernel["args"]["estimate"] == f"{estimate.seconds * 1e6:.3f} us on {estimate.target} (projection, not a measurement)"
    instructions = [k for k in kernels if k["name"].startswith("nki.") and inside(k, kernel)]
    assert instructions and all({"estimate", "bound engine", "engines", "kernel line"} <= set(k["args"]) for k in instructions)
    square = next(k for k in instructions if k["name"] == "nki.square")
    assert "rmsnorm.py" in square["args"]["kernel line"] and square["args"]["bound engine"] in ("VectorE", "ScalarE")
    # The instructions' busy time adds up to the kernel's, engine by engine.
    total = {}
    for k in instructions:
        for part in k["args"]["engines"].split(", "):
            engine, us, _ = part.split(" ")
            total[engine] = total.get(engine, 0.0) + float(us)
    for engine, seconds in estimate.engine_seconds.items():
        assert total[engine] == pytest.approx(seconds * 1e6, abs=1e-3 * len(instructions)), engine


def test_each_call_is_one_kernel_event_and_a_cpu_profile_runs_kernels_as_before(tmp_path):
    x, w = torch.randn(128, 64, device="neuron"), torch.randn(64, device="neuron")
    want = F.rms_norm(x.cpu(), (64,), w.cpu())
    with profile(activities=[ProfilerActivity.CPU]):  # no device activity asked for
        torch.testing.assert_close(rmsnorm(x, w).cpu(), want)
    with profile(activities=ACTIVITIES) as prof:
        for _ in range(2):
            torch.testing.assert_close(rmsnorm(x, w).cpu(), want)
    _, kernels = device_events(prof, tmp_path)
    assert sum(k["name"] == "nki:rmsnorm" for k in kernels) == 2


# ---- the projection ----------------------------------------------------------------------------------

class NormedLinear(torch.nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.lin = torch.nn.Linear(n, n)
        self.weight = torch.nn.Parameter(torch.ones(n))

    def forward(self, x):
        return nki_ops.rms_norm(self.lin(x), self.weight, 1e-6)


ROWS, N = 200, 256


def _train(steps: int, p) -> None:
    model = NormedLinear(N).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        x = torch.randn(ROWS, N, device="neuron")
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        p.step(samples=ROWS)


@pytest.mark.parametrize("fake", [False, True], ids=["real", "fake"])
def test_the_projection_costs_an_nki_op_by_its_kernels_estimate(fake):
    with projection.count(fake=fake) as p:
        _train(3, p)
    report = p.project(["trn1.32xlarge", "trn2.48xlarge"], compare=["p5.48xlarge"])
    assert report.fake == fake
    x, w = torch.randn(ROWS, N, device="neuron"), torch.ones(N, device="neuron")
    for target, generation in (("trn1.32xlarge", "trn1"), ("trn2.48xlarge", "trn2")):
        want = rmsnorm.estimate(x, w, 1e-6, target=generation)
        row = report.row(target)
        op = row["nki_ops"][RMS_OP]
        assert op["kernels"] == ["rmsnorm"] and op["calls"] == 1
        assert op["seconds"] == pytest.approx(want.seconds, rel=1e-12)
        assert op["how"] == f"{want.bound}-bound estimate"
        assert row["breakdown"]["nki kernels"] == pytest.approx(want.seconds, rel=1e-12)
        (event,) = [e for e in report.timelines[target] if e["name"] == RMS_OP]
        assert event["seconds"] == pytest.approx(want.seconds, rel=1e-12)
    # A GPU keeps the roofline: output elements as FLOPs, the tensors read and written as bytes.
    gpu = get_target("p5.48xlarge")
    nbytes = (2 * ROWS * N + N) * 4
    roofline = max(ROWS * N / gpu.rate("vector", "float32"), nbytes / gpu.hbm_bandwidth)
    op = report.row("p5.48xlarge")["nki_ops"][RMS_OP]
    assert op["seconds"] == pytest.approx(roofline, rel=1e-12) and op["how"].startswith("roofline")
    assert "nki kernels" not in report.row("p5.48xlarge")["breakdown"]
    text = report.format()
    assert f"{RMS_OP} (NKI kernel rmsnorm)" in text and "Kernel.estimate" in text


def test_estimates_recorded_once_serve_every_generation():
    x, w = torch.randn(300, 128, device="neuron"), torch.randn(128, device="neuron")
    with nki.record_calls() as calls:
        nki_ops.rms_norm(x, w, 1e-6)
    (call,) = calls
    for generation in nki.TARGETS:
        want = rmsnorm.estimate(x, w, 1e-6, target=generation)
        got = call.estimate(generation)
        assert got.engine_seconds == pytest.approx(want.engine_seconds, rel=1e-12)
        assert (got.instructions, got.bound) == (want.instructions, want.bound)
    assert nki.is_nki_op(torch.ops.nki_examples.rms_norm.default) and not nki.is_nki_op(torch.ops.aten.mm.default)
