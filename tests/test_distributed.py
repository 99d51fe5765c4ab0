"""The ``neuron`` torch.distributed backend, with 2 processes on loopback.

Two worker processes (this file, run as a script, is the worker) rendezvous
on 127.0.0.1 and run scenarios one after the other (a launch costs seconds of
imports, so there are only two: the scenarios that succeed, and the failures):

* ``collectives``: every collective on neuron tensors against gloo's result on
  the same values in CPU tensors (``"cpu:gloo,neuron:neuron"``), sync and
  async, every ReduceOp, functional collectives, no host copies.
* ``training``: DDP and FSDP2 (``fully_shard``) training of the small GPT equal
  to single-process training on the combined batch; a sharded state dict saved
  and loaded with ``torch.distributed.checkpoint``; DTensor on a 2-D mesh.
* ``failures``: a rank hangs, then dies; the other fails with a clear error
  within the timeout instead of hanging.
* ``cpu_gloo``: a CPU-only program (``init_process_group("gloo")``, FSDP2 with
  its default mesh) with torchneuron loaded and without it, and gloo's own
  group on neuron tensors.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

import pytest

WORLD_SIZE = 2
LAUNCH_TIMEOUT = 120


# ================================ the test side =========================================================

def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(scenarios: list[str], world: int = WORLD_SIZE, env: dict | None = None,
            timeout: float = LAUNCH_TIMEOUT) -> list[tuple[int, str]]:
    """Run ``scenarios`` one after the other in ``world`` worker processes; each one's (exit code, output)."""
    ports = ",".join(str(_free_port()) for _ in scenarios)
    procs = []
    for rank in range(world):
        penv = dict(os.environ)
        penv.update(MASTER_ADDR="127.0.0.1", RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                    LOCAL_WORLD_SIZE=str(world), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
                    TORCHNEURON_NUM_DEVICES="2", PYTHONWARNINGS="ignore", TEST_PORTS=ports)
        penv.update(env or {})
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), *scenarios],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=penv))
    deadline = time.monotonic() + timeout
    results = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
            raise AssertionError(f"{scenarios} did not finish within {timeout}s; output:\n{out}")
        results.append((p.returncode, out))
    return results


def _check(results: list[tuple[int, str]], marker: str) -> None:
    for rank, (code, out) in enumerate(results):
        assert marker in out, f"rank {rank} exited with {code}; output:\n{out}"


@pytest.fixture(scope="module")
def healthy_run(tmp_path_factory):
    """One launch for the scenarios that must succeed (imports dominate a launch's cost)."""
    ckpt = tmp_path_factory.mktemp("dcp") / "ckpt"
    results = _launch(["collectives", "training"], env={"TEST_CKPT_DIR": str(ckpt)})
    for rank, (code, out) in enumerate(results):
        assert code == 0, f"rank {rank} exited with {code}; output:\n{out}"
    return results


@pytest.fixture(scope="module")
def failing_run():
    return _launch(["failures"], env={"TORCH_FR_BUFFER_SIZE": "64"})


def test_collectives_match_gloo_on_cpu(healthy_run):
    _check(healthy_run, "COLLECTIVES OK")


def test_ddp_and_fsdp2_training_match_single_process(healthy_run):
    _check(healthy_run, "TRAINING OK")


def test_replacing_pytorchs_kernels_is_silent(healthy_run):
    for rank, (_, out) in enumerate(healthy_run):
        assert "Overriding a previously registered kernel" not in out, f"rank {rank}:\n{out}"


def test_a_rank_that_hangs_makes_the_other_time_out_clearly(failing_run):
    code, out = failing_run[0]
    assert "HANG FAILED AS EXPECTED" in out, f"rank 0 exited with {code}; output:\n{out}"
    assert "neuron backend: all_reduce failed on rank 0 of 2" in out and "Timed out" in out, out
    assert "process group's timeout" in out, out


def test_the_flight_recorder_names_the_collective_a_rank_never_joined(failing_run):
    import re

    last = {}
    for rank, (_, out) in enumerate(failing_run):
        m = re.search(rf"FLIGHT RECORDER rank {rank} last (\S+) seq=(\d+) pg=(\d+)", out)
        assert m, f"rank {rank}:\n{out}"
        last[rank] = (m.group(1), int(m.group(2)), m.group(3))
    # Rank 0's newest record is the all_reduce it waited for, one past the last one rank 1 joined.
    assert last[0][0] == "gloo:all_reduce" and last[0][2] == last[1][2] and last[0][1] == last[1][1] + 1, last


