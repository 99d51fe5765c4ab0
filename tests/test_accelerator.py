"""torch.accelerator on neuron: every public function answers as torch.neuron does, with CUDA's semantics.

The functions come from ``torch.accelerator.__all__``: each has a check below, and a name without one
fails ``test_every_function_is_checked``, so a function a new PyTorch adds is not missed.
"""

import gc
import warnings

import pytest
import torch

MIB = 1 << 20


def _dtypes():
    return sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)


def _dtype_works(dtype, device="neuron"):
    """Whether tensors of `dtype` can be made, filled, copied both ways and converted on `device`."""
    try:
        host = torch.ones(4, dtype=dtype)
        on = torch.ones(4, dtype=dtype, device=device)
        back = host.to(device).cpu()
        converted = on.to(torch.float32).cpu()
        return bool(torch.equal(back.view(torch.uint8), host.view(torch.uint8))) and torch.equal(
            converted, host.to(torch.float32))
    except (RuntimeError, NotImplementedError, TypeError):
        return False


def check_current_accelerator():
    assert torch.accelerator.current_accelerator() == torch.device("neuron")
    assert torch.accelerator.current_accelerator(check_available=True) == torch.device("neuron")


def check_is_available():
    assert torch.accelerator.is_available() is torch.neuron.is_available() is True


def check_device_count():
    assert torch.accelerator.device_count() == torch.neuron.device_count() >= 1


def check_current_device_index():
    assert torch.accelerator.current_device_index() == torch.neuron.current_device() == 0
    if torch.neuron.device_count() > 1:
        torch.neuron.set_device(1)
        assert torch.accelerator.current_device_index() == 1


def check_current_device_idx():
    with pytest.warns(FutureWarning):
        assert torch.accelerator.current_device_idx() == torch.neuron.current_device()


def check_set_device_index():
    last = torch.neuron.device_count() - 1
    torch.accelerator.set_device_index(last)
    assert torch.neuron.current_device() == last
    assert torch.ones(1, device="neuron").device == torch.device("neuron", last)
    torch.accelerator.set_device_index(f"neuron:0")
    assert torch.neuron.current_device() == 0
    with pytest.raises(RuntimeError, match="Invalid device neuron:99"):
        torch.accelerator.set_device_index(99)
    with pytest.raises(ValueError):
        torch.accelerator.set_device_index("cpu")


def check_set_device_idx():
    with pytest.warns(FutureWarning):
        torch.accelerator.set_device_idx(torch.neuron.device_count() - 1)
    assert torch.neuron.current_device() == torch.neuron.device_count() - 1


def check_device_index():
    last = torch.neuron.device_count() - 1
    with torch.accelerator.device_index(last):
        assert torch.neuron.current_device() == last
        with torch.accelerator.device_index(None):  # no change, as documented
            assert torch.neuron.current_device() == last
    assert torch.neuron.current_device() == 0


def check_get_device_capability():
    capability = torch.accelerator.get_device_capability("neuron:0")
    assert set(capability) == {"supported_dtypes"}
    claimed = set(capability["supported_dtypes"])
    # Exactly the dtypes that work on the device, and the same set as the CPU, whose kernels it runs.
    working = {dt for dt in _dtypes() if _dtype_works(dt)}
    assert claimed == working, (sorted(map(str, claimed ^ working)))
    assert working == {dt for dt in _dtypes() if _dtype_works(dt, "cpu")}
    assert {torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.complex64,
            torch.float8_e4m3fn} <= claimed
    for i in range(torch.neuron.device_count()):
        assert torch.accelerator.get_device_capability(i) == capability
    assert torch.accelerator.get_device_capability() == capability  # the current device
    # torch.neuron's (major, minor) pair is the device's compute capability, as torch.cuda's.
    major, minor = torch.neuron.get_device_capability("neuron:0")
    assert (major, minor) == (torch.neuron.get_device_properties(0).major,
                              torch.neuron.get_device_properties(0).minor)
    with pytest.raises(RuntimeError, match="Invalid device neuron:99"):
        torch.accelerator.get_device_capability.__wrapped__(99)


def check_current_stream():
    for i in range(torch.neuron.device_count()):
        assert torch.accelerator.current_stream(i) == torch.neuron.current_stream(i)
        assert torch.accelerator.current_stream(i) == torch.neuron.default_stream(i)
    s = torch.neuron.Stream()
    with torch.neuron.stream(s):
        assert torch.accelerator.current_stream() == s == torch.neuron.current_stream()


