"""Device memory: the caching allocator's statistics, empty_cache, mem_get_info and OOM."""

import gc
import textwrap

import pytest
import torch

MiB = 1 << 20


@pytest.fixture(autouse=True)
def _clean_allocator():
    # Tensors die by reference counting; no gc.collect() needed (it costs ~0.3 s a call).
    torch.neuron.empty_cache()
    yield
    torch.neuron.empty_cache()


def test_allocation_raises_memory_allocated_and_free_returns_it():
    start = torch.neuron.memory_allocated()
    x = torch.empty(MiB, dtype=torch.uint8, device="neuron")
    assert torch.neuron.memory_allocated() >= start + MiB
    assert torch.neuron.memory_allocated(0) == torch.neuron.memory_allocated("neuron:0")
    assert torch.neuron.max_memory_allocated() >= start + MiB
    assert torch.neuron.memory_reserved() >= torch.neuron.memory_allocated()
    del x
    assert torch.neuron.memory_allocated() == start


@pytest.mark.parametrize("make", [
    pytest.param(lambda: torch.zeros(MiB // 4, device="neuron"), id="factory"),
    pytest.param(lambda: torch.ones(MiB // 4).to("neuron"), id="copy"),
    pytest.param(lambda: torch.arange(MiB // 4, dtype=torch.float32, device="neuron"), id="kernel-output"),
    pytest.param(lambda: torch.ones(MiB // 4, device="neuron") * 2, id="binary-op"),
])
def test_every_way_of_making_a_tensor_is_counted(make):
    start = torch.neuron.memory_allocated()
    x = make()
    assert x.device.type == "neuron"
    assert torch.neuron.memory_allocated() >= start + MiB
    del x
    assert torch.neuron.memory_allocated() == start


def test_devices_are_accounted_separately(two_devices):
    a0, a1 = torch.neuron.memory_allocated(0), torch.neuron.memory_allocated(1)
    x = torch.empty(2 * MiB, dtype=torch.uint8, device="neuron:1")
    assert torch.neuron.memory_allocated(1) >= a1 + 2 * MiB
    assert torch.neuron.memory_allocated(0) == a0
    with torch.neuron.device(1):
        assert torch.neuron.memory_allocated() >= a1 + 2 * MiB
    y = x.to("neuron:0")
    assert torch.neuron.memory_allocated(0) >= a0 + 2 * MiB
    del x, y
    assert (torch.neuron.memory_allocated(0), torch.neuron.memory_allocated(1)) == (a0, a1)


def test_caching_and_empty_cache():
    x = torch.empty(4 * MiB, dtype=torch.uint8, device="neuron")
    reserved = torch.neuron.memory_reserved()
    free_while_held = torch.neuron.mem_get_info()[0]
    ptr = x.data_ptr()
    del x
    # Freed memory stays cached (reserved) and is reused for a request of the same size.
    assert torch.neuron.memory_reserved() == reserved
    y = torch.empty(4 * MiB, dtype=torch.uint8, device="neuron")
    assert y.data_ptr() == ptr
    assert torch.neuron.memory_reserved() == reserved
    del y
    torch.neuron.empty_cache()
    assert torch.neuron.memory_reserved() <= reserved - 4 * MiB
    assert torch.neuron.mem_get_info()[0] >= free_while_held + 4 * MiB
    assert torch.accelerator.memory_reserved() == torch.neuron.memory_reserved()


def test_mem_get_info():
    free, total = torch.neuron.mem_get_info()
    assert total == torch.neuron.get_device_properties(0).total_memory
    assert 0 < free <= total
    x = torch.empty(8 * MiB, dtype=torch.uint8, device="neuron")
    free2, total2 = torch.neuron.mem_get_info(0)
    assert total2 == total and free2 <= free - 8 * MiB
    assert torch.neuron.mem_get_info(torch.device("neuron:1"))[1] == total
    del x


def test_peak_stats_and_reset():
    torch.neuron.reset_peak_memory_stats()
    base = torch.neuron.memory_allocated()
    assert torch.neuron.max_memory_allocated() == base
    x = torch.empty(3 * MiB, dtype=torch.uint8, device="neuron")
    del x
    assert torch.neuron.max_memory_allocated() >= base + 3 * MiB
    assert torch.neuron.max_memory_reserved() >= base + 3 * MiB
    torch.neuron.reset_peak_memory_stats()
    assert torch.neuron.max_memory_allocated() == torch.neuron.memory_allocated() == base
    torch.neuron.reset_max_memory_allocated(0)
    assert torch.neuron.max_memory_allocated() == base


def test_memory_stats_keys_like_cuda():
    base = torch.neuron.memory_stats()
    slack = base["allocated_bytes.all.current"] - base["requested_bytes.all.current"]  # tensors still alive
    x = torch.empty(1000, dtype=torch.uint8, device="neuron")  # small pool, not a multiple of 512
    y = torch.empty(2 * MiB, dtype=torch.uint8, device="neuron")  # large pool
    stats = torch.neuron.memory_stats()
    for key in ["allocated_bytes.all.current", "allocated_bytes.all.peak", "allocated_bytes.all.allocated",
                "allocated_bytes.all.freed", "allocated_bytes.small_pool.current",
                "allocated_bytes.large_pool.current", "reserved_bytes.all.current", "active_bytes.all.current",
                "requested_bytes.all.current", "allocation.all.current", "segment.all.current",
                "num_alloc_retries", "num_ooms"]:
        assert key in stats, key
    assert stats["allocated_bytes.all.current"] == torch.neuron.memory_allocated()
    assert stats["reserved_bytes.all.current"] == torch.neuron.memory_reserved()
    assert stats["allocated_bytes.large_pool.current"] >= 2 * MiB
    assert stats["allocated_bytes.small_pool.current"] >= 1000
    # Requested bytes are what was asked for; allocated bytes are rounded up.
    assert stats["allocated_bytes.all.current"] - stats["requested_bytes.all.current"] == slack + 24
    assert stats["allocation.all.current"] == base["allocation.all.current"] + 2
    assert dict(torch.accelerator.memory_stats(0)) == dict(stats)
    del x, y


def test_reset_accumulated_memory_stats():
    x = torch.empty(10, device="neuron")
    del x
    assert torch.neuron.memory_stats()["allocation.all.allocated"] > 0
    torch.neuron.reset_accumulated_memory_stats()
    stats = torch.neuron.memory_stats()
    assert stats["allocation.all.allocated"] == 0
    assert stats["allocation.all.freed"] == 0
    assert stats["num_ooms"] == 0


def test_memory_summary():
    x = torch.empty(2 * MiB, dtype=torch.uint8, device="neuron")
    s = torch.neuron.memory_summary()
    assert "neuron:0" in s and "Allocated memory" in s and "Reserved memory" in s
    assert "2.00 MiB" in s
    assert "small pool" in s and "small pool" not in torch.neuron.memory_summary(abbreviated=True)
    assert "neuron:1" in torch.neuron.memory_summary(device=1)
    del x


def test_out_of_memory_error_names_device_size_and_capacity(device_works):
    keep = torch.arange(1000.0, device="neuron")
    ooms = torch.neuron.memory_stats()["num_ooms"]
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(20 << 30, dtype=torch.uint8, device="neuron")
    msg = str(info.value)
    assert "neuron:0" in msg
    assert "20.00 GiB" in msg  # the request
    assert "16.00 GiB" in msg  # the capacity
    assert torch.neuron.OutOfMemoryError is torch.OutOfMemoryError
    assert isinstance(info.value, RuntimeError)  # as with CUDA, OutOfMemoryError is a RuntimeError
    assert torch.neuron.memory_stats()["num_ooms"] == ooms + 1
    torch.testing.assert_close(keep.cpu(), torch.arange(1000.0))
    device_works()


@pytest.mark.parametrize("request_bytes", [(20 << 30) + 123_456_789, (17 << 30) + 1])
def test_python_and_the_allocator_write_sizes_alike(request_bytes):
    """One formatter per language: the OOM message's sizes are those of torchneuron._units.format_bytes."""
    from torchneuron._units import format_bytes

    total = torch.neuron.mem_get_info()[1]
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(request_bytes, dtype=torch.uint8, device="neuron")
    msg = str(info.value)
    assert f"Tried to allocate {format_bytes(request_bytes)}." in msg
    assert f"total capacity of {format_bytes(total)}" in msg
    assert [format_bytes(n) for n in (0, 1023, 1024, 1536, 5 << 20)] == [
        "0 bytes", "1023 bytes", "1.00 KiB", "1.50 KiB", "5.00 MiB"]


def test_out_of_memory_on_second_device_names_it(two_devices, device_works):
    with pytest.raises(torch.OutOfMemoryError, match="neuron:1"):
        torch.empty(17 << 30, dtype=torch.uint8, device="neuron:1")
    device_works("neuron:1")


def test_allocate_compute_free_loop_returns_to_start():
    gc.collect()  # earlier tests' exception tracebacks may keep tensors in reference cycles
    start = torch.neuron.memory_allocated()
    start1 = torch.neuron.memory_allocated(1)
    reserved_after_first = None
    lin = torch.nn.Linear(32, 32).neuron()
    params_bytes = torch.neuron.memory_allocated() - start
    for i in range(200):
        x = torch.randn(64, 32, device="neuron", requires_grad=True)
        y = lin(x).relu()
        z = y.t() @ y
        z[0].add_(1)                                   # in-place on a view
        out = torch.empty(0, device="neuron")
        torch.add(z.detach(), 1, out=out)              # out= that resizes
        idx = torch.nonzero(out > out.mean())          # data-dependent size
        loss = z.sum() + out.sum() + idx.sum() * 0
        loss.backward()
        moved = x.detach().to("neuron:1").cpu()
        del x, y, z, out, idx, loss, moved
        lin.zero_grad(set_to_none=True)
        if i == 0:
            reserved_after_first = torch.neuron.memory_reserved()
    gc.collect()
    assert torch.neuron.memory_allocated() == start + params_bytes
    assert torch.neuron.memory_allocated(1) == start1
    # The cache reuses blocks instead of growing without bound.
    assert torch.neuron.memory_reserved() <= reserved_after_first + 4 * MiB
    del lin
    assert torch.neuron.memory_allocated() == start


def test_device_memory_capacity_limit(run_python):
    """With TORCHNEURON_DEVICE_MEMORY=64MiB small tensors reach the capacity."""
    code = textwrap.dedent('''
        import torch
        MiB = 1 << 20
        n = torch.neuron
        assert n.get_device_properties(0).total_memory == 64 * MiB, n.get_device_properties(0)
        assert n.mem_get_info() == (64 * MiB, 64 * MiB), n.mem_get_info()

        def works():
            x = torch.arange(10.0, device="neuron")
            assert torch.equal((x * 2 + 1).cpu(), torch.arange(10.0) * 2 + 1)

        a = torch.full((10 * MiB,), 7.0, device="neuron")            # 40 MiB
        assert n.mem_get_info()[0] == 24 * MiB
        try:
            torch.empty(10 * MiB, device="neuron")                    # another 40 MiB
        except torch.OutOfMemoryError as e:
            msg = str(e)
            assert "neuron:0" in msg and "40.00 MiB" in msg and "64.00 MiB" in msg, msg
        else:
            raise AssertionError("no OutOfMemoryError")
        assert n.memory_stats()["num_ooms"] == 1
        assert torch.equal(a[::MiB].cpu(), torch.full((10,), 7.0))
        works()

        # The zero-copy path (a kernel's output taken over by the device) is limited too.
        try:
            a + 1
        except torch.OutOfMemoryError as e:
            assert "neuron:0" in str(e) and "64.00 MiB" in str(e), str(e)
        else:
            raise AssertionError("no OutOfMemoryError from a kernel output")
        assert torch.equal(a[::MiB].cpu(), torch.full((10,), 7.0))
        works()

        # An out= argument that must grow is limited too, and keeps its old contents on failure.
        out = torch.ones(4, device="neuron")
        try:
            torch.add(a, 1, out=out)
        except torch.OutOfMemoryError:
            pass
        else:
            raise AssertionError("no OutOfMemoryError from resizing an out= argument")
        assert torch.equal(out.cpu(), torch.ones(4)), out
        works()

        # Another device has its own capacity.
        c = torch.empty(10 * MiB, device="neuron:1")
        assert n.memory_allocated(1) >= 40 * MiB

        # Freeing the first tensor makes room: the cached block is released and reused.
        del a
        assert n.memory_reserved() >= 40 * MiB  # cached, not returned yet
        b = torch.ones(10 * MiB, device="neuron")
        assert b.sum().item() == 10 * MiB
        assert n.memory_allocated() >= 40 * MiB
        del b
        n.empty_cache()
        assert n.memory_reserved(0) == n.memory_allocated(0)

        # Two 40 MiB tensors never fit at once, but a long loop of them does.
        for _ in range(20):
            x = torch.randn(10 * MiB, device="neuron")
            del x
        two = [torch.empty(5 * MiB, device="neuron") for _ in range(3)]  # 60 MiB
        assert n.mem_get_info()[0] < 5 * MiB
        del two
        works()
        print("ok")
    ''')
    r = run_python(code, env={"TORCHNEURON_DEVICE_MEMORY": "64MiB"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "ok"


def test_host_memory_stats_count_pinned_memory():
    before = torch.neuron.host_memory_stats().get("allocated_bytes.current", 0)
    p = torch.empty(MiB, dtype=torch.uint8).pin_memory()
    stats = torch.neuron.host_memory_stats()
    assert stats["allocated_bytes.current"] >= before + MiB     # keys as torch.cuda.host_memory_stats()
    assert stats["allocations.current"] >= 1
    del p
    assert torch.neuron.host_memory_stats()["allocated_bytes.current"] == before


def test_kernel_buffers_come_from_the_device_cache():
    """A CPU kernel run for the device allocates its result and its scratch (oneDNN's, through
    raw_allocate) from the device's caching allocator: a training loop reuses cached blocks instead of
    asking the runtime for memory on every op, and leaves nothing behind."""
    import torch.nn.functional as F

    a = torch.randn(256, 256, device="neuron")
    x = torch.randn(4, 3, 16, 16, device="neuron")
    w = torch.randn(8, 3, 3, 3, device="neuron", requires_grad=True)

    def step():
        y = F.conv2d(x, w).relu()
        (y.sum() + (a @ a).sum()).backward()
        grad, w.grad = w.grad, None
        return grad

    expected = torch.func.grad(lambda w: F.conv2d(x.cpu(), w).relu().sum())(w.detach().cpu())
    torch.testing.assert_close(step().cpu(), expected, rtol=1e-4, atol=1e-4)
    for _ in range(3):  # warm: in fused eager, the step's group is compiled on its second run
        step()
    start = torch.neuron.memory_allocated()
    runtime_allocations = torch.neuron.memory_stats()["num_device_alloc"]
    for _ in range(5):
        step()
    assert torch.neuron.memory_stats()["num_device_alloc"] == runtime_allocations
    assert torch.neuron.memory_allocated() == start


# ---- lazily committed device memory -------------------------------------------------------------

_LAZY_CODE = textwrap.dedent('''
    import torch
    MiB, GiB = 1 << 20, 1 << 30
    n = torch.neuron

    def rss():
        n.synchronize()  # asynchronous mode: the work queued so far has run
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024

    def zeros_at(t, starts, k=1000):
        for s in starts:
            torch.testing.assert_close(t[s:s + k].cpu(), torch.zeros(k, dtype=t.dtype))

    torch.zeros(4, device="neuron").cpu()  # the device is up
    allocated, reserved, free = n.memory_allocated(), n.memory_reserved(), n.mem_get_info()[0]
    before = rss()

    # 12 GiB of zeros on a 16 GiB device: capacity is charged, host memory is not.
    x = torch.zeros(3 * GiB, dtype=torch.float32, device="neuron")
    grown = rss() - before
    assert grown < 256 * MiB, f"torch.zeros of 12 GiB grew RSS by {grown / MiB:.0f} MiB"
    assert n.memory_allocated() == allocated + 12 * GiB
    assert n.memory_reserved() == reserved + 12 * GiB
    assert n.mem_get_info()[0] == free - 12 * GiB
    stats = n.memory_stats()
    assert stats["allocated_bytes.all.current"] == allocated + 12 * GiB
    zeros_at(x, [0, 123_457, x.numel() // 2 + 3, x.numel() - 1000])

    # Writing a part commits that part, roughly.
    base = rss()
    part = 64 * MiB // 4
    x[:part].fill_(1.5)
    grown = rss() - base
    assert 60 * MiB < grown < 160 * MiB, f"writing 64 MiB grew RSS by {grown / MiB:.0f} MiB"
    torch.testing.assert_close(x[part - 1000:part + 1000].cpu(),
                               torch.cat([torch.full((1000,), 1.5), torch.zeros(1000)]))
    # ... and zeroing it gives its pages back, leaving what is around it.
    x[7:part - 5].zero_()
    assert rss() - base < 16 * MiB, f"RSS {(rss() - base) / MiB:.0f} MiB above before the write"
    torch.testing.assert_close(x[:part + 10].cpu(),
                               torch.cat([torch.full((7,), 1.5), torch.zeros(part - 12), torch.full((5,), 1.5),
                                          torch.zeros(10)]))

    # Out of memory as before: another 5 GiB does not fit, and the zeros are still there.
    try:
        torch.zeros(5 * GiB, dtype=torch.uint8, device="neuron")
    except torch.OutOfMemoryError as e:
        assert "neuron:0" in str(e) and "16.00 GiB" in str(e), str(e)
    else:
        raise AssertionError("no OutOfMemoryError")
    assert n.memory_stats()["num_ooms"] == stats["num_ooms"] + 1
    zeros_at(x, [part, x.numel() - 1000])

    # Freed: cached (reserved) until empty_cache, which gives the pages back to the host.
    reserved = n.memory_reserved()  # the failed request's retry released the other cached blocks
    del x
    assert n.memory_allocated() == allocated and n.memory_reserved() == reserved
    n.empty_cache()
    assert n.memory_reserved() == reserved - 12 * GiB and n.mem_get_info()[0] == 16 * GiB - n.memory_reserved()
    # Written device memory goes back to the host when the runtime frees it.
    y = torch.full((64 * MiB // 4,), 2.0, device="neuron")
    written = rss()
    del y
    n.empty_cache()
    assert written - rss() > 56 * MiB, f"freeing 64 MiB written gave back {(written - rss()) / MiB:.0f} MiB"

    # A written block, cached and handed out again, reads back what is written to it.
    a = torch.full((4 * MiB,), 3.0, device="neuron")
    ptr = a.data_ptr()
    del a
    b = torch.empty(4 * MiB, device="neuron")
    assert b.data_ptr() == ptr
    b.zero_()
    b[::4096] = torch.arange(1024.0, device="neuron")
    expected = torch.zeros(4 * MiB)
    expected[::4096] = torch.arange(1024.0)
    torch.testing.assert_close(b.cpu(), expected)
    c = torch.zeros_like(b) + b.new_zeros(b.shape)
    torch.testing.assert_close(c.cpu(), torch.zeros(4 * MiB))
    print("ok")
''')


@pytest.mark.parametrize("mode", [
    pytest.param({}, id="default"),
    pytest.param({"TORCHNEURON_STRICT": "1"}, id="strict"),
    pytest.param({"TORCHNEURON_ASYNC": "1"}, id="async"),
])
def test_device_memory_costs_the_host_nothing_until_written(run_python, mode):
    """torch.zeros of 12 GiB on a 16 GiB device grows host RSS by little (the runtime's memset hands the
    pages back instead of writing them), reads back zeros, and commits only what is written; capacity,
    statistics and out-of-memory errors are those of the device."""
    # Op by op: fused eager records zero_ like any op (its group's CPU code then writes the zeros).
    r = run_python(_LAZY_CODE, env={"TORCHNEURON_DEVICE_MEMORY": "16GiB", "TORCHNEURON_EAGER": "op", **mode},
                   timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "ok"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64,
                                   torch.uint8])
def test_zero_fill_of_large_tensors_matches_cpu(dtype):
    """zero_, fill_(0), zeros, zeros_like and new_zeros of tensors past the runtime's memset threshold
    (1 MiB), dense, strided and sliced, equal the CPU's."""
    shape = (1024, 1031)  # 1 to 8 MiB, rows not page-aligned
    cpu = (torch.arange(shape[0] * shape[1]) % 7 + 1).reshape(shape).to(dtype)
    dev = cpu.to("neuron")
    for op in [lambda t: t.zero_(), lambda t: t.fill_(0), lambda t: t.fill_(False),
               lambda t: t[3:-2].zero_(), lambda t: t.t().zero_(), lambda t: t[:, ::2].zero_(),
               lambda t: t[1:].fill_(0.0)]:
        expected, got = cpu.clone(), dev.clone()
        op(expected), op(got)
        torch.testing.assert_close(got.cpu(), expected)
    torch.testing.assert_close(torch.zeros(shape, dtype=dtype, device="neuron").cpu(), torch.zeros(shape, dtype=dtype))
    torch.testing.assert_close(torch.zeros_like(dev).cpu(), torch.zeros_like(cpu))
    torch.testing.assert_close(dev.new_zeros((2, *shape)).cpu(), cpu.new_zeros((2, *shape)))


def test_fill_with_negative_zero_keeps_its_sign():
    """fill_(-0.0) writes -0.0 (not bytes of zero), as on the CPU."""
    t = torch.ones(MiB, device="neuron").fill_(-0.0)
    assert torch.signbit(t.cpu()).all()
    with pytest.raises(RuntimeError):  # what the CPU raises for a complex value into a real tensor
        torch.ones(MiB).fill_(1j)
    with pytest.raises(RuntimeError, match="overflow"):  # asynchronous mode: raised by the copy's wait
        torch.ones(MiB, device="neuron").fill_(1j).cpu()