def test_destroy_process_group_after_failures_does_not_hang(failing_run):
    import re

    code, out = failing_run[0]
    m = re.search(r"DESTROYED in ([0-9.]+)s", out)
    assert code == 0 and m and float(m.group(1)) < 5, out


def test_a_rank_that_dies_makes_the_other_fail_clearly(failing_run):
    code, out = failing_run[0]
    assert code == 0 and "DEATH FAILED AS EXPECTED" in out, f"rank 0 exited with {code}; output:\n{out}"
    assert "failed on rank 0 of 2" in out and "closed by peer" in out, out
    assert failing_run[1][0] == 3, failing_run[1]
    assert "ASYNC FAILED AS EXPECTED" in out, out


def test_ddp_in_fused_eager_cuts_alike_on_both_ranks_and_does_not_hang():
    results = _launch(["fused_ddp"])
    _check(results, "FUSED DDP OK")
    lines = [{line.split(" ", 2)[1]: line.split(" ", 2)[2] for line in out.splitlines() if line.startswith("FUSED ")}
             for _, out in results]
    assert lines[0]["GROUPS"] == lines[1]["GROUPS"], lines  # the same groups, seen as often, cut by the same
    assert int(lines[0]["COMPILED"]) > 0, lines             # a repeated group ran as its compiled graph
    assert lines[0]["PARAMS"] == lines[1]["PARAMS"], lines   # replicas stay equal


def test_cpu_only_fsdp2_on_gloo_runs_as_without_torchneuron():
    # init_process_group("gloo") and FSDP2 with its default mesh, on CPU tensors: the default mesh is the
    # accelerator's (torch._C._get_accelerator(), neuron once torchneuron is loaded), as it is CUDA's on a
    # CUDA machine, and gloo serves that device's tensors as it serves CUDA's. Losses and weights equal a
    # run without torchneuron (TORCH_DEVICE_BACKEND_AUTOLOAD=0), bit for bit.
    with_it = _launch(["cpu_gloo"])
    without = _launch(["cpu_gloo"], env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    _check(with_it, "CPU GLOO OK")
    _check(without, "CPU GLOO OK")
    for rank in range(WORLD_SIZE):
        a = [line for line in with_it[rank][1].splitlines() if line.startswith("CPU GLOO RESULT")]
        b = [line for line in without[rank][1].splitlines() if line.startswith("CPU GLOO RESULT")]
        assert a and a == b, (a, b)
    assert "CPU GLOO DEVICE neuron" in with_it[0][1], with_it[0][1]
    assert "CPU GLOO DEVICE cpu" in without[0][1], without[0][1]
    assert "CPU GLOO NEURON COLLECTIVES OK" in with_it[0][1], with_it[0][1]


def test_fsdp2_meta_device_recipe_under_torchrun(tmp_path):
    # with torch.device("meta"): build; fully_shard; to_empty(device=...); init_weights(); train.
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "fsdp_meta_init.py")
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCHNEURON_NUM_DEVICES="2", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), script],
                          capture_output=True, text=True, timeout=LAUNCH_TIMEOUT * 2, env=env, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert out.count("FSDP META INIT OK") == WORLD_SIZE, out


def test_exit_while_a_gloo_worker_holds_a_python_tensor_does_not_abort(tmp_path):
    # Without the neuron backend's exit hook, rank 0 aborts here ("terminate called without an active
    # exception", SIGABRT), as DDP crash-and-resume runs sometimes did at exit under load.
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "exit_while_gloo_works.py")
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCHNEURON_NUM_DEVICES="2", PYTHONWARNINGS="ignore",
               GLOO_SOCKET_IFNAME="lo")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), script],
                          capture_output=True, text=True, timeout=LAUNCH_TIMEOUT * 2, env=env, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "terminate called" not in out, out
    assert "rank 0 leaves" in out and "rank 1 sent" in out, out
    # The broadcast was still held by gloo's worker when the hook ran: the abort's path was taken.
    held = re.search(r"gloo's worker threads still held (\d+) work", out)
    assert held and int(held.group(1)) >= 1, out


def test_each_rank_uses_neuron_local_rank(monkeypatch):
    import torch
    from torchneuron.distributed import select_device

    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert select_device() == 1 and torch.neuron.current_device() == 1
    monkeypatch.delenv("LOCAL_RANK")
    assert select_device() is None and torch.neuron.current_device() == 1  # left as it is