def check_set_stream():
    last = torch.neuron.device_count() - 1
    s = torch.neuron.Stream(last)
    torch.accelerator.set_stream(s)
    # As torch.cuda.set_stream: the stream's device becomes current.
    assert torch.neuron.current_device() == last
    assert torch.neuron.current_stream(last) == s
    x = torch.ones(3, device="neuron") * 2
    s.synchronize()
    torch.testing.assert_close(x.cpu(), torch.full((3,), 2.0))


def check_synchronize():
    start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    start.record()
    torch.neuron._sleep(2_000_000)  # 2 ms on the current stream
    y = torch.arange(10.0, device="neuron").sum()
    end.record()
    torch.accelerator.synchronize()
    assert end.query() and torch.neuron.current_stream().query()
    assert start.elapsed_time(end) >= 1.0
    assert y.item() == 45.0
    torch.accelerator.synchronize("neuron:0")
    torch.accelerator.synchronize(torch.device("neuron", torch.neuron.device_count() - 1))


def _memory_pair(name, device):
    return getattr(torch.accelerator, name)(device), getattr(torch.neuron, name)(device)


def check_memory_allocated():
    gc.collect()
    before = torch.accelerator.memory_allocated(0)
    assert before == torch.neuron.memory_allocated(0)
    x = torch.empty(MIB, dtype=torch.uint8, device="neuron:0")
    after = torch.accelerator.memory_allocated(0)
    assert after == torch.neuron.memory_allocated(0) and after - before >= MIB
    del x
    assert torch.accelerator.memory_allocated(0) == before
    assert torch.accelerator.memory_allocated() == torch.neuron.memory_allocated()


def check_max_memory_allocated():
    torch.accelerator.reset_peak_memory_stats(0)
    base = torch.accelerator.memory_allocated(0)
    x = torch.empty(4 * MIB, dtype=torch.uint8, device="neuron:0")
    del x
    peak = torch.accelerator.max_memory_allocated(0)
    assert peak == torch.neuron.max_memory_allocated(0) and peak >= base + 4 * MIB


def check_memory_reserved():
    x = torch.empty(2 * MIB, dtype=torch.uint8, device="neuron:0")
    reserved, neuron = _memory_pair("memory_reserved", 0)
    assert reserved == neuron >= torch.accelerator.memory_allocated(0) >= 2 * MIB
    del x


def check_max_memory_reserved():
    x = torch.empty(3 * MIB, dtype=torch.uint8, device="neuron:0")
    peak, neuron = _memory_pair("max_memory_reserved", 0)
    assert peak == neuron >= torch.accelerator.memory_reserved(0) >= 3 * MIB
    del x


def check_memory_stats():
    x = torch.empty(MIB, dtype=torch.uint8, device="neuron:0")
    stats = torch.accelerator.memory_stats(0)
    assert stats == torch.neuron.memory_stats(0)
    # CUDA's keys, flattened as torch.cuda.memory_stats flattens them.
    for key in ("allocated_bytes.all.current", "reserved_bytes.all.peak", "active_bytes.all.allocated",
                "num_alloc_retries", "num_ooms", "segment.all.current", "allocation.all.current"):
        assert key in stats, key
    assert stats["allocated_bytes.all.current"] == torch.accelerator.memory_allocated(0)
    del x


def check_reset_peak_memory_stats():
    x = torch.empty(8 * MIB, dtype=torch.uint8, device="neuron:0")
    del x
    assert torch.accelerator.max_memory_allocated(0) >= 8 * MIB + torch.accelerator.memory_allocated(0)
    torch.accelerator.reset_peak_memory_stats(0)
    assert torch.accelerator.max_memory_allocated(0) == torch.accelerator.memory_allocated(0)
    assert torch.neuron.max_memory_allocated(0) == torch.neuron.memory_allocated(0)


def check_reset_accumulated_memory_stats():
    x = torch.empty(MIB, dtype=torch.uint8, device="neuron:0")
    del x
    assert torch.accelerator.memory_stats(0)["allocation.all.allocated"] > 0
    torch.accelerator.reset_accumulated_memory_stats(0)
    stats = torch.accelerator.memory_stats(0)
    assert stats["allocation.all.allocated"] == 0 and stats["allocation.all.freed"] == 0
    assert stats == torch.neuron.memory_stats(0)


