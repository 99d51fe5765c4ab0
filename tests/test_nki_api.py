"""NKI API names: nki.typing annotations, nl.par_dim, the numpy host harness (simulate_kernel, simulate,
baremetal, benchmark), nl.ds, NumPy dtypes and nl.uint16/uint32. Results are compared with the same
computation by PyTorch on the CPU."""

import numpy as np
import pytest
import torch
from torch.testing import assert_close

import torchneuron  # noqa: F401
import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
import torchneuron.nki.typing as nt


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---- nki.typing ---------------------------------------------------------------------------------

@nki.jit
def scale_rows(x: nt.tensor[[256, 64], nl.float32], s: nt.tensor[[256, 1], np.float32]):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // 128):
        xt = nl.load(x[i * 128:(i + 1) * 128, :])
        st = nl.load(s[i * 128:(i + 1) * 128, :])
        nl.store(out[i * 128:(i + 1) * 128, :], value=nl.multiply(xt, st))
    return out


def test_typing_annotated_kernel_runs_and_matches_torch():
    x, s = _rand(256, 64), _rand(256, 1, seed=1)
    got = nki.simulate_kernel(scale_rows, x, s)
    assert isinstance(got, np.ndarray)
    assert_close(torch.from_numpy(got), torch.from_numpy(x) * torch.from_numpy(s))


def test_typing_annotation_checks_shape_and_dtype():
    x, s = _rand(256, 64), _rand(256, 1)
    with pytest.raises(ValueError, match=r"parameter 'x' is annotated with shape \[256, 64\], got a tensor of shape "
                                         r"\[128, 64\]"):
        nki.simulate_kernel(scale_rows, x[:128], s)
    with pytest.raises(TypeError, match=r"parameter 's' is annotated with dtype torch.float32, got a tensor of "
                                        r"torch.float64"):
        nki.simulate_kernel(scale_rows, x, s.astype(np.float64))
    with pytest.raises(TypeError, match="parameter 'x' is annotated .* a tensor, got float"):
        scale_rows(1.0, torch.from_numpy(s).to("neuron"))


def test_typing_mutable_tensor_output_written_in_place():
    @nki.jit
    def double_into(a: nt.tensor, out: nt.mutable_tensor):
        nl.store(out, value=nl.multiply(nl.load(a), 2.0))
        return out

    a = _rand(128, 32)
    out = np.zeros_like(a)
    ret = nki.simulate_kernel(double_into, a, out)
    assert_close(torch.from_numpy(out), torch.from_numpy(a) * 2)  # the caller's array holds the output
    assert_close(torch.from_numpy(ret), torch.from_numpy(a) * 2)
    assert nt.mutable_params(double_into.fn) == ("out",)


def test_typing_annotation_forms():
    t = nt.tensor[[128, None], nl.bfloat16]
    assert t.shape == (128, None) and t.dtype == torch.bfloat16 and not t.mutable
    assert nt.mutable_tensor[[4]].mutable and nt.mutable(t).mutable and not nt.immutable(nt.mutable(t)).mutable
    assert nt.tensor[np.int32].dtype == torch.int32
    with pytest.raises(TypeError, match="shape's sizes are non-negative ints"):
        nt.tensor[[128, "a"], nl.float32]
    with pytest.raises(TypeError, match="expected an nl dtype"):
        nt.tensor[[128], "float32x"]


# ---- nl.par_dim -----------------------------------------------------------------------------------

def test_par_dim_allocates_the_same_tiles():
    sizes = {}

    def make(shape_fn):
        @nki.jit
        def k(a):
            out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
            t = nl.ndarray(shape_fn(128, 256), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a)
            z = nl.zeros(shape_fn(128, 256), dtype=nl.float32)
            f = nl.full(shape_fn(128, 256), 3.0, dtype=nl.float32)
            nl.store(out, value=nl.add(nl.add(t, z), f))
            return out
        return k

    a = _rand(128, 256)
    for name, fn in (("plain", lambda p, f: (p, f)), ("par_dim", lambda p, f: (nl.par_dim(p), f))):
        k = make(fn)
        got = nki.simulate_kernel(k, a)
        assert_close(torch.from_numpy(got), torch.from_numpy(a) + 3)
        sizes[name] = k.last_estimate.sbuf_peak_bytes_per_partition
    assert sizes["plain"] == sizes["par_dim"] > 0


