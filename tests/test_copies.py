"""Copies between the CPU and neuron devices, and between neuron devices."""

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]


def _sample(dtype, shape=(5, 7)):
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=g)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-100 if dtype != torch.uint8 else 0, 100, shape, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_every_dtype(dtype):
    x = _sample(dtype)
    d = x.to("neuron")
    assert d.device == torch.device("neuron:0") and d.dtype == dtype
    back = d.cpu()
    assert back.device.type == "cpu"
    assert torch.equal(back, x)
    assert torch.equal(d.to("cpu"), x) and torch.equal(d.to(torch.device("cpu")), x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_through_device_one(two_devices, dtype):
    x = _sample(dtype)
    d1 = x.to("neuron:1")
    assert d1.device == torch.device("neuron:1")
    d0 = d1.to("neuron:0")
    assert d0.device == torch.device("neuron:0")
    assert torch.equal(d0.cpu(), x)
    assert torch.equal(d0.to("neuron:1").cpu(), x)


def test_copy_in_place_all_directions(two_devices):
    x = torch.randn(6, 4)
    d0 = torch.empty(6, 4, device="neuron:0")
    d1 = torch.empty(6, 4, device="neuron:1")
    d0.copy_(x)                         # host -> device
    d1.copy_(d0)                        # device 0 -> device 1
    d1b = torch.zeros_like(d1)
    d1b.copy_(d1)                       # within device 1
    out = torch.empty(6, 4)
    out.copy_(d1b)                      # device -> host
    assert torch.equal(out, x)
    assert d1b.device == torch.device("neuron:1")
    # copy_ between devices while a third device is current
    with torch.neuron.device(1):
        z = torch.zeros(6, 4, device="neuron:0")
        z.copy_(d1)
        assert z.device.index == 0
    assert torch.equal(z.cpu(), x)


def test_copy_broadcasts():
    d = torch.zeros(3, 4, device="neuron")
    d.copy_(torch.arange(4.0))
    assert torch.equal(d.cpu(), torch.arange(4.0).expand(3, 4))
    h = torch.zeros(3, 4)
    h.copy_(torch.arange(3.0, device="neuron").unsqueeze(1))
    assert torch.equal(h, torch.arange(3.0).unsqueeze(1).expand(3, 4))


@pytest.mark.parametrize("src_dtype,dst_dtype", [
    (torch.float32, torch.float16), (torch.float32, torch.bfloat16), (torch.float64, torch.float32),
    (torch.float32, torch.int64), (torch.int64, torch.float32), (torch.int32, torch.bool),
    (torch.bool, torch.float32), (torch.float32, torch.complex64), (torch.uint8, torch.int8),
])
@pytest.mark.parametrize("direction", ["h2d", "d2h", "d2d", "d0d1"])
def test_dtype_converting_copies(src_dtype, dst_dtype, direction, two_devices):
    x = (torch.randn(4, 6) * 50).to(src_dtype)
    expected = x.to(dst_dtype)
    src_dev, dst_dev = {"h2d": ("cpu", "neuron"), "d2h": ("neuron", "cpu"), "d2d": ("neuron", "neuron"),
                        "d0d1": ("neuron:0", "neuron:1")}[direction]
    src = x.to(src_dev)
    out = src.to(dst_dev, dst_dtype)
    assert out.dtype == dst_dtype and out.device.type == torch.device(dst_dev).type
    torch.testing.assert_close(out.cpu(), expected, rtol=0, atol=0)
    dst = torch.empty(4, 6, dtype=dst_dtype, device=dst_dev)
    dst.copy_(src)
    torch.testing.assert_close(dst.cpu(), expected, rtol=0, atol=0)


def _views(t):
    """Non-contiguous views of a (6, 8) tensor."""
    return {
        "transposed": t.t(),
        "sliced": t[1:5, 2:7],
        "strided": t[::2, ::3],
        "column": t[:, 3],
        "expanded": t[0:1].expand(4, 8),
        "permuted": t.view(2, 3, 8).permute(2, 0, 1),
        "negative-offset-row": t[-1],
        "diagonal": t.diagonal(),
    }


@pytest.mark.parametrize("view", list(_views(torch.empty(6, 8))), ids=str)
def test_non_contiguous_sources(view, two_devices):
    host = torch.arange(48.0).reshape(6, 8)
    dev = host.to("neuron")
    expected = _views(host)[view]
    # host view -> device
    d = _views(host)[view].to("neuron")
    assert torch.equal(d.cpu(), expected)
    # device view -> host, and -> the other device
    assert torch.equal(_views(dev)[view].cpu(), expected)
    assert torch.equal(_views(dev)[view].to("neuron:1").cpu(), expected)
    # device view -> contiguous device tensor via copy_
    c = torch.empty(expected.shape, device="neuron")
    c.copy_(_views(dev)[view])
    assert torch.equal(c.cpu(), expected)


@pytest.mark.parametrize("view", ["transposed", "sliced", "strided", "column", "permuted",
                                  "negative-offset-row", "diagonal"])
@pytest.mark.parametrize("src", ["cpu", "neuron:0", "neuron:1"])
def test_non_contiguous_destinations(view, src, two_devices):
    base_host = torch.zeros(6, 8)
    base_dev = torch.zeros(6, 8, device="neuron")
    shape = _views(base_host)[view].shape
    values = torch.arange(1.0, 1.0 + torch.Size(shape).numel()).reshape(shape)
    _views(base_host)[view].copy_(values)
    _views(base_dev)[view].copy_(values.to(src))
    # Only the viewed elements change, in the device tensor as on the host.
    assert torch.equal(base_dev.cpu(), base_host)
    # A device view into a host view.
    host_dst = torch.zeros(6, 8)
    _views(host_dst)[view].copy_(_views(base_dev)[view])
    assert torch.equal(host_dst, base_host)


def test_copy_of_conjugate_and_negative_views():
    z = torch.complex(torch.randn(5), torch.randn(5))
    d = z.to("neuron")
    assert torch.equal(d.conj().cpu(), z.conj())
    assert torch.equal(d.conj().resolve_conj().cpu(), z.conj().resolve_conj())
    assert torch.equal(z.conj().to("neuron").cpu(), z.conj())
    out = torch.empty(5, dtype=torch.complex64, device="neuron")
    out.copy_(z.conj())
    assert torch.equal(out.cpu(), z.conj())
    assert torch.equal(d.conj().imag.cpu(), z.conj().imag)   # a negative view
    assert torch.equal(torch._neg_view(d).cpu(), -z)


def test_to_without_change_returns_self_and_copy_true_copies():
    d = torch.ones(3, device="neuron")
    assert d.to("neuron") is d
    assert d.to("neuron:0", torch.float32) is d
    c = d.to("neuron", copy=True)
    assert c is not d and c.data_ptr() != d.data_ptr()
    c.add_(1)
    assert torch.equal(d.cpu(), torch.ones(3))


def test_empty_and_scalar_copies(two_devices):
    e = torch.empty(0, 3).to("neuron")
    assert e.shape == (0, 3) and e.cpu().shape == (0, 3)
    assert e.to("neuron:1").shape == (0, 3)
    s = torch.tensor(3.5).to("neuron")
    assert s.dim() == 0 and s.item() == 3.5
    assert s.to("neuron:1").cpu().item() == 3.5


def test_large_copy():
    x = torch.randn(1 << 22)  # 16 MiB
    assert torch.equal(x.to("neuron").to("neuron:1").cpu(), x)


# ---- pinned memory and non_blocking ---------------------------------------------------------

def test_pin_memory_and_is_pinned():
    x = torch.randn(16, 16)
    assert not x.is_pinned()
    p = x.pin_memory()
    assert p.is_pinned() and torch.equal(p, x)
    assert p.pin_memory() is p                       # already pinned: no copy
    assert p[2:].is_pinned() and p.t().is_pinned()   # views of pinned memory are pinned
    assert torch.empty(8, pin_memory=True).is_pinned()
    assert not torch.ones(8, device="neuron").is_pinned()


def test_non_blocking_copies_with_pinned_memory(two_devices):
    x = torch.randn(1000).pin_memory()
    d = x.to("neuron", non_blocking=True)
    d1 = x.to("neuron:1", non_blocking=True)
    back = torch.empty(1000).pin_memory()
    back.copy_(d, non_blocking=True)
    torch.neuron.synchronize()
    torch.neuron.synchronize(1)
    assert torch.equal(back, x)
    assert torch.equal(d1.cpu(), x)
    # non_blocking device -> host gives a pinned tensor, as on CUDA
    h = d.to("cpu", non_blocking=True)
    torch.neuron.current_stream().synchronize()
    assert h.is_pinned()
    assert torch.equal(h, x)


def test_non_blocking_copy_on_a_side_stream():
    s = torch.neuron.Stream()
    x = torch.arange(100.0).pin_memory()
    with torch.neuron.stream(s):
        d = x.to("neuron", non_blocking=True)
        y = d * 2
    s.synchronize()
    assert torch.equal(y.cpu(), torch.arange(100.0) * 2)


def test_dataloader_pin_memory():
    ds = TensorDataset(torch.arange(40.0).reshape(20, 2), torch.arange(20))
    seen = []
    for x, y in DataLoader(ds, batch_size=6, pin_memory=True):
        assert x.is_pinned() and y.is_pinned()
        xd, yd = x.to("neuron", non_blocking=True), y.to("neuron", non_blocking=True)
        seen.append((xd * 2).cpu()[:, 0] + yd.cpu())
    torch.testing.assert_close(torch.cat(seen), torch.arange(20) * 4.0 + torch.arange(20))


def test_dataloader_pin_memory_with_worker():
    ds = TensorDataset(torch.arange(12.0).reshape(6, 2))
    batches = list(DataLoader(ds, batch_size=3, pin_memory=True, num_workers=1))
    assert all(b.is_pinned() for (b,) in batches)
    assert torch.equal(torch.cat([b.to("neuron") for (b,) in batches]).cpu(), torch.arange(12.0).reshape(6, 2))


# ---- numpy, transfer statistics ---------------------------------------------------------------

def test_numpy_on_neuron_tensor_raises_type_error_like_cuda():
    d = torch.ones(3, device="neuron")
    with pytest.raises(TypeError, match=r"can't convert neuron:0 device type tensor to numpy.*\.cpu\(\)"):
        d.numpy()
    with pytest.raises(TypeError):
        d.numpy(force=False)
    assert d.cpu().numpy().tolist() == [1.0, 1.0, 1.0]
    assert d.numpy(force=True).tolist() == [1.0, 1.0, 1.0]  # force=True copies, as on CUDA
    import numpy as np
    with pytest.raises(TypeError):
        np.asarray(d)


def test_from_numpy_to_neuron():
    import numpy as np
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    d = torch.from_numpy(a).to("neuron")
    assert torch.equal(d.cpu(), torch.arange(6.0).reshape(2, 3))
    d2 = torch.as_tensor(a, device="neuron")
    assert d2.device.type == "neuron" and torch.equal(d2.cpu(), d.cpu())
    assert torch.tensor([1, 2], device="neuron").tolist() == [1, 2]


def test_transfer_stats_count_copies(two_devices):
    torch.neuron.reset_transfer_stats()
    s0 = torch.neuron.transfer_stats()
    assert set(s0) == {"host_to_device_bytes", "device_to_host_bytes", "device_to_device_bytes",
                       "host_to_device_copies", "device_to_host_copies", "scalar_reads"}
    assert all(v == 0 for v in s0.values())
    x = torch.zeros(256, dtype=torch.float32)      # 1 KiB
    d = x.to("neuron")
    s1 = torch.neuron.transfer_stats()
    assert s1["host_to_device_bytes"] >= 1024 and s1["host_to_device_copies"] >= 1
    d.cpu()
    s2 = torch.neuron.transfer_stats()
    assert s2["device_to_host_bytes"] >= s1["device_to_host_bytes"] + 1024
    assert s2["device_to_host_copies"] == s1["device_to_host_copies"] + 1
    d.to("neuron:1")
    s3 = torch.neuron.transfer_stats()
    assert s3["device_to_device_bytes"] >= s2["device_to_device_bytes"] + 1024
    d.sum().item()
    s4 = torch.neuron.transfer_stats()
    assert s4["scalar_reads"] >= s3["scalar_reads"] + 1
    torch.neuron.reset_transfer_stats()
    assert all(v == 0 for v in torch.neuron.transfer_stats().values())
