"""Quantized tensors on the device: per-tensor and per-channel affine tensors whose integers are
device memory, their parameters, views and copies, compared with the CPU's."""

import pytest
import torch
from torch.testing import assert_close

# PyTorch warns that quantized tensor creation is deprecated.
pytestmark = pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")

DTYPES = [torch.quint8, torch.qint8, torch.qint32]


def _x(shape=(4, 6), seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 3


def _channel_params(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, generator=g, dtype=torch.double) * 0.2 + 0.05, torch.randint(0, 10, (n,), generator=g)


def _same(qn, qc):
    """qn (on neuron) equals qc (on the CPU): integers, parameters, values."""
    assert qn.device.type == "neuron" and qn.is_quantized
    assert qn.dtype == qc.dtype and qn.shape == qc.shape and qn.stride() == qc.stride()
    assert qn.qscheme() == qc.qscheme()
    assert torch.equal(qn.int_repr().cpu(), qc.int_repr())
    assert torch.equal(qn.dequantize().cpu(), qc.dequantize())
    if qc.qscheme() == torch.per_tensor_affine:
        assert (qn.q_scale(), qn.q_zero_point()) == (qc.q_scale(), qc.q_zero_point())
    else:
        assert qn.q_per_channel_axis() == qc.q_per_channel_axis()
        assert qn.q_per_channel_scales().device.type == "neuron"
        assert torch.equal(qn.q_per_channel_scales().cpu(), qc.q_per_channel_scales())
        assert torch.equal(qn.q_per_channel_zero_points().cpu(), qc.q_per_channel_zero_points())


@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_per_tensor(dtype):
    x = _x()
    qc = torch.quantize_per_tensor(x, 0.05, 2, dtype)
    qn = torch.quantize_per_tensor(x.to("neuron"), 0.05, 2, dtype)
    _same(qn, qc)
    if dtype == torch.qint32:  # no value clipped: within half a step of x
        assert_close(qn.dequantize().cpu(), x, atol=0.025 + 1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.quint8, torch.qint8])
def test_quantize_per_channel(dtype):
    x = _x()
    for axis in (0, 1):
        s, z = _channel_params(x.shape[axis])
        qc = torch.quantize_per_channel(x, s, z, axis, dtype)
        qn = torch.quantize_per_channel(x.to("neuron"), s.to("neuron"), z.to("neuron"), axis, dtype)
        _same(qn, qc)


def test_integers_live_on_the_device():
    qn = torch.quantize_per_tensor(_x().to("neuron"), 0.1, 0, torch.qint8)
    assert qn.untyped_storage().device.type == "neuron"
    assert qn.int_repr().device.type == "neuron" and qn.int_repr().dtype == torch.int8
    assert qn.dequantize().device.type == "neuron"


def test_empty_quantized_factories():
    e = torch._empty_affine_quantized([2, 3], scale=0.5, zero_point=1, dtype=torch.qint8, device="neuron")
    assert e.device.type == "neuron" and e.dtype == torch.qint8 and e.shape == (2, 3)
    assert (e.q_scale(), e.q_zero_point()) == (0.5, 1)
    s, z = _channel_params(3)
    p = torch._empty_per_channel_affine_quantized([2, 3], scales=s.to("neuron"), zero_points=z.to("neuron"), axis=1,
                                                  dtype=torch.quint8, device="neuron")
    assert p.device.type == "neuron" and p.qscheme() == torch.per_channel_affine
    assert p.q_per_channel_axis() == 1 and torch.equal(p.q_per_channel_scales().cpu(), s)
    # Parameters given on the CPU end up where the tensor is, as on CUDA.
    p = torch._empty_per_channel_affine_quantized([2, 3], scales=s, zero_points=z, axis=1, dtype=torch.quint8,
                                                  device="neuron")
    assert p.q_per_channel_scales().device.type == "neuron"



def _quantized(x, per_channel, axis, dtype):
    """x quantized per tensor (scale 0.05, zero point 3), or per channel along ``axis``."""
    if per_channel:
        s, z = _channel_params(x.shape[axis])
        return torch.quantize_per_channel(x, s, z, axis, dtype)
    return torch.quantize_per_tensor(x, 0.05, 3, dtype)

