"""Sparse tensors on the device: COO and compressed (CSR) tensors whose indices and values are
device memory, and the common sparse ops, compared with the CPU's results."""

import io
import warnings

import pytest
import torch
import torch.nn as nn
from torch.testing import assert_close

# PyTorch warns once that compressed layouts are beta, and about its invariant checks.
pytestmark = pytest.mark.filterwarnings("ignore:Sparse")


def _dense(seed=0, shape=(4, 5)):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(shape, generator=g)
    return a * (torch.rand(shape, generator=g) < 0.4)


def _coo(seed=0, shape=(4, 5)):
    return _dense(seed, shape).to_sparse()


def _uncoalesced():
    indices = torch.tensor([[0, 2, 0, 1], [1, 3, 1, 0]])
    return torch.sparse_coo_tensor(indices, torch.tensor([1.0, 2.0, 3.0, 4.0]), (3, 4))


def _on_neuron(t):
    return t.device.type == "neuron"


# ---- moving to the device and back ---------------------------------------------------------------

def test_coo_round_trip_keeps_indices_and_values_in_device_memory():
    cpu = _coo()
    x = cpu.to("neuron")
    assert x.is_sparse and x.layout == torch.sparse_coo and _on_neuron(x)
    assert _on_neuron(x._indices()) and _on_neuron(x._values())
    assert x.sparse_dim() == 2 and x.dense_dim() == 0 and x._nnz() == cpu._nnz()
    assert x.is_coalesced() == cpu.is_coalesced()
    assert_close(x._indices().cpu(), cpu._indices())
    assert_close(x._values().cpu(), cpu._values())
    back = x.to("cpu")
    assert back.is_sparse and back.device.type == "cpu"
    assert_close(back, cpu)
    assert_close(x.cpu().to_dense(), cpu.to_dense())


def test_coo_with_dense_dimensions_and_uncoalesced_tensors():
    hybrid = _dense(1, (4, 3, 2)).to_sparse(2)
    x = hybrid.to("neuron")
    assert x.sparse_dim() == 2 and x.dense_dim() == 1
    assert_close(x.to_dense().cpu(), hybrid.to_dense())
    u = _uncoalesced()
    y = u.to("neuron")
    assert not y.is_coalesced()
    assert_close(y.cpu()._indices(), u._indices())
    with pytest.raises(RuntimeError, match="coalesce"):
        y.indices()


def test_csr_round_trip():
    cpu = _dense(2).to_sparse_csr()
    x = cpu.to("neuron")
    assert x.layout == torch.sparse_csr and _on_neuron(x)
    assert _on_neuron(x.crow_indices()) and _on_neuron(x.col_indices()) and _on_neuron(x.values())
    assert_close(x.crow_indices().cpu(), cpu.crow_indices())
    assert_close(x.col_indices().cpu(), cpu.col_indices())
    assert_close(x.values().cpu(), cpu.values())
    back = x.to("cpu")
    assert back.layout == torch.sparse_csr and back.device.type == "cpu"
    assert_close(back.to_dense(), cpu.to_dense())


def test_constructors_on_the_device():
    i, v = torch.tensor([[0, 1, 1], [2, 0, 2]]), torch.tensor([3.0, 4.0, 5.0])
    x = torch.sparse_coo_tensor(i, v, (2, 3), device="neuron")
    assert _on_neuron(x) and _on_neuron(x._values())
    assert_close(x.to_dense().cpu(), torch.sparse_coo_tensor(i, v, (2, 3)).to_dense())
    y = torch.sparse_coo_tensor(i.to("neuron"), v.to("neuron"), (2, 3), is_coalesced=True)
    assert _on_neuron(y) and y.is_coalesced()
    z = torch.zeros(2, 3, layout=torch.sparse_coo, device="neuron")
    assert _on_neuron(z) and z._nnz() == 0
    c = torch.sparse_csr_tensor(torch.tensor([0, 1, 3]), torch.tensor([1, 0, 2]), v, (2, 3), device="neuron")
    assert _on_neuron(c) and _on_neuron(c.values())
    assert_close(c.to_dense().cpu(), torch.tensor([[0.0, 3.0, 0.0], [4.0, 0.0, 5.0]]))


