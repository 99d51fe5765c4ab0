"""NKI direct allocation (``ncc.sbuf.alloc``/``mod_alloc``, ``ncc.psum.mod_alloc``): tiles placed at
addresses of one memory, where tiles at overlapping addresses share bytes, as on the chip; placements
checked against the memory's size and the ISA's rules. Kernels in the style of AWS's direct allocation
guide, each checked against PyTorch on the CPU."""

import pytest
import torch

import torchneuron  # noqa: F401
import torchneuron.nki as nki
import torchneuron.nki.compiler as ncc
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


@pytest.fixture(autouse=True)
def interpreted(monkeypatch):
    monkeypatch.setenv("TORCHNEURON_NKI_REPLAY", "0")


def test_two_tensors_at_one_address_share_their_bytes():
    @nki.jit
    def overlay(a, b):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        first = nl.ndarray((nl.par_dim(128), 512), dtype=nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=0))
        # second's first 256 elements are first's last 256 (bytes 1024..2048 of each partition)
        second = nl.ndarray((nl.par_dim(128), 512), dtype=nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=1024))
        first[...] = nl.load(a)
        second[:, 256:512] = nl.load(b[:, 256:512])  # bytes past first's end
        nl.store(out, value=second)  # its first half: what `first` wrote there
        return out

    a, b = torch.randn(128, 512), torch.randn(128, 512)
    got = overlay(a.to("neuron"), b.to("neuron")).cpu()
    torch.testing.assert_close(got, torch.cat([a[:, 256:], b[:, 256:]], dim=1))


def test_a_tensor_of_another_dtype_reads_the_same_bytes():
    @nki.jit
    def reinterpret(x):
        out = nl.ndarray((128, 64), dtype=nl.int32, buffer=nl.shared_hbm)
        f = nl.ndarray((nl.par_dim(128), 64), dtype=nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=4096))
        i = nl.ndarray((nl.par_dim(128), 64), dtype=nl.int32, buffer=ncc.sbuf.mod_alloc(base_addr=4096))
        f[...] = nl.load(x)
        nl.store(out, value=i)
        return out

    x = torch.randn(128, 64)
    torch.testing.assert_close(reinterpret(x.to("neuron")).cpu(), x.view(torch.int32))


def test_modulo_allocation_reuses_its_physical_tiles():
    # 4 logical tiles on 2 physical ones (AWS's mod_alloc example): tile i and tile i + 2 share bytes,
    # so after the loop tiles 0 and 1 hold what tiles 2 and 3 were given.
    @nki.jit
    def rotate(x):
        out = nl.ndarray((2, 128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((4, nl.par_dim(128), 512), dtype=nl.float32,
                       buffer=ncc.sbuf.mod_alloc(base_addr=0, num_free_tiles=(2,)))
        for i in nl.sequential_range(4):
            t[i] = nl.load(x[i])
        for i in nl.affine_range(2):
            nl.store(out[i], value=t[i])
        return out

    x = torch.randn(4, 128, 512)
    torch.testing.assert_close(rotate(x.to("neuron")).cpu(), x[2:])


def test_double_buffering_as_the_guide_writes_it():
    @nki.jit
    def exp_blocks(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((4, nl.par_dim(128), 512), dtype=nl.float32,
                       buffer=ncc.sbuf.mod_alloc(base_addr=0, num_free_tiles=(2,)))
        r = nl.ndarray((4, nl.par_dim(128), 512), dtype=nl.float32,
                       buffer=ncc.sbuf.mod_alloc(base_addr=4096, num_free_tiles=(2,)))
        for i in nl.affine_range(4):
            t[i] = nl.load(x[i])
            r[i] = nl.exp(t[i])
            nl.store(out[i], value=r[i])
        return out

    x = torch.randn(4, 128, 512)
    torch.testing.assert_close(exp_blocks(x.to("neuron")).cpu(), torch.exp(x))


def test_a_custom_alloc_function_and_psum_banks():
    def one_after_another(idx, pdim_size, fdim_size):
        (i,) = idx
        return (0, 8192 + i * fdim_size)

    @nki.jit
    def transpose_all(x):  # x: [128, 4 * 128]; the transposes of its four [128, 128] blocks
        out = nl.ndarray((4, 128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        identity = nl.ndarray((nl.par_dim(128), 128), dtype=nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=0))
        identity[...] = nl.load(nl.shared_identity_matrix(128, dtype=nl.float32))
        src = nl.ndarray((nl.par_dim(128), 512), dtype=nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=512))
        src[...] = nl.load(x)
        res = nl.ndarray((4, nl.par_dim(128), 128), dtype=nl.float32, buffer=ncc.sbuf.alloc(one_after_another))
        tp = nl.ndarray((4, nl.par_dim(128), 128), dtype=nl.float32,
                        buffer=ncc.psum.mod_alloc(base_bank=2, num_bank_tiles=(1,)))  # all four in bank 2
        for i in nl.sequential_range(4):
            tp[i] = nisa.nc_matmul(src[:, nl.ds(i * 128, 128)], identity)
            res[i] = nl.copy(tp[i])
        for i in nl.affine_range(4):
            nl.store(out[i], value=res[i])
        return out

    x = torch.randn(128, 512)
    want = torch.stack([x[:, i * 128:(i + 1) * 128].T for i in range(4)])
    torch.testing.assert_close(transpose_all(x.to("neuron")).cpu(), want)


def test_a_store_of_bytes_nobody_wrote_raises():
    @nki.jit
    def half_loaded(x):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((nl.par_dim(128), 512), dtype=nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=0))
        t[:, 0:256] = nl.load(x[:, 0:256])
        nl.store(out, value=t)
        return out

    with pytest.raises(RuntimeError, match="never written"):
        half_loaded(torch.randn(128, 512, device="neuron"))


def test_placements_are_checked():
    def kernel_with(buffer, dtype=nl.float32, shape=(nl.par_dim(128), 512)):
        @nki.jit
        def k(x):
            out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
            t = nl.ndarray(shape, dtype=dtype, buffer=buffer)
            nl.store(out, value=x)
            return out
        return k

    x = torch.zeros(128, 512, device="neuron")
    # trn2's SBUF has 224 KiB per partition: 2 KiB at 223 KiB does not fit
    with pytest.raises(MemoryError, match="SBUF is full"):
        kernel_with(ncc.sbuf.mod_alloc(base_addr=223 * 1024))(x)
    with pytest.raises(ValueError, match="not aligned"):
        kernel_with(ncc.sbuf.mod_alloc(base_addr=2))(x)
    with pytest.raises(ValueError, match="partition"):
        kernel_with(ncc.sbuf.mod_alloc(base_addr=0, base_partition=32))(x)
    with pytest.raises(MemoryError, match="PSUM is full"):
        kernel_with(ncc.psum.mod_alloc(base_bank=8))(x)
    with pytest.raises(ValueError, match="bank"):
        kernel_with(ncc.psum.mod_alloc(base_bank=0), shape=(nl.par_dim(128), 1024))(x)


def test_auto_alloc_is_the_buffer():
    assert ncc.sbuf.auto_alloc() is nl.sbuf and ncc.psum.auto_alloc() is nl.psum