def check_empty_cache():
    x = torch.empty(5 * MIB, dtype=torch.uint8, device="neuron:0")
    del x
    assert torch.accelerator.memory_reserved(0) > torch.accelerator.memory_allocated(0)
    torch.accelerator.empty_cache()
    # As CUDA's: the unoccupied cached memory goes back to the device.
    assert torch.accelerator.memory_reserved(0) == torch.neuron.memory_reserved(0)
    assert torch.accelerator.memory_reserved(0) - torch.accelerator.memory_allocated(0) < 5 * MIB
    free, total = torch.accelerator.get_memory_info(0)
    assert total - free == torch.accelerator.memory_reserved(0)


def check_empty_host_cache():
    # As CUDA's: afterwards no unoccupied pinned memory is held. neuron's pinned allocator caches
    # nothing (a freed pinned block goes back at once), so there is nothing to release.
    pinned = torch.empty(MIB, dtype=torch.uint8).pin_memory()
    kept = torch.empty(MIB, dtype=torch.uint8).pin_memory()
    assert pinned.is_pinned()
    del pinned
    gc.collect()
    torch.accelerator.empty_host_cache()
    stats = torch.neuron.host_memory_stats()
    assert stats["allocated_bytes.current"] == stats["active_bytes.current"] >= MIB
    assert kept.is_pinned()


def check_get_memory_info():
    for i in range(torch.neuron.device_count()):
        free, total = torch.accelerator.get_memory_info(i)
        assert (free, total) == torch.neuron.mem_get_info(i)
        assert total == torch.neuron.get_device_properties(i).total_memory
        assert 0 <= free <= total
    free0, _ = torch.accelerator.get_memory_info(0)
    x = torch.empty(16 * MIB, dtype=torch.uint8, device="neuron:0")
    assert torch.accelerator.get_memory_info(0)[0] <= free0 - 16 * MIB
    del x


def check_Graph():
    # Graph capture is not implemented for neuron (no at::GraphImplInterface is registered): creating one
    # raises PyTorch's error, as it does on any accelerator without graphs. See docs/runtime.md.
    with pytest.raises(RuntimeError):
        torch.accelerator.Graph()


CHECKS = {name[len("check_"):]: fn for name, fn in globals().items() if name.startswith("check_")}


def test_every_function_is_checked():
    missing = sorted(set(torch.accelerator.__all__) - set(CHECKS))
    assert not missing, f"torch.accelerator functions without a neuron check here: {missing}"


@pytest.mark.parametrize("name", sorted(torch.accelerator.__all__))
def test_function(name):
    if name not in CHECKS:
        pytest.fail(f"torch.accelerator.{name} has no neuron check")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # ComplexHalf's "experimental" warning
        CHECKS[name]()


def test_privateuse1_hooks():
    """The at::PrivateUse1HooksInterface calls PyTorch makes, through the Python that reaches them."""
    import torchneuron

    # getNewGenerator: a neuron generator draws the stream the default one draws under the same seed.
    g = torch.Generator(device="neuron")
    assert g.device == torch.device("neuron", 0)
    g.manual_seed(5)
    torch.neuron.manual_seed(5)
    torch.testing.assert_close(torch.rand(8, device="neuron", generator=g).cpu(),
                               torch.rand(8, device="neuron").cpu())
    # getPinnedMemoryAllocator / isPinnedPtr, as on CUDA.
    pinned = torch.arange(6.0).pin_memory()
    assert pinned.is_pinned() and not torch.arange(6.0).is_pinned()
    # hasPrimaryContext: a device this process used.
    torch.ones(1, device="neuron:0")
    assert torchneuron._C._device_used(0)
    # resizePrivateUse1Bytes: a storage grows on its device and keeps its bytes.
    x = torch.arange(4, dtype=torch.float32, device="neuron")
    storage = x.untyped_storage()
    storage.resize_(64)
    assert storage.nbytes() == 64 and storage.device == x.device
    torch.testing.assert_close(torch.tensor([], device="neuron").set_(storage, 0, (4,), (1,)).cpu(),
                               torch.arange(4, dtype=torch.float32))