def test_second_device(two_devices):
    _, d1 = two_devices
    x = _coo().to(d1)
    assert x.device == d1 and x._values().device == d1 and x._indices().device == d1
    y = x.coalesce() * 2
    assert y.device == d1 and y._values().device == d1
    assert_close(y.to_dense().cpu(), _coo().to_dense() * 2)


# ---- conversions and ops -------------------------------------------------------------------------

def test_coalesce_to_dense_to_sparse():
    u = _uncoalesced()
    c = u.to("neuron").coalesce()
    assert c.is_coalesced() and _on_neuron(c._values())
    assert_close(c.cpu(), u.coalesce())
    a = _dense(3)
    s = a.to("neuron").to_sparse()
    assert s.is_sparse and _on_neuron(s) and _on_neuron(s._indices())
    assert_close(s.cpu(), a.to_sparse())
    csr = a.to("neuron").to_sparse_csr()
    assert csr.layout == torch.sparse_csr and _on_neuron(csr.values())
    assert_close(csr.to_dense().cpu(), a)
    assert_close(s.to_sparse_csr().to_dense().cpu(), a)


@pytest.mark.parametrize("name, fn", [
    ("sparse.mm", lambda s, d: torch.sparse.mm(s, d)),
    ("mm", lambda s, d: torch.mm(s, d)),
    ("matmul", lambda s, d: s @ d),
    ("addmm", lambda s, d: torch.addmm(torch.ones(4, 3, device=d.device), s, d, beta=0.5, alpha=2.0)),
    ("sparse.addmm", lambda s, d: torch.sparse.addmm(torch.ones(4, 3, device=d.device), s, d)),
    ("dense+sparse", lambda s, d: torch.ones(4, 5, device=d.device) + s),
    ("sparse+sparse", lambda s, d: (s + s).to_dense()),
    ("mul-scalar", lambda s, d: (s * 2.5).to_dense()),
    ("mul-sparse", lambda s, d: (s * s).to_dense()),
    ("sum", lambda s, d: s.sum()),
    ("sparse.sum", lambda s, d: torch.sparse.sum(s)),
    ("sparse.sum-dim", lambda s, d: torch.sparse.sum(s, dim=1).to_dense()),
    ("neg", lambda s, d: (-s).to_dense()),
    ("abs", lambda s, d: s.abs().to_dense()),
    ("transpose", lambda s, d: s.t().coalesce().to_dense()),
    ("softmax", lambda s, d: torch.sparse.softmax(s, 1).to_dense()),
    ("index_select", lambda s, d: s.index_select(0, torch.tensor([0, 2], device=d.device)).to_dense()),
    ("csr@dense", lambda s, d: s.to_sparse_csr() @ d),
    ("csr+csr", lambda s, d: (s.to_sparse_csr() + s.to_sparse_csr()).to_dense()),
    ("csr*scalar", lambda s, d: (s.to_sparse_csr() * 3).to_dense()),
])
def test_ops_equal_the_cpu(name, fn):
    s = _coo()
    d = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))
    expected = fn(s, d)
    got = fn(s.to("neuron"), d.to("neuron"))
    assert _on_neuron(got)
    assert_close(got.cpu(), expected)


def test_in_place_ops_and_copy():
    s = _coo()
    x = s.to("neuron")
    x.mul_(3)
    assert _on_neuron(x._values())
    assert_close(x.cpu(), s * 3)
    x.add_(s.to("neuron"))
    assert_close(x.to_dense().cpu(), (s * 4).to_dense())
    x.zero_()
    assert x._nnz() == 0 and _on_neuron(x._values())
    y = torch.zeros(4, 5).to_sparse().to("neuron")
    y.copy_(s)  # CPU into neuron
    assert _on_neuron(y._values())
    assert_close(y.cpu(), s)
    z = torch.zeros(4, 5).to_sparse()
    z.copy_(s.to("neuron"))  # neuron into CPU
    assert z.device.type == "cpu"
    assert_close(z, s)
    clone = s.to("neuron").clone()
    assert_close(clone.cpu(), s)


def test_backward_through_sparse_mm():
    s_cpu = _coo().coalesce().requires_grad_()
    d_cpu = torch.randn(5, 3, generator=torch.Generator().manual_seed(2)).requires_grad_()
    s = s_cpu.detach().to("neuron").requires_grad_()
    d = d_cpu.detach().to("neuron").requires_grad_()
    torch.sparse.mm(s_cpu, d_cpu).square().sum().backward()
    torch.sparse.mm(s, d).square().sum().backward()
    assert _on_neuron(d.grad) and _on_neuron(s.grad) and s.grad.is_sparse
    assert_close(d.grad.cpu(), d_cpu.grad)
    assert_close(s.grad.to_dense().cpu(), s_cpu.grad.to_dense())


