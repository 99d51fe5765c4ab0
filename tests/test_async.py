"""Asynchronous streams (TORCHNEURON_ASYNC=1): the host enqueues, a worker per stream runs, as on CUDA.

The mode is chosen when the runtime starts, so each program runs in a fresh process. The programs
hold a stream busy with ``torch.neuron._sleep(cycles)`` (cycles at a nominal 1 GHz: 300_000_000 is
0.3 s), which returns at once in this mode, so what the host sees right after is deterministic:
the work queued behind the sleep has not run yet.
"""

import ast
import os
import re
import subprocess
import sys
import textwrap

import torch

import torchneuron

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRUBBED = ("TORCHNEURON_STRICT", "TORCHNEURON_ASYNC", "TORCHNEURON_SANITIZER")


def run(code: str, mode: str | None = "async", timeout: int = 300) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh process: mode "async" (TORCHNEURON_ASYNC=1), "strict" or None (the default)."""
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    if mode == "async":
        env["TORCHNEURON_ASYNC"] = "1"
    elif mode == "strict":
        env["TORCHNEURON_STRICT"] = "1"
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def check(proc: subprocess.CompletedProcess) -> None:
    """Assert that a program ran to its last line, "ok"; on failure, show the program's failing line."""
    if proc.returncode != 0:
        lines = proc.args[2].splitlines()
        failing = [int(m) for m in re.findall(r'File "<string>", line (\d+)', proc.stderr)]
        where = "\n".join(f"line {n}: {lines[n - 1].strip()}" for n in failing[-1:] if 0 < n <= len(lines))
        raise AssertionError(f"{where}\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
    assert proc.stdout.splitlines()[-1] == "ok", proc.stdout[-2000:]


# Shared by the programs below: a small warm-up (the workers are running before anything is timed).
PRELUDE = """
    import time
    import torch, torchneuron
    assert torchneuron._C._async_mode() is True
    dev = "neuron"
    one4 = torch.ones(4, device=dev)
    torch.testing.assert_close((one4 + one4).cpu(), torch.full((4,), 2.0))   # also loads PyTorch's Python meta kernels
    default = torch.neuron.current_stream()

    def since(t0):
        return time.perf_counter() - t0
"""


def test_the_host_enqueues_and_streams_and_events_follow_the_queues():
    check(run(PRELUDE + """
    # The host returns right after enqueueing; the stream is busy until the queue drains.
    one = torch.ones(1000, device=dev)
    t0 = time.perf_counter()
    torch.neuron._sleep(300_000_000)
    x = torch.zeros(1000, device=dev)
    for _ in range(50):
        x.add_(one)
    host = since(t0)
    assert host < 0.15, f"enqueueing a sleep and 51 ops took {host:.3f} s: the host waited"
    assert default.query() is False, "query() right after _sleep(0.3 s)"
    torch.neuron.synchronize()
    assert since(t0) >= 0.28, f"synchronize() returned after {since(t0):.3f} s, before the 0.3 s sleep ended"
    assert default.query() is True
    assert torch.equal(x.cpu(), torch.full((1000,), 50.0))

    # A side stream: its own queue, events on it, and the default stream made to wait for it.
    side = torch.neuron.Stream()
    y = torch.zeros(1000, device=dev)
    side.wait_stream(default)
    with torch.neuron.stream(side):
        torch.neuron._sleep(300_000_000)
        y.add_(one, alpha=7)
        e = torch.neuron.Event()
        e.record()
    assert side.query() is False, "side stream query() after _sleep"
    assert e.query() is False, "an event recorded behind _sleep is done"
    t0 = time.perf_counter()
    default.synchronize()                       # waits for the default stream only
    assert since(t0) < 0.15, f"default_stream.synchronize() waited {since(t0):.3f} s for another stream"
    assert side.query() is False
    default.wait_stream(side)
    z = y.clone()                               # queued on the default stream behind the side stream's add_
    torch.testing.assert_close(z.cpu(), torch.full((1000,), 7.0))
    assert e.query() is True, "the event precedes the point the default stream waited for"
    assert side.query() is True

    # Stream.wait_event, Event.synchronize.
    with torch.neuron.stream(side):
        torch.neuron._sleep(300_000_000)
        y.add_(one)
        e2 = side.record_event()
    default.wait_event(e2)
    w = y.clone()                               # queued on the default stream behind e2
    assert e2.query() is False, "an event recorded behind _sleep is done"
    t0 = time.perf_counter()
    e2.synchronize()
    assert since(t0) >= 0.2, f"Event.synchronize() returned after {since(t0):.3f} s"
    assert e2.query() is True
    torch.testing.assert_close(w.cpu(), torch.full((1000,), 8.0))

    # Side stream's own synchronize, while the default stream is busy.
    torch.neuron._sleep(1_000_000_000)
    with torch.neuron.stream(side):
        v = torch.ones(10, device=dev) * 5
    t0 = time.perf_counter()
    side.synchronize()
    assert since(t0) < 0.5, f"side.synchronize() waited {since(t0):.3f} s for the default stream"
    assert default.query() is False

    # Another device's queue is its own: synchronize(0) does not wait for neuron:1.
    torch.neuron.synchronize()
    with torch.neuron.device(1):
        torch.neuron._sleep(300_000_000)
        q1 = torch.neuron.current_stream()
    t0 = time.perf_counter()
    torch.neuron.synchronize(0)
    assert since(t0) < 0.15, f"synchronize(0) waited {since(t0):.3f} s for neuron:1"
    assert q1.query() is False
    torch.neuron.synchronize(1)
    assert q1.query() is True

    # Event timing: the device's time between the events, while the host runs ahead.
    torch.neuron.synchronize()
    start = torch.neuron.Event(enable_timing=True)
    end = torch.neuron.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    torch.neuron._sleep(50_000_000)
    end.record()
    host_ms = since(t0) * 1e3
    assert end.query() is False
    try:
        start.elapsed_time(end)             # CUDA: cudaErrorNotReady
    except RuntimeError:
        pass
    else:
        raise AssertionError("elapsed_time() before the end event completed did not raise")
    end.synchronize()
    ms = start.elapsed_time(end)
    assert ms >= 45, f"elapsed_time around _sleep(50 ms) is {ms:.2f} ms"
    assert host_ms < 25, f"the host took {host_ms:.2f} ms to enqueue the sleep and the event"
    print("ok")
    """))


def test_ops_return_before_their_kernels_run():
    check(run(PRELUDE + """
    import torch.nn.functional as F
    x, y = torch.randn(64, 64, device=dev), torch.randn(64, 64, device=dev)
    idx = torch.tensor([3, 1, 2], device=dev)
    w = torch.randn(64, 64, device=dev, requires_grad=True)
    loss = (y @ w).tanh().sum()
    ops = {
        "x + y": lambda: x + y, "x * 2": lambda: x * 2, "x + 1": lambda: x + 1, "x.add_(y)": lambda: x.add_(y),
        "x.add_(1)": lambda: x.add_(1), "x.mul_(0.5)": lambda: x.mul_(0.5), "x.sin()": lambda: x.sin(),
        "x.sum()": lambda: x.sum(), "x.sum(1)": lambda: x.sum(1), "x @ y": lambda: x @ y,
        "x > 0": lambda: x > 0, "torch.where": lambda: torch.where(x > 0, x, y),
        "torch.zeros": lambda: torch.zeros(64, device=dev), "x.fill_(1)": lambda: x.fill_(1.0),
        "x.clone()": lambda: x.clone(), "x.to(float16)": lambda: x.to(torch.float16),
        "x.t().contiguous()": lambda: x.t().contiguous(), "torch.cat": lambda: torch.cat([x, y]),
        "F.relu": lambda: F.relu(x), "F.softmax": lambda: F.softmax(x, -1),
        "F.layer_norm": lambda: F.layer_norm(x, (64,)), "F.linear": lambda: F.linear(x, y, y[0]),
        "index_select": lambda: torch.index_select(x, 0, idx), "F.embedding": lambda: F.embedding(idx, x),
        "F.cross_entropy": lambda: F.cross_entropy(x, idx.repeat(22)[:64]),
        "masked_fill": lambda: x.masked_fill(x > 0, 0.0), "loss.backward()": lambda: loss.backward(),
    }
    waited = {}
    for name, op in ops.items():
        torch.neuron._sleep(100_000_000)
        t0 = time.perf_counter()
        op()
        if default.query():                  # the 0.1 s sleep before it is over: the op waited for it
            waited[name] = round(since(t0), 3)
    torch.neuron.synchronize()
    w_cpu = w.detach().cpu().requires_grad_()
    (y.cpu() @ w_cpu).tanh().sum().backward()
    torch.testing.assert_close(w.grad.cpu(), w_cpu.grad)
    assert not waited, f"these ops waited for the stream instead of being queued (seconds): {waited}"
    print("ok")
    """))


def test_reading_a_tensor_on_the_host_waits_for_its_stream():
    check(run(PRELUDE + """
    def after_sleep(read):
        a = torch.zeros(8, device=dev)
        torch.neuron._sleep(200_000_000)
        a.fill_(3.0)
        assert default.query() is False, "precondition: fill_ is queued behind the sleep"
        t0 = time.perf_counter()
        got = read(a)
        return got, since(t0)

    expected = torch.full((8,), 3.0)
    reads = {
        ".item()": (lambda a: a[5].item(), lambda got: got == 3.0),
        ".cpu()": (lambda a: a.cpu(), lambda got: torch.equal(got, expected)),
        ".to('cpu')": (lambda a: a.to("cpu"), lambda got: torch.equal(got, expected)),
        ".tolist()": (lambda a: a.tolist(), lambda got: got == [3.0] * 8),
        "str()": (lambda a: str(a), lambda got: "3., 3., 3." in got),
        "torch.equal": (lambda a: torch.equal(a, torch.full((8,), 3.0, device=dev)), lambda got: got is True),
        "bool()": (lambda a: bool((a == 3).all()), lambda got: got is True),
    }
    for name, (read, good) in reads.items():
        got, waited = after_sleep(read)
        assert good(got), f"{name} after _sleep returned {got!r}"
        assert waited >= 0.1, f"{name} returned after {waited:.3f} s, before the stream's sleep ended"
        assert default.query() is True, name

    # empty_cache() waits for the device first.
    torch.neuron._sleep(300_000_000)
    t0 = time.perf_counter()
    torch.neuron.empty_cache()
    assert since(t0) >= 0.25, f"empty_cache() returned after {since(t0):.3f} s"
    assert default.query() is True
    print("ok")
    """))


def test_kernel_errors_surface_at_the_next_synchronization_and_shape_errors_at_the_op():
    check(run(PRELUDE + """
    w = torch.randn(10, 4, device=dev)
    bad = torch.tensor([1, 20], device=dev)          # 20 is out of range: only the kernel sees it

    def fail_then(sync, name, stream=None):
        torch.neuron._sleep(100_000_000)             # the kernel runs after the host has moved on
        with torch.neuron.stream(stream):
            out = torch.index_select(w, 0, bad)      # returns: the error is the kernel's
        try:
            sync(out)
        except RuntimeError as e:
            msg = str(e)
        else:
            raise AssertionError(f"{name}: no error")
        for part in ("failed asynchronously", "index out of range in self", "index_select"):
            assert part in msg, f"{name}: {part!r} not in the message: {msg}"
        torch.neuron.synchronize()                   # reported once
        torch.testing.assert_close((torch.arange(4.0, device=dev) * 2).cpu(), torch.arange(4.0) * 2)
        torch.testing.assert_close(torch.index_select(w, 0, bad % 10).cpu(), w.cpu()[[1, 0]])

    def record_and_sync(out):
        e = torch.neuron.Event()
        e.record()
        e.synchronize()

    fail_then(lambda out: torch.neuron.synchronize(), "torch.neuron.synchronize()")
    fail_then(lambda out: torch.ones(1, device=dev).item(), ".item() of another tensor")
    fail_then(lambda out: out.cpu(), ".cpu()")
    fail_then(record_and_sync, "Event.synchronize()")
    fail_then(lambda out: torch.neuron.synchronize(), "synchronize() after a side stream's failure",
              stream=torch.neuron.Stream())

    # An error belongs to its device.
    w1, bad1 = w.to("neuron:1"), bad.to("neuron:1")
    torch.index_select(w1, 0, bad1)
    torch.neuron.synchronize(0)
    try:
        torch.neuron.synchronize(1)
    except RuntimeError as e:
        assert "failed asynchronously" in str(e) and "index_select" in str(e), str(e)
    else:
        raise AssertionError("the failure on neuron:1 was not raised by synchronize(1)")
    torch.testing.assert_close((w1 * 2).cpu(), w.cpu() * 2)

    # Shape errors are raised at the op, with the CPU's message. (An op the meta kernel refuses runs
    # synchronously: the host waits for the stream, then the CPU kernel raises, so the error is the
    # op's own, not a queued kernel's.)
    a, b = torch.ones(3, device=dev), torch.ones(4, device=dev)
    torch.neuron._sleep(300_000_000)
    try:
        a + b
    except RuntimeError as e:
        msg = str(e)
    else:
        raise AssertionError("adding shapes (3,) and (4,) did not raise")
    assert "must match the size of tensor b (4)" in msg and "failed asynchronously" not in msg, msg
    torch.neuron.synchronize()      # nothing failed on the device
    print("ok")
    """))


def test_non_blocking_copies_between_device_and_pinned_memory_are_queued():
    check(run(PRELUDE + """
    n = 1 << 16
    src = torch.full((n,), 3.0, device=dev)

    # device -> pinned host, non_blocking: enqueued; the destination is written when the stream gets there.
    pinned = torch.zeros(n).pin_memory()
    torch.neuron._sleep(300_000_000)
    t0 = time.perf_counter()
    pinned.copy_(src, non_blocking=True)
    assert since(t0) < 0.1, f"a non_blocking copy to pinned memory took {since(t0):.3f} s"
    assert torch.count_nonzero(pinned).item() == 0, "the pinned destination changed before the stream ran the copy"
    torch.neuron.synchronize()
    assert torch.equal(pinned, torch.full((n,), 3.0))

    # .to("cpu", non_blocking=True) makes a pinned destination (as for CUDA), so it is queued too.
    torch.neuron._sleep(300_000_000)
    t0 = time.perf_counter()
    out = src.to("cpu", non_blocking=True)
    assert since(t0) < 0.1 and out.is_pinned(), (since(t0), out.is_pinned())
    assert default.query() is False
    default.synchronize()
    assert torch.equal(out, torch.full((n,), 3.0))

    # device -> pageable host, non_blocking: synchronous (the host cannot be handed a pending pageable buffer).
    pageable = torch.zeros(n)
    torch.neuron._sleep(200_000_000)
    src.fill_(4.0)
    assert default.query() is False, "precondition: fill_ is queued behind the sleep"
    t0 = time.perf_counter()
    pageable.copy_(src, non_blocking=True)
    assert since(t0) >= 0.1 and torch.equal(pageable, torch.full((n,), 4.0)), since(t0)

    # device -> pinned host, blocking: synchronous.
    torch.neuron._sleep(200_000_000)
    src.fill_(5.0)
    pinned.copy_(src)
    assert torch.equal(pinned, torch.full((n,), 5.0))

    # pinned host -> device, non_blocking: enqueued.
    host = torch.full((n,), 6.0).pin_memory()
    dst = torch.zeros(n, device=dev)
    torch.neuron._sleep(300_000_000)
    t0 = time.perf_counter()
    dst.copy_(host, non_blocking=True)
    assert since(t0) < 0.1, f"a non_blocking copy from pinned memory took {since(t0):.3f} s"
    assert default.query() is False
    torch.neuron.synchronize()
    assert torch.equal(dst.cpu(), torch.full((n,), 6.0))

    # pageable host -> device, non_blocking: the source is read before the call returns.
    pageable = torch.full((n,), 7.0)
    torch.neuron._sleep(200_000_000)
    dst.copy_(pageable, non_blocking=True)
    pageable.fill_(8.0)
    assert torch.equal(dst.cpu(), torch.full((n,), 7.0)), "a pageable source was read after the copy returned"

    # host -> device, blocking: the stream is idle afterwards, as after cudaMemcpy.
    torch.neuron._sleep(200_000_000)
    dst.copy_(torch.full((n,), 9.0))
    assert default.query() is True
    assert torch.equal(dst.cpu(), torch.full((n,), 9.0))
    print("ok")
    """))


def test_a_non_blocking_copy_reads_its_pinned_source_when_the_stream_runs_it():
    # The hazard CUDA has: the pinned buffer is read by the copy, not when copy_ returns. A program that
    # refills it before synchronizing sends the new contents (what the sanitizer reports as a bug).
    check(run(PRELUDE + """
    host = torch.full((1024,), 1.0).pin_memory()
    dst = torch.zeros(1024, device=dev)
    torch.neuron._sleep(300_000_000)
    dst.copy_(host, non_blocking=True)
    host.fill_(2.0)
    torch.neuron.synchronize()
    got = dst.cpu()
    assert torch.equal(got, torch.full((1024,), 2.0)), f"the copy sent {got[:4].tolist()}, not the refilled buffer"
    print("ok")
    """))


def test_record_stream_keeps_a_freed_block_until_its_stream_passes():
    check(run(PRELUDE + """
    n = (1 << 20) + 1024                   # a size no other tensor here has
    side = torch.neuron.Stream()
    x = torch.full((n,), 2.0, device=dev)   # allocated on the default stream
    side.wait_stream(default)
    with torch.neuron.stream(side):
        torch.neuron._sleep(300_000_000)
        y = x.sin()                         # reads x after the sleep
    assert side.query() is False, "precondition: sin is queued behind the sleep"
    x.record_stream(side)
    x_ptr = x.data_ptr()
    del x
    z = torch.empty(n, device=dev)
    z.fill_(-1.0)                           # on the default stream, long before the side stream reads x
    assert z.data_ptr() != x_ptr, "the block of x was reused while the side stream could still read it"
    assert side.query() is False
    default.wait_stream(side)
    torch.testing.assert_close(y.cpu(), torch.full((n,), 2.0).sin())
    assert torch.equal(z.cpu(), torch.full((n,), -1.0))

    # Once the side stream passed the free, the block is the default stream's again.
    side.synchronize()
    reserved = torch.neuron.memory_reserved()
    again = torch.empty(n, device=dev)
    assert torch.neuron.memory_reserved() == reserved, "the released block was not reused"
    print("ok")
    """))


def test_the_allocator_keeps_blocks_per_stream_and_counts_a_pending_free_as_freed():
    check(run(PRELUDE + """
    n = (1 << 20) + 2048
    side = torch.neuron.Stream()

    # A block freed on a stream is reused by that stream, not by another one.
    with torch.neuron.stream(side):
        a = torch.empty(n, device=dev)
        a_ptr = a.data_ptr()
        del a
    b = torch.empty(n, device=dev)
    assert b.data_ptr() != a_ptr, "the default stream got a block cached for the side stream"
    with torch.neuron.stream(side):
        c = torch.empty(n, device=dev)
        assert c.data_ptr() == a_ptr, "the side stream did not get its own cached block back"
    del b, c
    torch.neuron.synchronize()

    def used_on_side_then_freed(x, sleep_ns):   # x used on the side stream behind a sleep, recorded there
        side.wait_stream(default)
        with torch.neuron.stream(side):
            torch.neuron._sleep(sleep_ns)
            x.add_(x)
        assert side.query() is False, "precondition: add_ is queued behind the sleep"
        x.record_stream(side)

    # memory_allocated() drops at the free, as on CUDA; the block stays reserved until the stream passes.
    base = torch.neuron.memory_allocated()
    for i in range(5):
        x = torch.full((n,), 1.0, device=dev)
        size = torch.neuron.memory_allocated() - base
        assert size >= 4 * n, size
        used_on_side_then_freed(x, 100_000_000)
        del x
        assert torch.neuron.memory_allocated() == base, (i, torch.neuron.memory_allocated() - base)
        if i == 0:
            reserved = torch.neuron.memory_reserved()
        torch.neuron.synchronize()
        assert torch.neuron.memory_allocated() == base
        assert torch.neuron.memory_reserved() <= reserved, f"round {i}: reserved memory grew: a block leaked"

    # empty_cache() waits for the pending free, then releases the block.
    x = torch.full((n,), 1.0, device=dev)
    used_on_side_then_freed(x, 300_000_000)
    del x
    pending = torch.neuron.memory_reserved()
    t0 = time.perf_counter()
    torch.neuron.empty_cache()
    assert since(t0) >= 0.25, f"empty_cache() returned after {since(t0):.3f} s"
    assert torch.neuron.memory_reserved() <= pending - 4 * n, (pending, torch.neuron.memory_reserved())
    assert torch.neuron.memory_allocated() == base
    print("ok")
    """))


TRAINING = """
    import torch, torchneuron
    import torch.nn.functional as F
    from torchneuron.models.gpt import GPT, GPTConfig
    print("async", torchneuron._C._async_mode())
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=64, dropout=0.1)
    model = GPT(cfg).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 65, (8, 32), device="neuron")
    losses = []
    for _ in range(4):
        logits = model(x)[0]
        loss = F.cross_entropy(logits.flatten(0, 1), x.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())        # no host read inside the loop: the steps queue up
    print("losses", torch.stack(losses).cpu().tolist())
    print("weights", [p.detach().double().sum().item() for p in model.parameters()][:6])
    print("ok")
"""


def test_a_training_loop_gives_the_same_losses_as_the_default_mode():
    runs = {}
    for mode in ("async", None):
        proc = run(TRAINING, mode=mode)
        check(proc)
        lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines()[:-1])
        assert lines["async"] == str(mode == "async"), lines["async"]
        runs[mode] = {k: ast.literal_eval(lines[k]) for k in ("losses", "weights")}
    for key in ("losses", "weights"):
        torch.testing.assert_close(torch.tensor(runs["async"][key], dtype=torch.float64),
                                   torch.tensor(runs[None][key], dtype=torch.float64))
    assert runs[None]["losses"][-1] < runs[None]["losses"][0]