def test_par_dim_block_axis_is_a_block_of_tiles():
    @nki.jit
    def blocks(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((4, nl.par_dim(128), 64), dtype=nl.float32, buffer=nl.sbuf)
        for i in nl.affine_range(4):
            t[i] = nl.load(a[i * 128:(i + 1) * 128, :])
        for i in nl.affine_range(4):
            nl.store(out[i * 128:(i + 1) * 128, :], value=nl.exp(t[i]))
        return out

    a = _rand(512, 64)
    got = nki.simulate_kernel(blocks, a)
    assert_close(torch.from_numpy(got), torch.exp(torch.from_numpy(a)))
    assert blocks.last_estimate.sbuf_peak_bytes_per_partition >= 4 * 64 * 4


def test_par_dim_errors():
    @nki.jit
    def too_big(a):
        nl.ndarray((2, nl.par_dim(64), 8), dtype=nl.float32)
        return a

    @nki.jit
    def two_marks(a):
        nl.ndarray((nl.par_dim(64), nl.par_dim(8)), dtype=nl.float32)
        return a

    with pytest.raises(ValueError, match=r"nl.par_dim\(256\)"):
        nl.par_dim(256)
    with pytest.raises(TypeError, match="nl.par_dim takes an int"):
        nl.par_dim(1.5)
    with pytest.raises(ValueError, match="marks one partition dimension"):
        nki.simulate_kernel(two_marks, _rand(1, 1))
    nki.simulate_kernel(too_big, _rand(1, 1))  # a block axis before the partition axis is no partition axis


# ---- the host harness ---------------------------------------------------------------------------

def _add_kernel(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.add(nl.load(a), nl.load(b)))
    return out


def test_simulate_and_baremetal_take_and_return_numpy():
    a, b = _rand(128, 512), _rand(128, 512, seed=2)
    expected = torch.from_numpy(a) + torch.from_numpy(b)
    for run in (nki.simulate(_add_kernel), nki.simulate(nki.jit(_add_kernel)), nki.baremetal(_add_kernel),
                nki.baremetal(save_neff_name="file.neff")(_add_kernel)):
        got = run(a, b)
        assert isinstance(got, np.ndarray) and got.dtype == np.float32
        assert_close(torch.from_numpy(got), expected)


def test_harness_rejects_torch_tensors_and_non_kernels():
    with pytest.raises(TypeError, match="argument 0 is a torch.Tensor; this harness takes numpy arrays"):
        nki.simulate_kernel(_add_kernel, torch.zeros(128, 4), np.zeros((128, 4), np.float32))
    with pytest.raises(TypeError, match="takes a kernel"):
        nki.simulate_kernel(42, np.zeros(4))


def test_benchmark_reports_a_labelled_projection():
    a, b = _rand(128, 512), _rand(128, 512, seed=3)
    bench = nki.benchmark(warmup=2, iters=5)(nki.jit(_add_kernel, platform_target="trn1"))
    got = bench(a, b)
    assert_close(torch.from_numpy(got), torch.from_numpy(a) + torch.from_numpy(b))
    res = bench.benchmark_result
    lat = res.nc_latency
    assert lat.projection and lat.target == "trn1" and "PROJECTION" in str(lat)
    est = nki.jit(_add_kernel).estimate(torch.from_numpy(a).to("neuron"), torch.from_numpy(b).to("neuron"),
                                        target="trn1")
    assert lat.get_latency_percentile(50) == pytest.approx(est.seconds * 1e6)
    assert lat.get_latency_percentile(99) == lat.get_latency_percentile(50)
    assert set(res.estimates) == set(nki.TARGETS)
    assert res.estimates["trn2"].seconds != res.estimates["trn1"].seconds  # the model's per-generation rates
    with pytest.raises(ValueError, match="the percentiles are"):
        lat.get_latency_percentile(42)
    with pytest.raises(ValueError, match="iters is a non-negative int"):
        nki.benchmark(iters=-1)


# ---- nl.ds, NumPy dtypes, uint dtypes -------------------------------------------------------------

def test_ds_slices_like_start_colon_start_plus_size():
    @nki.jit
    def window(a):
        out = nl.ndarray((128, 32), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a[nl.ds(128, 128), nl.ds(16, 32)])
        nl.store(out[nl.ds(0, 128), :], value=t)
        return out

    a = _rand(256, 64)
    assert_close(torch.from_numpy(nki.simulate_kernel(window, a)), torch.from_numpy(a)[128:256, 16:48])
    assert nl.ds(3, 4) == slice(3, 7)
    with pytest.raises(ValueError, match="at least one element"):
        nl.ds(0, 0)
    with pytest.raises(TypeError, match="nl.ds: start is an int"):
        nl.ds(0.5, 2)


@pytest.mark.parametrize("np_dtype,torch_dtype", [(np.float32, torch.float32), (np.float16, torch.float16),
                                                  (np.int32, torch.int32), (np.uint8, torch.uint8),
                                                  (np.dtype("int16"), torch.int16)])
def test_numpy_dtypes_accepted_where_nl_dtypes_are(np_dtype, torch_dtype):
    @nki.jit
    def cast(a):
        out = nl.ndarray(a.shape, dtype=np_dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, dtype=np_dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=t, src=nl.load(a))
        nl.store(out, value=nl.copy(t, dtype=np_dtype))
        return out

    a = np.arange(128 * 8, dtype=np.float32).reshape(128, 8) % 100
    got = nki.simulate_kernel(cast, a)
    assert got.dtype == np.dtype(np_dtype)
    assert_close(torch.from_numpy(got), torch.from_numpy(a).to(torch_dtype))


def test_uint_dtypes_and_bad_dtype():
    assert nl.uint16.torch is torch.uint16 and nl.uint32.torch is torch.uint32   # nl.DType: the torch dtype
    assert nl.uint16 == torch.uint16 and nl.uint32 == np.uint32                    # and NumPy's

    @nki.jit
    def fill(a):
        out = nl.ndarray((128, 4), dtype=nl.uint32, buffer=nl.shared_hbm)
        nl.store(out, value=nl.full((128, 4), 7, dtype=nl.uint32))
        return out

    got = nki.simulate_kernel(fill, np.zeros(1, np.float32))
    assert got.dtype == np.uint32 and (got == 7).all()

    @nki.jit
    def bad(a):
        nl.ndarray((128, 4), dtype="float32x", buffer=nl.sbuf)
        return a

    with pytest.raises(TypeError, match="expected an nl dtype .* or a NumPy dtype"):
        nki.simulate_kernel(bad, np.zeros(1, np.float32))


def test_jit_modes():
    a, b = _rand(128, 64), _rand(128, 64, seed=4)
    expected = torch.from_numpy(a) + torch.from_numpy(b)
    for mode in ("simulation", "baremetal", "benchmark"):
        k = nki.jit(_add_kernel, mode=mode)
        assert_close(torch.from_numpy(k(a, b)), expected)
    bench = nki.jit(mode="benchmark")(_add_kernel)
    bench(a, b)
    assert bench.benchmark_result.nc_latency.get_latency_percentile(50) > 0
    assert isinstance(nki.jit(_add_kernel, mode="auto"), nki.Kernel)
    with pytest.raises(ValueError, match="mode is one of"):
        nki.jit(_add_kernel, mode="gpu")


def test_typing_newer_forms():
    t = nt.tensor[128, 512]
    assert t.shape == (128, 512) and t.dtype is None
    assert nt.tensor[128, None, nl.float16].shape == (128, None)
    assert nt.tensor[nt.mutable].mutable and not nt.mutable_tensor[nt.immutable].mutable

    @nki.jit
    def k(x: "nt.tensor[128, 16]", y: "nt.tensor[nt.mutable]"):
        nl.store(y, value=nl.negative(nl.load(x)))
        return y

    x, y = _rand(128, 16), np.zeros((128, 16), np.float32)
    nki.simulate_kernel(k, x, y)
    assert_close(torch.from_numpy(y), -torch.from_numpy(x))
    assert nt.mutable_params(k.fn) == ("y",)
    with pytest.raises(ValueError, match=r"parameter 'x' is annotated with shape \[128, 16\]"):
        nki.simulate_kernel(k, x[:, :8], y)


def test_benchmark_takes_annotations_for_inputs():
    bench = nki.benchmark(warmup=1, iters=1)(_add_kernel)
    out = bench(nt.tensor[[128, 256], nl.bfloat16], nt.tensor[[128, 256], nl.bfloat16])
    assert out.shape == (128, 256) and (out == 0).all()  # the placeholders are zeros
    try:
        import ml_dtypes
        assert out.dtype == ml_dtypes.bfloat16
    except ImportError:  # NumPy has no bfloat16 of its own: widened, exactly
        assert out.dtype == np.float32
    est = nki.jit(_add_kernel).estimate(torch.zeros(128, 256, dtype=torch.bfloat16, device="neuron"),
                                        torch.zeros(128, 256, dtype=torch.bfloat16, device="neuron"))
    assert bench.benchmark_result.nc_latency.get_latency_percentile(50) == pytest.approx(est.seconds * 1e6)
    with pytest.raises(TypeError, match="only nki.benchmark takes annotations"):
        nki.simulate_kernel(_add_kernel, nt.tensor[[128, 4], nl.float32], nt.tensor[[128, 4], nl.float32])
    with pytest.raises(TypeError, match="only with a full shape and a dtype"):
        bench(nt.tensor[[128, 4]], nt.tensor[[128, 4]])


def test_bfloat16_result_values():
    @nki.jit
    def to_bf16(a):
        out = nl.ndarray(a.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
        nl.store(out, value=nl.copy(nl.load(a), dtype=nl.bfloat16))
        return out

    a = _rand(128, 32)
    got = nki.simulate_kernel(to_bf16, a)
    expected = torch.from_numpy(a).to(torch.bfloat16)
    if got.dtype == np.float32:
        assert_close(torch.from_numpy(got), expected.float(), rtol=0, atol=0)
    else:  # ml_dtypes.bfloat16
        assert_close(torch.from_numpy(got.view(np.uint16)).view(torch.bfloat16), expected, rtol=0, atol=0)


def test_jit_kernel_called_with_numpy_arrays():
    k = nki.jit(_add_kernel)
    a, b = _rand(128, 64), _rand(128, 64, seed=5)
    got = k(a, b)
    assert isinstance(got, np.ndarray)
    assert_close(torch.from_numpy(got), torch.from_numpy(a) + torch.from_numpy(b))
    assert k.last_estimate is not None and k.last_estimate.instructions == 4  # 2 loads, add, store
    with pytest.raises(ValueError, match="NKI kernels take tensors on the neuron device"):
        k(torch.from_numpy(a), b)  # a CPU tensor is still refused, numpy beside it or not


def test_par_dim_blocks_with_mgrid_p_x_in_a_matmul():
    # The blocked layout of AWS's matmul tutorials: K/128 tiles of [128 partitions, N] in one block
    # tensor, indexed with nl.mgrid's .p/.x, accumulated in PSUM.
    @nki.jit
    def matmul_blocked(lhsT, rhs):
        K, M = lhsT.shape
        _, N = rhs.shape
        result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
        i_l = nl.mgrid[0:128, 0:M]
        i_r = nl.mgrid[0:128, 0:N]
        i_o = nl.mgrid[0:M, 0:N]
        lhs_blocks = nl.ndarray((K // 128, nl.par_dim(128), M), dtype=lhsT.dtype, buffer=nl.sbuf)
        rhs_blocks = nl.ndarray((K // 128, nl.par_dim(128), N), dtype=rhs.dtype, buffer=nl.sbuf)
        for k in nl.affine_range(K // 128):
            lhs_blocks[k, i_l.p, i_l.x] = nl.load(lhsT[k * 128 + i_l.p, i_l.x])
            rhs_blocks[k, i_r.p, i_r.x] = nl.load(rhs[k * 128 + i_r.p, i_r.x])
        acc = nl.zeros((nl.par_dim(M), N), nl.float32, buffer=nl.psum)
        for k in nl.affine_range(K // 128):
            acc += nl.matmul(lhs_blocks[k, i_l.p, i_l.x], rhs_blocks[k, i_r.p, i_r.x], transpose_x=True)
        nl.store(result[i_o.p, i_o.x], value=nl.copy(acc, dtype=result.dtype))
        return result

    lhsT, rhs = _rand(384, 64), _rand(384, 256, seed=6)
    got = matmul_blocked(lhsT, rhs)
    assert_close(torch.from_numpy(got), torch.from_numpy(lhsT).T @ torch.from_numpy(rhs), rtol=1e-4, atol=1e-4)
    # Three blocks of 64 and of 256 float32 elements per partition held at once.
    assert matmul_blocked.last_estimate.sbuf_peak_bytes_per_partition >= 3 * (64 + 256) * 4
    with pytest.raises(AttributeError, match="has no .y"):
        matmul_blocked_grid = nl.mgrid[0:2, 0:3]
        matmul_blocked_grid.y


def test_empty_like_zeros_like_and_memset_earlier_form():
    @nki.jit
    def k(a):
        out = nl.empty_like(a)  # in HBM, as a
        t = nl.load(a)
        z = nl.zeros_like(t, dtype=nl.float32)
        m = nisa.memset(shape=(128, 16), value=0.5, dtype=nl.float32)
        nl.store(out, value=nl.add(nl.add(t, z), m))
        return out

    a = _rand(128, 16)
    assert_close(torch.from_numpy(k(a)), torch.from_numpy(a) + 0.5)
    with pytest.raises(TypeError, match="nl.zeros_like takes a tile"):
        nki.simulate_kernel(nki.jit(lambda a: nl.zeros_like(3.0)), a)
    with pytest.raises(ValueError, match="needs a value and a dtype"):
        nki.simulate_kernel(nki.jit(lambda a: nisa.memset(shape=(4, 4), value=1.0)), a)


def test_device_print_logs_the_values(caplog):
    import logging

    @nki.jit
    def k(a):
        out = nl.empty_like(a)
        t = nl.load(a)
        nl.device_print("value of t:", t)
        nl.store(out, value=t)
        return out

    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    with caplog.at_level(logging.INFO, logger="torchneuron.nki.device_print"):
        got = nki.simulate_kernel(k, a)
    assert_close(torch.from_numpy(got), torch.from_numpy(a))
    assert [r.getMessage() for r in caplog.records if r.name == "torchneuron.nki.device_print"] == [
        f"value of t: {a.tolist()}"]


def test_harness_with_a_grid_and_nested_wrappers():
    @nki.jit
    def add_rows(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        i = nl.program_id(0)
        rows = nl.ds(i * 128, 128)
        nl.store(out[rows, :], value=nl.add(nl.load(a[rows, :]), nl.load(b[rows, :])))
        return out

    a, b = _rand(256, 32), _rand(256, 32, seed=7)
    expected = torch.from_numpy(a) + torch.from_numpy(b)
    assert_close(torch.from_numpy(nki.simulate(add_rows)[2](a, b)), expected)
    assert_close(torch.from_numpy(add_rows[2](a, b)), expected)
    bench = nki.benchmark(nki.simulate(add_rows))[2]
    assert_close(torch.from_numpy(bench(a, b)), expected)
    assert bench.benchmark_result.nc_latency.get_latency_percentile(0) > 0


def test_tile_reshape_is_a_view_of_the_same_elements():
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 4, 16), dtype=nl.float32, buffer=nl.sbuf)
        for j in nl.affine_range(4):
            t[:, j, :] = nl.load(a[:, j * 16:(j + 1) * 16])
        flat = t.reshape((128, 64))
        nisa.dma_copy(dst=out, src=flat[0:128, 0:64])
        return out

    a = _rand(128, 64)
    assert_close(torch.from_numpy(k(a)), torch.from_numpy(a))

    @nki.jit
    def through(a):
        out = nl.ndarray((128, 8), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.zeros((128, 2, 4), dtype=nl.float32)
        v = t.reshape((128, 8))
        v[:, 0:8] = nl.load(a)  # a write through the view writes the tile
        nl.store(out, value=nl.copy(t.reshape((128, 8))))
        return out

    a = _rand(128, 8)
    assert_close(torch.from_numpy(through(a)), torch.from_numpy(a))
    with pytest.raises(ValueError, match="same partitions"):
        nki.simulate_kernel(nki.jit(lambda a: nl.zeros((128, 8), nl.float32).reshape((64, 16))), a)
