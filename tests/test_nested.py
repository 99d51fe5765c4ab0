"""Nested tensors on neuron: PyTorch's nested-tensor kernels run on device memory, as for dense tensors."""

import copy
import warnings

import pytest
import torch
import torch.nn as nn
from torch.testing import assert_close

pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")


def _parts(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, generator=g), torch.randn(4, 3, generator=g)]


def _padded(nt):
    return torch.nested.to_padded_tensor(nt, 0.0)


def test_round_trip_and_ops_match_cpu():
    cpu = torch.nested.nested_tensor(_parts())
    dev = cpu.to("neuron")
    assert dev.is_nested and dev.device == torch.device("neuron", 0)
    out_cpu = torch.nn.functional.linear((cpu + cpu).relu(), torch.ones(5, 3))
    out_dev = torch.nn.functional.linear((dev + dev).relu(), torch.ones(5, 3, device="neuron"))
    assert out_dev.is_nested and out_dev.device.type == "neuron"
    padded = _padded(out_dev)
    assert not padded.is_nested and padded.device.type == "neuron"
    assert_close(padded.cpu(), _padded(out_cpu))
    back = out_dev.cpu()
    assert back.is_nested and back.device.type == "cpu"
    assert_close(_padded(back), _padded(out_cpu))
    for a, b in zip(out_dev.unbind(), out_cpu.unbind()):
        assert a.device.type == "neuron"
        assert_close(a.cpu(), b)


def test_created_on_the_device_and_printed():
    nt = torch.nested.nested_tensor(_parts(1), device="neuron")
    assert nt.device.type == "neuron"
    assert "device='neuron:0'" in repr(nt)
    assert_close(_padded(nt).cpu(), _padded(torch.nested.nested_tensor(_parts(1))))


def test_memory_is_device_memory():
    before = torch.neuron.memory_allocated()
    nt = torch.nested.nested_tensor(_parts(2), device="neuron")
    doubled = nt * 2
    assert torch.neuron.memory_allocated() >= before + 2 * (2 + 4) * 3 * 4
    del nt, doubled


@pytest.mark.parametrize("batch_first", [True, False])
def test_transformer_encoder_fast_path_with_padding_mask(batch_first):
    """nn.TransformerEncoder's inference fast path (nested tensors from the padding mask) runs on neuron."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=batch_first)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        enc = nn.TransformerEncoder(layer, 2).eval()
    x = torch.randn(3, 5, 16) if batch_first else torch.randn(5, 3, 16)
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])
    with torch.no_grad():
        ref = enc(x, src_key_padding_mask=mask)
        out = copy.deepcopy(enc).to("neuron")(x.to("neuron"), src_key_padding_mask=mask.to("neuron"))
    assert out.device.type == "neuron" and not out.is_nested
    assert_close(out.cpu(), ref, atol=1e-5, rtol=1e-4)


def test_two_devices_in_one_nested_op_is_an_error():
    if torch.neuron.device_count() < 2:
        pytest.skip("needs TORCHNEURON_NUM_DEVICES >= 2")
    a = torch.nested.nested_tensor(_parts(), device="neuron:0")
    b = torch.nested.nested_tensor(_parts(), device="neuron:1")
    with pytest.raises(RuntimeError, match="same device"):
        a + b