def test_strict_mode_implies_async_and_the_default_mode_stays_synchronous():
    code = """
    import time, torch, torchneuron
    torch.ones(1, device="neuron").cpu()
    t0 = time.perf_counter()
    torch.neuron._sleep(200_000_000)
    print(torchneuron._C._async_mode(), torch.neuron.current_stream().query(), time.perf_counter() - t0 >= 0.19)
    torch.neuron.synchronize()
    print("ok")
    """
    strict, default = run(code, mode="strict"), run(code, mode=None)
    check(strict)
    check(default)
    assert strict.stdout.splitlines()[0] == "True False False", strict.stdout  # queued; the host went on
    assert default.stdout.splitlines()[0] == "False True True", default.stdout  # the host slept with the stream


def test_the_mode_of_this_process_follows_its_environment():
    expected = os.environ.get("TORCHNEURON_ASYNC") == "1" or os.environ.get("TORCHNEURON_STRICT") == "1"
    assert torchneuron._C._async_mode() is expected


_CORPUS_RUNNER = """
import contextlib, io, json, runpy, sys
import torch
outputs = {}
for path in sys.argv[1:]:
    torch.manual_seed(0)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(path, run_name="__main__")
    torch.neuron.synchronize()
    outputs[path] = out.getvalue()
print(json.dumps(outputs))
"""