def test_more_ranks_than_devices_needs_device_sharing(monkeypatch):
    import torch
    from torchneuron.distributed import select_device

    count = torch.neuron.device_count()
    monkeypatch.setenv("LOCAL_RANK", str(count))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(count + 1))
    with pytest.raises(RuntimeError, match="TORCHNEURON_ALLOW_DEVICE_SHARING=1"):
        select_device()
    monkeypatch.setenv("LOCAL_RANK", "0")  # every rank fails, not only those beyond the last device
    with pytest.raises(RuntimeError, match=f"{count + 1} ranks run on this machine but it has only {count}"):
        select_device()
    monkeypatch.setenv("LOCAL_RANK", str(count))
    monkeypatch.setenv("TORCHNEURON_ALLOW_DEVICE_SHARING", "1")
    assert select_device() == 0 and torch.neuron.current_device() == 0


def test_init_process_group_refuses_more_ranks_than_devices():
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "3"}
    (code, out), = _launch(["device_check"], world=1, env=env)
    assert code == 0 and "DEVICE CHECK OK" in out, out


# ================================ the worker side =======================================================

def _values(shape, dtype, rank, salt=0):
    """Deterministic values, different on each rank, exactly representable in every dtype used."""
    import torch

    n = 1
    for s in shape:
        n *= s
    base = (torch.arange(n, dtype=torch.int64) * (rank + 3) + 7 * salt + rank) % 11 + 1
    return base.reshape(shape).to(dtype)


def _both(name, fn):
    """Run ``fn(device)`` on cpu (gloo) and on neuron; their outputs (or errors) must agree."""
    import torch

    results = {}
    for device in ("cpu", "neuron"):
        try:
            outs = fn(torch.device(device))
            for t in outs:
                assert t.device.type == device, f"{name}: output on {t.device}, expected {device}"
            results[device] = [t.cpu() for t in outs]
        except Exception as e:  # both must fail alike
            results[device] = e
    cpu, neu = results["cpu"], results["neuron"]
    if isinstance(cpu, Exception) or isinstance(neu, Exception):
        assert isinstance(cpu, Exception) and isinstance(neu, Exception), f"{name}: cpu {cpu!r} vs neuron {neu!r}"
        return
    assert len(cpu) == len(neu), name
    for a, b in zip(cpu, neu):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=lambda m: f"{name}: {m}")