def test_sparse_embedding_gradient():
    torch.manual_seed(0)
    cpu = nn.Embedding(10, 4, sparse=True)
    dev = nn.Embedding(10, 4, sparse=True)
    dev.load_state_dict(cpu.state_dict())
    dev.to("neuron")
    idx = torch.tensor([1, 3, 3, 7])
    cpu(idx).sum().backward()
    dev(idx.to("neuron")).sum().backward()
    assert dev.weight.grad.is_sparse and _on_neuron(dev.weight.grad._values())
    assert_close(dev.weight.grad.to_dense().cpu(), cpu.weight.grad.to_dense())
    opt = torch.optim.SGD(dev.parameters(), lr=0.1)
    opt.step()
    torch.optim.SGD(cpu.parameters(), lr=0.1).step()
    assert_close(dev.weight.cpu(), cpu.weight)


# ---- modules, serialization, memory ---------------------------------------------------------------

class _WithSparseBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.register_buffer("mask", _coo())

    def forward(self, x):
        return self.lin(torch.sparse.mm(self.mask, x.t()).t())


def test_module_with_a_sparse_buffer_moves_to_neuron():
    torch.manual_seed(0)
    cpu = _WithSparseBuffer()
    dev = _WithSparseBuffer()
    dev.load_state_dict(cpu.state_dict())
    dev.to("neuron")
    assert dev.mask.is_sparse and _on_neuron(dev.mask) and _on_neuron(dev.mask._values())
    x = torch.randn(2, 5)
    assert_close(dev(x.to("neuron")).cpu(), cpu(x))
    dev.to("cpu")
    assert dev.mask.device.type == "cpu" and dev.mask.is_sparse


def test_save_and_load():
    s = _coo()
    x = s.to("neuron")
    buf = io.BytesIO()
    torch.save({"coo": x, "csr": x.to_sparse_csr()}, buf)
    buf.seek(0)
    loaded = torch.load(buf, map_location="cpu")
    assert loaded["coo"].device.type == "cpu" and loaded["coo"].is_sparse
    assert_close(loaded["coo"], s)
    assert_close(loaded["csr"].to_dense(), s.to_dense())
    buf.seek(0)
    on_device = torch.load(buf)
    assert _on_neuron(on_device["coo"]) and _on_neuron(on_device["coo"]._values())
    assert_close(on_device["coo"].cpu(), s)
    assert on_device["csr"].layout == torch.sparse_csr and _on_neuron(on_device["csr"].values())


def test_device_memory_is_accounted():
    torch.neuron.synchronize()
    before = torch.neuron.memory_allocated()
    s = torch.randn(300, 300).to_sparse()  # 90,000 values (8 B each with float32 and 2x int64 indices)
    x = s.to("neuron")
    grown = torch.neuron.memory_allocated() - before
    assert grown >= s._values().nbytes + s._indices().nbytes
    del x
    assert torch.neuron.memory_allocated() - before < grown


# ---- errors --------------------------------------------------------------------------------------

def test_op_without_a_cpu_sparse_kernel_says_so():
    x = _coo().to("neuron")
    with pytest.raises(NotImplementedError, match=r"aten::cumsum.*sparse_coo.*neuron.*to_dense"):
        torch.cumsum(x, 0)
    with pytest.raises(NotImplementedError, match=r"neuron"):
        torch.linalg.det(_coo(shape=(3, 3)).to("neuron"))


def test_mixing_devices_raises_pytorchs_error(two_devices):
    x = _coo().to("neuron")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*neuron:0 and cpu"):
        x + _coo()
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.sparse.mm(x, torch.randn(5, 2))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*neuron:0 and neuron:1"):
        x + _coo().to("neuron:1")
    with pytest.raises(RuntimeError, match="copy_\\(\\) between tensors of layouts"):
        x.copy_(torch.zeros(4, 5, device="neuron"))


def test_no_warnings_on_the_common_path():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        x = _coo().to("neuron")
        (torch.sparse.mm(x, torch.ones(5, 2, device="neuron")) + 1).cpu()