@pytest.mark.parametrize("per_channel", [False, True])
def test_copies(per_channel):
    qc = _quantized(_x(), per_channel, 1, torch.quint8)
    qn = qc.to("neuron")
    _same(qn, qc)
    back = qn.cpu()
    assert back.device.type == "cpu" and back.is_quantized
    assert torch.equal(back.int_repr(), qc.int_repr()) and torch.equal(back.dequantize(), qc.dequantize())
    if per_channel:
        assert back.q_per_channel_scales().device.type == "cpu"
    c = qn.clone()
    _same(c, qc)
    assert c.data_ptr() != qn.data_ptr()
    _same(qn.to("neuron:1"), qc)
    assert qn.to("neuron:1").device == torch.device("neuron:1")


@pytest.mark.parametrize("per_channel", [False, True])
def test_views(per_channel):
    qc = _quantized(_x((4, 6, 2)), per_channel, 0, torch.qint8)
    qn = qc.to("neuron")
    views = [
        lambda t: t.transpose(1, 2),
        lambda t: t[1:3],
        lambda t: t[:, 1:5:2],
        lambda t: t.permute(2, 0, 1),
        lambda t: t.view(4, 12),
        lambda t: t[1],
    ]
    if not per_channel:  # views across the channel axis are the CPU's errors for per-channel tensors
        views += [lambda t: t.as_strided((2, 3), (12, 2), 1), lambda t: t.view(8, 6), lambda t: t.reshape(-1), lambda t: t.select(1, 2), lambda t: t[2]]
    for f in views:
        try:
            vc = f(qc)
        except RuntimeError as e:  # the CPU refuses this view of a per-channel tensor: so does neuron
            assert per_channel
            with pytest.raises(RuntimeError, match=str(e).splitlines()[0][:40]):
                f(qn)
            continue
        vn = f(qn)
        _same(vn, qc if vc is qc else vc)
        assert vn.untyped_storage().data_ptr() == qn.untyped_storage().data_ptr()  # a view, not a copy
        assert torch.equal(vn.cpu().int_repr(), vc.int_repr())
        assert torch.equal(vn.contiguous().int_repr().cpu(), vc.contiguous().int_repr())


def test_bad_input_gives_pytorchs_errors():
    x = _x()
    s, z = _channel_params(6)
    for device in ("cpu", "neuron"):
        with pytest.raises(RuntimeError, match="Channel axis out of range"):
            torch.quantize_per_channel(x.to(device), s.to(device), z.to(device), 5, torch.quint8)
        with pytest.raises(RuntimeError):
            torch.quantize_per_tensor(x.to(device), 0.1, 0, torch.float32)  # not a quantized dtype
    qc = torch.quantize_per_channel(x, s, z, 1, torch.quint8)
    for q in (qc, qc.to("neuron")):  # as_strided on a per-channel tensor
        with pytest.raises(RuntimeError, match="only on uniformly quantized tensor"):
            q.as_strided((2, 3), (12, 2), 1)
    qn = torch.quantize_per_tensor(x.to("neuron"), 0.1, 0, torch.quint8)
    with pytest.raises(RuntimeError, match="kPerChannelAffine"):
        qn.q_per_channel_scales()  # a per-tensor tensor
    with pytest.raises(RuntimeError):
        torch.quantize_per_tensor(x, 0.1, 0, torch.qint8).to("neuron").copy_(qn)  # another qtype


def test_ravel_and_flatten():
    e = torch._empty_affine_quantized([3, 4, 5], scale=2, zero_point=3, dtype=torch.quint8, device="neuron")
    qc = torch.quantize_per_tensor(_x((3, 4, 5)), 0.1, 3, torch.quint8)
    for qn in (e, qc.to("neuron")):
        flat = qn.ravel()
        assert flat.shape == (60,) and flat._base is qn and flat.is_contiguous() and flat.device.type == "neuron"
        assert flat.is_quantized and flat.q_scale() == qn.q_scale()
        assert qn.flatten(1, 2).shape == (3, 20) and qn.flatten(0, 1).shape == (12, 5)
        with pytest.raises(IndexError, match="Dimension out of range"):
            qn.flatten(5, 10)
        with pytest.raises(RuntimeError, match="start_dim cannot come after end_dim"):
            qn.flatten(2, 0)
    qn = qc.to("neuron")
    assert torch.equal(qn.flatten(0, 1).int_repr().cpu(), qc.flatten(0, 1).int_repr())
    src = qn[:, 1].t()
    nc = src.ravel()  # not contiguous: a copy
    assert nc._base is not src and nc._base is not qn and nc.is_contiguous()
    assert nc.untyped_storage().data_ptr() != qn.untyped_storage().data_ptr()
    assert torch.equal(nc.int_repr().cpu(), qc[:, 1].t().ravel().int_repr())