def _scenario_collectives() -> None:
    import gc
    import weakref
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed import ReduceOp
    from torchneuron import _C

    dist.init_process_group("cpu:gloo,neuron:neuron")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert torch.neuron.current_device() == rank  # neuron:LOCAL_RANK
    assert dist.get_backend() == "cpu:gloo,neuron:neuron"
    group = dist.group.WORLD
    V = lambda shape, dtype, device, salt=0: _values(shape, dtype, rank, salt).to(device)  # noqa: E731

    # all_reduce: every ReduceOp gloo knows, sync and async
    for op, dtypes in [(ReduceOp.SUM, (torch.float32, torch.int64, torch.bfloat16)), (ReduceOp.AVG, (torch.float32,)),
                       (ReduceOp.PRODUCT, (torch.float32, torch.int32)), (ReduceOp.MIN, (torch.float32, torch.int64)),
                       (ReduceOp.MAX, (torch.float64, torch.int64)), (ReduceOp.BAND, (torch.int64, torch.uint8)),
                       (ReduceOp.BOR, (torch.int32,)), (ReduceOp.BXOR, (torch.int64,))]:
        for dtype in dtypes:
            def run(d, op=op, dtype=dtype):
                t = V((5, 3), dtype, d)
                dist.all_reduce(t, op=op)
                return [t]
            _both(f"all_reduce {op} {dtype}", run)

    def async_all_reduce(d):
        t = V((1000,), torch.float32, d)
        w = dist.all_reduce(t, async_op=True)
        w.wait()
        assert w.is_completed() and w.is_success() and w.exception() is None
        value = w.get_future().wait()
        assert value[0].device == t.device and value[0].data_ptr() == t.data_ptr()
        assert [r.data_ptr() for r in w.result()] == [t.data_ptr()] and w.result()[0].device == t.device
        return [t]
    _both("all_reduce async", async_all_reduce)

    def wait_with_timeout(d):
        t = V((8,), torch.float32, d)
        if rank == 1:
            time.sleep(0.5)
        w = dist.all_reduce(t, async_op=True)
        if rank == 0:
            try:
                w.wait(timeout=timedelta(milliseconds=50))
                raise AssertionError("wait(timeout) returned before rank 1 joined")
            except dist.DistBackendError as e:  # gloo's own work raises a RuntimeError here
                assert "50" in str(e) or "within" in str(e), e
            except RuntimeError:
                pass
        w.wait()
        return [t]
    _both("wait(timeout)", wait_with_timeout)
    _both("all_reduce AVG int64 (gloo refuses)", lambda d: [dist.all_reduce(t := V((4,), torch.int64, d),
                                                                            op=ReduceOp.AVG) or t])
    # PREMUL_SUM (FSDP2's gradient reduction), which gloo lacks: on neuron, SUM of the inputs times the
    # factor (a float or a one-element tensor); the CPU side computes that with gloo's SUM.
    for factor in (2.0, torch.tensor([0.25], device="neuron")):
        f = float(factor)
        t = V((6,), torch.float32, "neuron")
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(factor))
        expected = V((6,), torch.float32, "cpu") * f
        dist.all_reduce(expected)
        torch.testing.assert_close(t.cpu(), expected, rtol=0, atol=0)
        x = V((2 * world,), torch.float32, "neuron", salt=1)
        before = x.cpu()
        out = torch.empty(2, device="neuron")
        dist.reduce_scatter_tensor(out, x, op=dist._make_nccl_premul_sum(factor))
        expected = torch.empty(2)
        dist.reduce_scatter_tensor(expected, before * f)
        torch.testing.assert_close(out.cpu(), expected, rtol=0, atol=0)
        torch.testing.assert_close(x.cpu(), before, rtol=0, atol=0)   # the input is left as it was
    del factor, t, x, out
    try:
        dist.reduce(torch.ones(4, device="neuron"), dst=0, op=dist._make_nccl_premul_sum(2.0))
        raise AssertionError("reduce accepted PREMUL_SUM")
    except ValueError as e:
        assert "multiply the tensor by the factor and use ReduceOp.SUM" in str(e), e

    for src in range(world):
        _both(f"broadcast src={src}", lambda d, src=src: [dist.broadcast(t := V((3, 4), torch.float32, d), src) or t])
    _both("broadcast async", lambda d: [(dist.broadcast(t := V((7,), torch.int64, d), 1, async_op=True).wait(), t)[1]])

    def all_gather(d):
        out = [torch.empty(2, 3, device=d) for _ in range(world)]
        dist.all_gather(out, V((2, 3), torch.float32, d))
        return out
    _both("all_gather", all_gather)

    def all_gather_into_tensor(d, async_op=False):
        out = torch.empty(world * 4, 3, device=d)
        w = dist.all_gather_into_tensor(out, V((4, 3), torch.float32, d), async_op=async_op)
        if async_op:
            w.wait()
        stacked = torch.empty(world, 4, 3, device=d)
        dist.all_gather_into_tensor(stacked, V((4, 3), torch.float32, d, 1))
        return [out, stacked]
    _both("all_gather_into_tensor", all_gather_into_tensor)
    _both("all_gather_into_tensor async", lambda d: all_gather_into_tensor(d, True))

    for op in (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MAX):
        def reduce_scatter_tensor(d, op=op):
            out = torch.empty(3, 2, device=d)
            dist.reduce_scatter_tensor(out, V((world * 3, 2), torch.float32, d), op=op)
            return [out]
        _both(f"reduce_scatter_tensor {op}", reduce_scatter_tensor)

    def reduce_scatter_tensor_async(d):
        out = torch.empty(4, device=d)
        dist.reduce_scatter_tensor(out, V((world * 4,), torch.float32, d), async_op=True).wait()
        return [out]
    _both("reduce_scatter_tensor async", reduce_scatter_tensor_async)

    def reduce_scatter(d):
        out = torch.empty(3, device=d)
        dist.reduce_scatter(out, [V((3,), torch.float32, d, i) for i in range(world)])
        return [out]
    _both("reduce_scatter", reduce_scatter)

    def all_to_all_single(d, uneven=False):
        if uneven:  # rank 0 sends 1 to itself and 2 to rank 1; rank 1 sends 3 to rank 0 and 1 to itself
            ins, outs = ([1, 2], [1, 3]) if rank == 0 else ([3, 1], [2, 1])
            out = torch.empty(sum(outs), device=d)
            dist.all_to_all_single(out, V((sum(ins),), torch.float32, d), outs, ins)
        else:
            out = torch.empty(world * 2, 3, device=d)
            dist.all_to_all_single(out, V((world * 2, 3), torch.float32, d))
        return [out]
    _both("all_to_all_single", all_to_all_single)
    _both("all_to_all_single uneven", lambda d: all_to_all_single(d, True))

    def all_to_all(d):
        out = [torch.empty(2, device=d) for _ in range(world)]
        dist.all_to_all(out, [V((2,), torch.float32, d, i) for i in range(world)])
        return out
    _both("all_to_all", all_to_all)

    for op in (ReduceOp.SUM, ReduceOp.MAX):
        def reduce(d, op=op):
            t = V((6,), torch.float32, d)
            dist.reduce(t, dst=1, op=op)
            return [t] if rank == 1 else []  # only the destination's result is defined
        _both(f"reduce {op}", reduce)

    def gather(d):
        out = [torch.empty(3, device=d) for _ in range(world)] if rank == 0 else None
        dist.gather(V((3,), torch.float32, d), out, dst=0)
        return out or []
    _both("gather", gather)

    def scatter(d):
        out = torch.empty(3, device=d)
        dist.scatter(out, [V((3,), torch.float32, d, i) for i in range(world)] if rank == 1 else None, src=1)
        return [out]
    _both("scatter", scatter)

    def send_recv(d):
        t = V((5,), torch.float32, d) if rank == 0 else torch.empty(5, device=d)
        if rank == 0:
            dist.send(t, 1)
            got = dist.recv(u := torch.empty(2, device=d))  # from any source
            assert got == 1
            return [u]
        dist.recv(t, 0)
        dist.send(V((2,), torch.float32, d, 1), 0)
        return [t]
    _both("send/recv", send_recv)

    def isend_irecv(d):
        t = V((4,), torch.int64, d) if rank == 0 else torch.empty(4, dtype=torch.int64, device=d)
        ops = [dist.P2POp(dist.isend, t, 1)] if rank == 0 else [dist.P2POp(dist.irecv, t, 0)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        w = dist.isend(t, 1) if rank == 0 else dist.irecv(t, 0)
        w.wait()
        return [t]
    _both("isend/irecv", isend_irecv)

    def coalesced(d):
        a, b = V((3,), torch.float32, d), V((2,), torch.float32, d, 1)
        with dist._coalescing_manager():
            dist.all_reduce(a)
            dist.all_reduce(b)
        oa, ob = torch.empty(world * 3, device=d), torch.empty(world * 2, device=d)
        with dist._coalescing_manager():
            dist.all_gather_into_tensor(oa, a)
            dist.all_gather_into_tensor(ob, b)
        ra, rb = torch.empty(3, device=d), torch.empty(2, device=d)
        with dist._coalescing_manager(async_ops=True) as cm:
            dist.reduce_scatter_tensor(ra, oa)
            dist.reduce_scatter_tensor(rb, ob)
        cm.wait()
        return [a, b, oa, ob, ra, rb]
    _both("coalesced all_reduce/all_gather_into_tensor/reduce_scatter_tensor", coalesced)

    def all_gather_coalesced(d):
        out = [[torch.empty(2, device=d), torch.empty(3, device=d)] for _ in range(world)]
        dist.all_gather_coalesced(out, [V((2,), torch.float32, d), V((3,), torch.float32, d, 1)])
        return [t for ts in out for t in ts]
    _both("all_gather_coalesced", all_gather_coalesced)

    def functional(d):
        x = V((world * 2, 3), torch.float32, d)
        return [funcol.all_reduce(x, "sum", group).wait(), funcol.all_gather_tensor(x, 0, group).wait(),
                funcol.reduce_scatter_tensor(x, "sum", 0, group).wait(),
                funcol.all_to_all_single(x, None, None, group).wait(), funcol.broadcast(x, 1, group).wait()]
    _both("functional collectives", functional)

    subgroup = dist.new_group([0, 1])
    _both("all_reduce on a new group", lambda d: [dist.all_reduce(t := V((3,), torch.float32, d), group=subgroup) or t])
    _both("barrier", lambda d: [dist.barrier(device_ids=[rank]) if d.type == "neuron" else dist.barrier()] and [])

    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    assert objs == [{"rank": r} for r in range(world)]

    # Zero copy: collectives on neuron tensors move no bytes between host and device.
    big = V((1 << 16,), torch.float32, "neuron")
    out = torch.empty(world * (1 << 16), device="neuron")
    torch.neuron.reset_transfer_stats()
    dist.all_reduce(big)
    dist.all_gather_into_tensor(out, big)
    dist.reduce_scatter_tensor(big, out)
    dist.broadcast(big, 0)
    stats = torch.neuron.transfer_stats()
    assert stats["host_to_device_bytes"] == 0 and stats["device_to_host_bytes"] == 0, stats

    # A handle nobody waits on (or whose future nobody waits on) holds its tensors only until the
    # collective has ended and the handle is dropped.
    gc.collect()
    base = torch.neuron.memory_allocated()
    t = torch.ones(1 << 18, device="neuron")
    ref = weakref.ref(t)
    w = dist.all_reduce(t, async_op=True)
    f = dist.broadcast(t, 1, async_op=True).get_future()
    assert torch.neuron.memory_allocated() == base + 4 * (1 << 18)
    del t, w, f
    deadline = time.monotonic() + 30
    while (ref() is not None or torch.neuron.memory_allocated() != base) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ref() is None and torch.neuron.memory_allocated() == base, (ref(), torch.neuron.memory_allocated(), base)

    gc.collect()
    assert _C._live_work_count() == 0, f"{_C._live_work_count()} work handles still alive"
    dist.destroy_process_group()
    print("COLLECTIVES OK", flush=True)


def _gpt_and_data():
    import torch
    from torchneuron.models import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=32))
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randint(0, 32, (8, 16), generator=g), torch.randint(0, 32, (8, 16), generator=g))
               for _ in range(3)]
    return model, batches