def test_the_corpus_fixed_programs_print_the_same_in_both_modes():
    """The fixed twins of tests/data/async_bugs synchronize correctly, so running them asynchronously
    changes nothing they print (seeded alike). Their buggy twins do change here: they read data the
    device has not written yet (docs/runtime.md, the bug corpus)."""
    import glob
    import json

    paths = [p for p in sorted(glob.glob(os.path.join(ROOT, "tests", "data", "async_bugs", "*_fixed.py")))
             if "elapsed_time" not in p]  # that one prints a time
    assert len(paths) >= 8

    def outputs(mode):
        env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
        if mode:
            env["TORCHNEURON_ASYNC"] = "1"
        proc = subprocess.run([sys.executable, "-c", _CORPUS_RUNNER, *paths], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    default, asynchronous = outputs(False), outputs(True)
    for path in paths:
        assert default[path].strip(), f"{path} printed nothing"
        assert asynchronous[path] == default[path], (path, default[path], asynchronous[path])


def test_a_host_wait_holding_the_interpreter_lock_does_not_block_the_worker():
    """The host may wait for a stream while holding Python's lock (`t.add_(d, alpha=scalar_tensor)` reads
    the scalar inside the argument parser). The queued op keeps copies of its CPU scalars, so the
    worker never drops a tensor Python has seen (which would need that lock)."""
    check(run(PRELUDE + """
    x = torch.ones(1 << 16, device=dev)
    two = torch.tensor(2.0)                  # a CPU scalar Python knows
    torch.neuron._sleep(200_000_000)
    y = x * two                              # queued behind the sleep
    z = x * 3                                # its wrapped number went through mul's meta kernel, in Python
    del two                                  # Python lets go: the op holds the last reference, if any
    p = torch.zeros(4, device=dev)
    alpha = torch.ones((), device=dev) * 0.5
    p.add_(torch.ones(4, device=dev), alpha=alpha)   # .item() on alpha inside the parser, lock held
    torch.testing.assert_close(p.cpu(), torch.full((4,), 0.5))
    torch.testing.assert_close(y.cpu(), torch.full((1 << 16,), 2.0))
    torch.testing.assert_close(z.cpu(), torch.full((1 << 16,), 3.0))
    print("ok")
    """, timeout=120))
