"""NKI's tensor views (nl.NkiTensor's methods: ap, view, permute, ...), nl's dtypes on the host (NumPy takes
them), nisa.constants, nc_matmul's double_row mode, tiles returned from a kernel, and kernels pytest does
not collect: kernels written as AWS's API reference writes them, run on the neuron device and compared with
the same computation by NumPy / PyTorch on the CPU."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from torch.testing import assert_close

import torchneuron  # noqa: F401
import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


def _arange(*shape, dtype=np.float32):
    return np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)


def _view_kernel(make_view, out_shape):
    """A kernel loading ``a`` into SBUF, copying ``make_view(tile)`` into a tile of ``out_shape`` and storing it."""
    @nki.jit(mode="simulation")
    def k(a):
        out = nl.ndarray(out_shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        v = nl.ndarray(out_shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=v, src=make_view(t))
        nl.store(out, v)
        return out
    return k


# ---- views of tiles: each the same PyTorch view of the same data ------------------------------------------

VIEWS = [
    ("permute", lambda t: t.reshape_dim(1, (4, 8)).permute((0, 2, 1)), lambda x: x.reshape(128, 4, 8).permute(0, 2, 1)),
    ("broadcast", lambda t: t.slice(1, 3, 4).broadcast(1, 6), lambda x: x[:, 3:4].expand(128, 6)),
    ("expand_squeeze", lambda t: t.expand_dim(1).squeeze_dim(1), lambda x: x),
    ("reshape_dim", lambda t: t.reshape_dim(1, (4, -1)), lambda x: x.reshape(128, 4, 8)),
    ("flatten_dims", lambda t: t.reshape_dim(1, (2, 4, 4)).flatten_dims(1, 2), lambda x: x.reshape(128, 8, 4)),
    ("slice_step", lambda t: t.slice(1, 1, 31, 3), lambda x: x[:, 1:31:3]),
    ("select", lambda t: t.reshape_dim(1, (4, 8)).select(1, 2), lambda x: x.reshape(128, 4, 8)[:, 2]),
    ("select_partition", lambda t: t.select(0, 5), lambda x: x[5:6]),
    ("rearrange", lambda t: t.rearrange(("b", ("h", "w")), ("b", "w", "h"), {"h": 4}),
     lambda x: x.reshape(128, 4, 8).permute(0, 2, 1)),
    ("ap", lambda t: t.ap([[32, 128], [2, 16]]), lambda x: x[:, ::2]),
    ("ap_offset", lambda t: t[:, 4:].ap([[32, 64], [1, 8]], offset=2), lambda x: x[:64, 6:14]),
    ("ap_transpose_blocks", lambda t: t.ap([[32, 128], [1, 4], [4, 8]]), lambda x: x.reshape(128, 8, 4).permute(0, 2, 1)),
]


@pytest.mark.parametrize("name,make,ref", VIEWS, ids=[v[0] for v in VIEWS])
def test_tile_views_match_torch_views(name, make, ref):
    x = _arange(128, 32)
    expected = ref(torch.from_numpy(x))
    out = _view_kernel(make, tuple(expected.shape))(x)
    assert_close(torch.from_numpy(out), expected, rtol=0, atol=0)


def test_writes_through_a_view_reach_the_tile():
    @nki.jit(mode="simulation")
    def k(a):
        out = nl.ndarray((128, 32), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        half = t.reshape_dim(1, (4, 8)).permute((0, 2, 1)).slice(2, 0, 2)   # [128, 8, 2]: columns 0..15, strided
        nisa.memset(dst=half, value=-1.0)
        nl.store(out, t)
        return out

    x = _arange(128, 32)
    expected = torch.from_numpy(x.copy()).reshape(128, 4, 8)
    expected[:, 0:2, :] = -1.0
    assert_close(torch.from_numpy(k(x)), expected.reshape(128, 32), rtol=0, atol=0)


def test_get_pattern_strides_offset_and_contiguity():
    seen = {}

    @nki.jit(mode="simulation")
    def k(a):
        t = nl.ndarray((128, 32), dtype=nl.float32, buffer=nl.sbuf)
        seen["tile"] = (t.get_pattern(), t.strides, t.offset, t.is_contiguous(), t.ndim, t.size)
        v = t[:, 4:12].reshape_dim(1, (2, 4)).permute((0, 2, 1))
        seen["view"] = (v.get_pattern(), v.offset, v.is_contiguous(), v.is_indirect())
        h = a.permute((1, 0))
        seen["hbm"] = (h.get_pattern(), h.is_contiguous(), a.is_contiguous())
        out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.zeros((1, 1), dtype=nl.float32))
        return out

    k(np.zeros((4, 6), np.float32))
    assert seen["tile"] == ([[32, 128], [1, 32]], (32, 1), 0, True, 2, 128 * 32)
    assert seen["view"] == ([[32, 128], [1, 4], [4, 2]], 4, False, False)
    assert seen["hbm"] == ([[1, 6], [6, 4]], False, True)


def test_ap_scalar_and_vector_offsets_are_read_at_run_time():
    @nki.jit(mode="simulation")
    def k(a, s, v):
        out1 = nl.ndarray((128, 4), dtype=a.dtype, buffer=nl.shared_hbm)
        out2 = nl.ndarray((128, 4), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        si, vi = nl.load(s), nl.load(v)
        x = nl.ndarray((128, 4), dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=x, src=t.ap([[32, 128], [1, 4]], scalar_offset=si, indirect_dim=1))
        nl.store(out1, x)
        y = nl.ndarray((128, 4), dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=y, src=t.ap([[32, 128], [1, 4]], vector_offset=vi, indirect_dim=1))
        nl.store(out2, y)
        return out1, out2

    x = _arange(128, 32)
    rows = np.random.default_rng(0).integers(0, 28, size=(128, 1)).astype(np.int32)
    o1, o2 = k(x, np.array([[7]], np.int32), rows)
    assert_close(torch.from_numpy(o1), torch.from_numpy(x[:, 7:11]), rtol=0, atol=0)
    expected = np.stack([x[p, rows[p, 0]:rows[p, 0] + 4] for p in range(128)])
    assert_close(torch.from_numpy(o2), torch.from_numpy(expected), rtol=0, atol=0)


def test_ap_outside_the_tile_and_bad_views_raise():
    @nki.jit(mode="simulation")
    def outside(a):
        t = nl.load(a)
        t.ap([[32, 128], [1, 40]])

    @nki.jit(mode="simulation")
    def partition(a):
        nl.load(a).permute((1, 0))

    x = _arange(128, 32)
    with pytest.raises(IndexError, match="outside"):
        outside(x)
    with pytest.raises(ValueError, match="partition"):
        partition(x)


# ---- another dtype over the same bytes --------------------------------------------------------------------

def test_tile_view_as_other_dtypes_matches_numpy_view():
    @nki.jit(mode="simulation")
    def k(a):
        t = nl.load(a)
        as_int = nl.ndarray((128, 16), dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=as_int, src=t.view(nl.int32))
        as_bytes = nl.ndarray((128, 64), dtype=nl.uint8, buffer=nl.sbuf)
        nisa.tensor_copy(dst=as_bytes, src=t.view(nl.uint8))
        o1 = nl.ndarray((128, 16), dtype=nl.int32, buffer=nl.shared_hbm)
        o2 = nl.ndarray((128, 64), dtype=nl.uint8, buffer=nl.shared_hbm)
        nl.store(o1, as_int)
        nl.store(o2, as_bytes)
        return o1, o2

    x = np.random.default_rng(1).standard_normal((128, 16)).astype(np.float32)
    o1, o2 = k(x)
    np.testing.assert_array_equal(o1, x.view(np.int32))
    np.testing.assert_array_equal(o2, x.view(np.uint8))


def test_writes_through_a_dtype_view_count_as_written():
    @nki.jit(mode="simulation")
    def k(a):
        t = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)     # never written as float32
        nisa.tensor_copy(dst=t.view(nl.int32), src=nl.load(a))          # the bits, written as int32
        out = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, t)
        return out

    bits = np.random.default_rng(2).standard_normal((128, 8)).astype(np.float32).view(np.int32)
    np.testing.assert_array_equal(k(bits), bits.view(np.float32))

    @nki.jit(mode="simulation")
    def half(a):
        t = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=t.view(nl.int16)[:, 0:8], src=nl.load(a))  # the first 4 floats' bytes only
        out = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, t)
        return out

    with pytest.raises(RuntimeError, match="never written"):
        half(np.zeros((128, 8), np.int16))


def test_hbm_views_read_and_write_the_tensor():
    @nki.jit
    def k(a, b):
        out = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a.permute((1, 0))))                     # a strided read of HBM
        nl.store(b.ap([[2, 64], [1, 1]], offset=1), nl.zeros((64, 1), dtype=nl.int32))  # odd elements of b
        return out, a.view(nl.int32)

    a = torch.randn(128, 64, device="neuron")
    b = torch.arange(128, dtype=torch.int32, device="neuron")
    out, bits = k(a, b)
    assert_close(out.cpu(), a.cpu().t(), rtol=0, atol=0)
    assert torch.equal(bits.cpu(), a.cpu().view(torch.int32))
    expected = torch.arange(128, dtype=torch.int32)
    expected[1::2] = 0
    assert torch.equal(b.cpu(), expected)


def test_nkitensor_and_memoryregion_are_the_tensor_and_buffer_types():
    seen = {}

    @nki.jit(mode="simulation")
    def k(a):
        t = nl.NkiTensor((128, 4), nl.float32, None, buffer=nl.MemoryRegion.sbuf)
        seen["types"] = (isinstance(t, nl.NkiTensor), isinstance(a, nl.NkiTensor), isinstance(a[0:2], nl.NkiTensor),
                         isinstance(t[:, 0:1], nl.NkiTensor), t.buffer is nl.sbuf, isinstance(nl.psum, nl.MemoryRegion))
        out = nl.ndarray((1, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.zeros((1, 4), dtype=nl.float32))
        return out

    k(np.zeros((4, 4), np.float32))
    assert seen["types"] == (True, True, True, True, True, True)
    assert list(nl.MemoryRegion) == [nl.sbuf, nl.psum, nl.private_hbm, nl.shared_hbm]
    cfg = nl.NKIObject(tile=128, name="x")
    assert (cfg.tile, cfg.name) == (128, "x")


# ---- nl's dtypes on the host ------------------------------------------------------------------------------

def test_nl_dtypes_are_torch_dtypes_and_numpy_dtypes():
    assert nl.float32 == torch.float32 and torch.float32 == nl.float32 and nl.float32 != torch.float16
    assert {torch.int32: "i"}[nl.int32] == "i"
    assert nl.float32 == np.float32 and nl.int8 == np.dtype("int8") and nl.float32 == "float32"
    assert isinstance(nl.bfloat16, nl.DType) and nl.bfloat16.is_floating_point and nl.bfloat16.itemsize == 2
    assert nl.float32.torch is torch.float32
    for d, ref in [(nl.float32, np.float32), (nl.float16, np.float16), (nl.int32, np.int32), (nl.uint8, np.uint8),
                   (nl.int16, np.int16), (nl.bool_, np.bool_)]:
        assert np.zeros(3, dtype=d).dtype == np.dtype(ref)
        assert np.arange(3).astype(d).dtype == np.dtype(ref)


def test_nl_dtypes_are_accepted_where_numpy_or_torch_dtypes_are():
    @nki.jit(mode="simulation")
    def k(a):
        out = nl.ndarray(a.shape, dtype=np.float32, buffer=nl.shared_hbm)
        t = nl.load(a, dtype="float32")                      # the newer NKI's dtypes are their names
        nl.store(out, nl.multiply(t, 2.0, dtype=nl.float32))
        return out

    x = _arange(128, 4, dtype=np.int32)
    np.testing.assert_array_equal(k(x), (x * 2).astype(np.float32))


def test_fp8_and_bfloat16_numpy_arrays_round_trip_through_kernels():
    ml_dtypes = pytest.importorskip("ml_dtypes")  # NumPy's bfloat16 and fp8 (AWS's NKI needs it too)

    @nki.jit(mode="simulation")
    def k(a, b, c):
        outs = []
        for x in (a, b, c):
            o = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
            nl.store(o, nl.copy(nl.load(x), dtype=nl.float32))
            outs.append(o)
        same = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(same, nl.load(a))
        return outs[0], outs[1], outs[2], same

    rng = np.random.default_rng(3)
    a = rng.standard_normal((128, 8)).astype(nl.float8_e5m2)
    b = rng.standard_normal((128, 8)).astype(nl.bfloat16)
    c = rng.standard_normal((128, 8)).astype(nl.float8_e4m3)
    assert a.dtype == ml_dtypes.float8_e5m2 and b.dtype == ml_dtypes.bfloat16 and c.dtype == ml_dtypes.float8_e4m3
    fa, fb, fc, same = k(a, b, c)
    for got, x in ((fa, a), (fb, b), (fc, c)):
        np.testing.assert_array_equal(got, x.astype(np.float32))
    assert same.dtype == ml_dtypes.float8_e5m2
    np.testing.assert_array_equal(same.view(np.uint8), a.view(np.uint8))


def test_double_row_matmul_contracts_partitions_and_the_pair_axis():
    pytest.importorskip("ml_dtypes")
    @nki.jit(mode="simulation", platform_target="trn2")
    def k(a, b):
        out = nl.ndarray((a.shape[2], b.shape[2]), dtype=nl.float32, buffer=nl.shared_hbm)
        res = nisa.nc_matmul(nl.load(a.view(nl.float8_e5m2)), nl.load(b), perf_mode="double_row_gen3")
        nl.store(out, res)
        return out

    rng = np.random.default_rng(4)
    a = rng.standard_normal((128, 2, 16)).astype(nl.float8_e5m2)
    b = rng.standard_normal((128, 2, 64)).astype(nl.float8_e4m3)
    expected = np.einsum("kli,klj->ij", a.astype(np.float32), b.astype(np.float32))
    assert_close(torch.from_numpy(k(a, b)), torch.from_numpy(expected), rtol=1e-5, atol=1e-4)

    @nki.jit(mode="simulation", platform_target="trn1")
    def on_trn1(a, b):
        nisa.nc_matmul(nl.load(a), nl.load(b), perf_mode="double_row")

    with pytest.raises(ValueError, match="NeuronCore-v3"):
        on_trn1(a, a)


# ---- a tile returned, nisa.constants, kernels pytest does not collect ------------------------------------------

def test_a_returned_tile_comes_back_as_its_values():
    @nki.jit(mode="simulation")
    def k(a):
        t = nl.exp(nl.load(a))
        return t, nl.load(a)[:, 0:2]

    x = np.random.default_rng(5).standard_normal((128, 8)).astype(np.float32)
    t, part = k(x)
    assert_close(torch.from_numpy(t), torch.exp(torch.from_numpy(x)), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(part, x[:, 0:2])

    @nki.jit(mode="simulation")
    def unwritten(a):
        return nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)

    with pytest.raises(RuntimeError, match="never written"):
        unwritten(x)


def test_isa_constants_and_pytest_collection(tmp_path):
    assert nisa.constants.dge_mode is nisa.dge_mode and nisa.constants.engine.tensor == nisa.engine.tensor
    assert nki.jit(lambda a: a).__test__ is False
    (tmp_path / "test_sample.py").write_text(textwrap.dedent("""
        import numpy as np
        import neuronxcc.nki as nki
        import neuronxcc.nki.language as nl
        from neuronxcc.nki.isa.constants import dge_mode

        @nki.jit(mode="simulation")
        def test_kernel_named_like_a_test(a):
            out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
            nl.store(out, nl.load(a))
            return out

        def test_calls_the_kernel():
            x = np.ones((4, 4), np.float32)
            assert (test_kernel_named_like_a_test(x) == x).all() and dge_mode.swdge == 1
    """))
    p = subprocess.run([sys.executable, "-m", "torchneuron.nki.alias", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(tmp_path / "test_sample.py")], capture_output=True, text=True, timeout=300)
    assert "1 passed" in p.stdout, p.stdout + p.stderr
    assert "error" not in p.stdout.lower(), p.stdout


def test_dynamic_select_and_vector_select_gather_rows():
    @nki.jit(mode="simulation")
    def k(table, i, rows):
        o1 = nl.ndarray((128, 8), dtype=table.dtype, buffer=nl.shared_hbm)
        o2 = nl.ndarray((128, 8), dtype=table.dtype, buffer=nl.shared_hbm)
        o3 = nl.ndarray((128, 1), dtype=table.dtype, buffer=nl.shared_hbm)
        idx, r = nl.load(i), nl.load(rows)
        nl.store(o1, nl.load(table.select(0, idx)))                  # table[i]: (128, 8)
        nl.store(o2, nl.load(table.vector_select(0, r)[:, 2]))       # partition p: table[rows[p], 2, :]
        t = nl.load(table[1])                                         # (128, 8) on chip
        nl.store(o3, nl.copy(t.select(1, idx).expand_dim(1)))       # column i of the tile
        return o1, o2, o3

    table = _arange(4, 128, 8)
    rows = np.random.default_rng(7).integers(0, 4, size=(128, 1)).astype(np.int32)
    o1, o2, o3 = k(table, np.array([[3]], np.int32), rows)
    np.testing.assert_array_equal(o1, table[3])
    np.testing.assert_array_equal(o2, np.stack([table[rows[p, 0], 2] for p in range(128)]))
    np.testing.assert_array_equal(o3, table[1][:, 3:4])