def _train(model, batches, device, shard=None):
    """AdamW steps; each batch is the global one, ``shard=(rank, world)`` takes this rank's part."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for x, y in batches:
        if shard is not None:
            x, y = x.chunk(shard[1])[shard[0]], y.chunk(shard[1])[shard[0]]
        _, loss = model(x.to(device), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _scenario_training() -> None:
    import copy
    import gc

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torchneuron import _C

    rank = int(os.environ["RANK"])
    device = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(device_id=device)  # -> the neuron backend, with gloo for CPU tensors
    world = dist.get_world_size()
    assert dist.get_backend() == "neuron" and torch.neuron.current_device() == device.index
    tol = dict(rtol=1e-4, atol=1e-5)

    base, batches = _gpt_and_data()
    reference = copy.deepcopy(base).to(device)
    _train(reference, batches, device)  # one process, the combined batch

    # DDP, and the gradient all-reduce reads and writes device memory without copies.
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    for kwargs, hook in (({}, None), ({"device_ids": [device.index], "gradient_as_bucket_view": True}, None),
                         ({}, default_hooks.allreduce_hook)):
        ddp = DDP(copy.deepcopy(base).to(device), bucket_cap_mb=0.05, **kwargs)
        if hook is not None:
            ddp.register_comm_hook(None, hook)
        x, y = (t.chunk(world)[rank].to(device) for t in batches[0])
        torch.neuron.reset_transfer_stats()
        _, loss = ddp(x, y)
        loss.backward()
        stats = torch.neuron.transfer_stats()
        assert stats["host_to_device_bytes"] == 0 and stats["device_to_host_bytes"] == 0, stats
        ddp = DDP(copy.deepcopy(base).to(device), **kwargs)
        if hook is not None:
            ddp.register_comm_hook(None, hook)
        _train(ddp, batches, device, (rank, world))
        for (name, p), q in zip(ddp.module.named_parameters(), reference.parameters()):
            torch.testing.assert_close(p.detach().cpu(), q.detach().cpu(), **tol, msg=lambda m: f"DDP {name}: {m}")

    # FSDP2: each block and the root sharded over the two ranks.
    def sharded():
        m = copy.deepcopy(base).to(device)
        for block in m.blocks:
            fully_shard(block)
        return fully_shard(m)

    fsdp = sharded()
    _train(fsdp, batches, device, (rank, world))
    for (name, p), q in zip(fsdp.named_parameters(), reference.parameters()):
        assert p.device == device
        torch.testing.assert_close(p.full_tensor().cpu(), q.detach().cpu(), **tol,
                                   msg=lambda m: f"FSDP2 {name}: {m}")

    # Sharded checkpoint: each rank writes its shards; a fresh sharded model loads them.
    ckpt_dir = os.environ["TEST_CKPT_DIR"]
    dcp.save({"model": fsdp.state_dict()}, checkpoint_id=ckpt_dir)
    restored = sharded()
    state = {"model": restored.state_dict()}
    dcp.load(state, checkpoint_id=ckpt_dir)
    restored.load_state_dict(state["model"])
    for (name, p), q in zip(restored.named_parameters(), fsdp.parameters()):
        assert p.to_local().device == device
        torch.testing.assert_close(p.full_tensor().cpu(), q.full_tensor().cpu(), rtol=0, atol=0)
    # ... and trains on exactly like the original.
    more = [batches[0]]
    torch.testing.assert_close(_train(restored, more, device, (rank, world)), _train(fsdp, more, device, (rank, world)))

    # DTensor on a 2-D mesh (whose groups split_group() makes, as the default group has a device).
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("neuron", (1, world), mesh_dim_names=("dp", "tp"))["tp"]
    x, w = torch.randn(4 * world, 6), torch.randn(6, 3)
    dx = distribute_tensor(x.to(device), mesh, [Shard(0)])
    dw = distribute_tensor(w.to(device), mesh, [Replicate()])
    assert dx.to_local().device == device and dx.to_local().shape == (4, 6)
    torch.testing.assert_close((dx @ dw).full_tensor().cpu(), x @ w, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dx.redistribute(mesh, [Shard(1)]).full_tensor().cpu(), x)
    torch.testing.assert_close(distribute_tensor(x.to(device), mesh, [Shard(1)]).sum().full_tensor().cpu(), x.sum(),
                               rtol=1e-5, atol=1e-5)

    del ddp, fsdp, restored, state
    gc.collect()
    assert _C._live_work_count() == 0, f"{_C._live_work_count()} work handles still alive"
    dist.destroy_process_group()
    print("TRAINING OK", flush=True)


def _scenario_failures() -> None:
    """Rank 1 first hangs (rank 0 must time out), then dies mid-training (rank 0 must fail at once)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = int(os.environ["RANK"])
    device = torch.device("neuron", rank)
    dist.init_process_group("neuron", timeout=timedelta(seconds=3))
    training = dist.new_group([0, 1])  # a second gloo context, untouched by the timeout below
    base, batches = _gpt_and_data()
    ddp = DDP(base.to(device), process_group=training)
    _train(ddp, batches[:1], device, (rank, 2))
    t = torch.ones(100, device=device)
    dist.all_reduce(t)

    if rank == 1:
        print(f"FLIGHT RECORDER rank 1 last {_last_flight_record()}", flush=True)
        time.sleep(5)  # alive, but never joins rank 0's next all_reduce ...
        os._exit(3)  # ... and then dies without a word
    start = time.monotonic()
    try:
        dist.all_reduce(t)
        print("all_reduce returned although rank 1 never joined", flush=True)
        os._exit(1)
    except dist.DistBackendError as e:
        elapsed = time.monotonic() - start
        assert 2.5 < elapsed < 6, f"failed after {elapsed:.1f}s with a 3s timeout"
        print(f"HANG FAILED AS EXPECTED after {elapsed:.2f}s: {e}", flush=True)
    # PyTorch's Flight Recorder (TORCH_FR_BUFFER_SIZE) holds the collective rank 1 never joined.
    print(f"FLIGHT RECORDER rank 0 last {_last_flight_record()}", flush=True)

    time.sleep(3.5)  # rank 1 is gone by now
    start = time.monotonic()
    try:
        _train(ddp, batches[1:], device, (rank, 2))
        print("rank 0 trained on although rank 1 died", flush=True)
        os._exit(1)
    except Exception as e:
        elapsed = time.monotonic() - start
        assert elapsed < 3, f"the error came after {elapsed:.1f}s"
        print(f"DEATH FAILED AS EXPECTED after {elapsed:.2f}s: {type(e).__name__}: {e}", flush=True)
    # An in-flight handle reports the failure too, from wait() and from its future.
    work = dist.all_reduce(t, group=training, async_op=True)
    future = work.get_future()
    for fail in (work.wait, future.wait):
        try:
            fail()
            print("an async all_reduce succeeded although rank 1 died", flush=True)
            os._exit(1)
        except Exception as e:
            assert "neuron backend: all_reduce failed on rank 0 of 2" in str(e), e
    assert work.is_completed() and not work.is_success()
    print("ASYNC FAILED AS EXPECTED", flush=True)
    start = time.monotonic()
    dist.destroy_process_group()
    print(f"DESTROYED in {time.monotonic() - start:.2f}s", flush=True)
    os._exit(0)


def _last_flight_record() -> str:
    """The newest entry of PyTorch's Flight Recorder on this rank, as 'name seq=N state'."""
    import pickle

    import torch

    entries = pickle.loads(torch._C._distributed_c10d._dump_fr_trace()).get("entries", [])
    last = max(entries, key=lambda e: e["record_id"]) if entries else None
    return "none" if last is None else f"{last['profiling_name']} seq={last['collective_seq_id']} pg={last['pg_id']}"


def _scenario_device_check() -> None:
    import torch.distributed as dist

    try:
        dist.init_process_group("neuron")
    except RuntimeError as e:
        assert "3 ranks run on this machine but it has only 2 neuron device(s)" in str(e), e
        assert "TORCHNEURON_ALLOW_DEVICE_SHARING=1" in str(e), e
    else:
        raise AssertionError("init_process_group accepted more ranks than devices")
    print("DEVICE CHECK OK", flush=True)


def _scenario_cpu_gloo() -> None:
    """A CPU-only program: gloo, FSDP2 with its default mesh, CPU tensors; no mention of neuron."""
    import hashlib
    import sys

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1 + rank)
    losses = []
    for _ in range(4):
        loss = model(torch.randn(4, 8, generator=gen)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item().hex())
    weights = torch.cat([p.full_tensor().detach().cpu().flatten() for p in model.parameters()])
    digest = hashlib.sha256(weights.numpy().tobytes()).hexdigest()
    print("CPU GLOO RESULT", losses, digest, flush=True)
    print("CPU GLOO DEVICE", next(model.parameters()).device.type, flush=True)
    if "torchneuron" in sys.modules:  # gloo's own group on neuron tensors, as on CUDA tensors
        device = torch.device("neuron", rank)
        t = torch.arange(6.0, device=device) * (rank + 1)
        dist.all_reduce(t)
        out = torch.empty(2 * world, device=device)
        dist.all_gather_into_tensor(out, torch.full((2,), float(rank), device=device))
        b = torch.full((3,), float(rank), device=device)
        dist.broadcast(b, src=1)
        assert t.device == device and t.cpu().tolist() == (torch.arange(6.0) * sum(range(1, world + 1))).tolist()
        assert out.cpu().tolist() == [float(r) for r in range(world) for _ in range(2)], out
        assert b.cpu().tolist() == [1.0] * 3, b
        print("CPU GLOO NEURON COLLECTIVES OK", flush=True)
    dist.destroy_process_group()
    print("CPU GLOO OK", flush=True)


def _scenario_fused_ddp():
    """DDP in fused eager: the ranks cut their groups at the same places and agree on the losses."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torchneuron

    rank = int(os.environ["RANK"])
    dist.init_process_group("neuron", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
    torch.neuron.set_device(rank)
    torch.neuron.set_eager_mode("fused")
    torchneuron._C._fused_config(min_ops=4, bypass_ops=0)  # this small model's groups compile too, none bypassed
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 4))
    ddp = DDP(model.to(f"neuron:{rank}"), bucket_cap_mb=0.01)  # several buckets: several all-reduces
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2, foreach=False)
    gen = torch.Generator().manual_seed(rank)
    losses = []
    for _ in range(6):
        x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)
        loss = nn.functional.mse_loss(ddp(x.to(f"neuron:{rank}")), y.to(f"neuron:{rank}"))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    mean = torch.stack(losses)
    dist.all_reduce(mean)
    report = torchneuron.compile.fused_report()
    print("FUSED GROUPS", [(g.ops, g.seen, g.first_cut) for g in report.groups], flush=True)
    print("FUSED COMPILED", sum(g.fused_runs for g in report.groups), flush=True)
    print("FUSED PARAMS", [round(float(p.detach().sum().cpu()), 4) for p in ddp.parameters()], flush=True)
    dist.destroy_process_group()
    print("FUSED DDP OK", flush=True)


if __name__ == "__main__":
    _scenarios = {"collectives": _scenario_collectives, "training": _scenario_training,
                  "failures": _scenario_failures, "device_check": _scenario_device_check,
                  "fused_ddp": _scenario_fused_ddp, "cpu_gloo": _scenario_cpu_gloo}
    for _name, _port in zip(sys.argv[1:], os.environ["TEST_PORTS"].split(",")):
        os.environ["MASTER_PORT"] = _port
        _scenarios[_name]()
