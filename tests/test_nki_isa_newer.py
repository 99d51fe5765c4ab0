"""The newer NKI's registers and instructions (torchneuron/nki/_isa_newer.py): virtual registers driving loops,
nc_n_gather, dma_compute, activate2; each kernel run on the neuron device and compared with NumPy / PyTorch
on the CPU."""

import numpy as np
import pytest
import torch
from torch.testing import assert_close

import torchneuron  # noqa: F401
import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_registers_drive_dynamic_loops_and_move_values():
    @nki.jit(mode="simulation")
    def k(a, trips):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        count = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
        reg = nisa.register_alloc()
        nisa.register_load(reg, nl.load(trips))           # a trip count read when the kernel runs
        acc = nl.zeros(a.shape, dtype=nl.float32)
        x = nl.load(a)
        for _ in nl.dynamic_range(reg):
            acc[...] = nl.add(acc, x)
        nl.store(out, acc)
        left = nisa.register_alloc(3)                      # a while loop on a register
        steps = nisa.register_alloc(0)
        flag = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        n = 0
        while left:
            n += 1
            nisa.register_move(steps, n)
            nisa.iota(flag, nl.arange(1)[None, :] * 0 + (3 - n))
            nisa.register_load(left, flag)
        copy = nisa.register_alloc()
        nisa.register_move(copy, steps)
        nisa.register_store(count, copy)
        return out, count

    x = _rand(128, 16)
    out, count = k(x, np.array([[4]], np.int32))
    assert_close(torch.from_numpy(out), torch.from_numpy(x) * 4, rtol=1e-6, atol=1e-6)
    assert int(count[0, 0]) == 3


def test_reading_an_empty_register_raises():
    @nki.jit(mode="simulation")
    def k(a):
        for _ in nl.dynamic_range(nisa.register_alloc()):
            pass

    with pytest.raises(RuntimeError, match="register"):
        k(np.zeros((1, 1), np.float32))


def test_nc_n_gather_matches_torch_gather():
    @nki.jit(mode="simulation")
    def k(data, idx):
        out = nl.ndarray(idx.shape, dtype=data.dtype, buffer=nl.shared_hbm)
        d, i = nl.load(data), nl.load(idx)
        g = nl.ndarray(idx.shape, dtype=data.dtype, buffer=nl.sbuf)
        nisa.nc_n_gather(g, d, i)
        nl.store(out, g)
        return out

    x = _rand(64, 4, 8)
    idx = np.random.default_rng(1).integers(0, 32, size=(64, 10)).astype(np.uint32)
    expected = torch.gather(torch.from_numpy(x).reshape(64, 32), 1, torch.from_numpy(idx.astype(np.int64)))
    assert_close(torch.from_numpy(k(x, idx)), expected, rtol=0, atol=0)
    with pytest.raises(IndexError, match="out of range"):
        k(x, np.full((64, 2), 32, np.uint32))


def test_dma_compute_adds_its_sources():
    @nki.jit(mode="simulation")
    def k(a, b, c):
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_compute(out, [nl.load(a), b, nl.load(c)], nl.add)        # SBUF and HBM sources into HBM
        t = nl.ndarray(a.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_compute(t, [a, b], np.add, scales=[1.0, 1.0])            # into SBUF, cast to bfloat16
        out2 = nl.ndarray(a.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
        nl.store(out2, t)
        return out, out2

    a, b, c = _rand(128, 8, seed=1), _rand(128, 8, seed=2), _rand(128, 8, seed=3)
    out, out2 = k(a, b, c)
    assert_close(torch.from_numpy(out), torch.from_numpy(a + b + c), rtol=1e-6, atol=1e-6)
    ref = (torch.from_numpy(a) + torch.from_numpy(b)).bfloat16().float()
    got = torch.from_numpy(np.asarray(out2, dtype=np.float32))
    assert_close(got, ref, rtol=0, atol=0)

    @nki.jit(mode="simulation")
    def scaled(a):
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_compute(out, [a], nl.add, scales=[2.0])

    with pytest.raises(ValueError, match="1.0"):
        scaled(a)


def test_dma_compute_scatter_read_modify_write():
    @nki.jit(mode="simulation")
    def k64(table, rows, upd):
        r = nl.load(rows)
        target = table.ap([[8, 64], [1, 8]], vector_offset=r, indirect_dim=0)   # row rows[p] for partition p
        nisa.dma_compute(target, [target, nl.load(upd)], nl.add)
        return table

    table = _rand(64, 8)
    rows = np.random.default_rng(5).permutation(64).reshape(64, 1).astype(np.int32)
    upd = _rand(64, 8, seed=6)
    got = k64(table.copy(), rows, upd)
    expected = table.copy()
    expected[rows[:, 0]] += upd
    assert_close(torch.from_numpy(got), torch.from_numpy(expected), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op0,op1,rev0,rev1,ref", [
    ("multiply", "add", False, False, lambda x, a, b: np.exp(x * a + b)),
    ("multiply", "subtract", False, True, lambda x, a, b: np.exp(b - x * a)),
    ("subtract", "bypass", True, False, lambda x, a, b: np.exp(a - x)),
    ("bypass", "bypass", False, False, lambda x, a, b: np.exp(x)),
])
def test_activate2_matches_numpy(op0, op1, rev0, rev1, ref):
    @nki.jit(mode="simulation", platform_target="trn3")
    def k(x, scale):
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        sums = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
        y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        r = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activate2(y, nl.exp, nl.load(x), imm0=nl.load(scale), imm1=0.25, op0=getattr(nl, op0),
                       op1=getattr(nl, op1), reverse0=rev0, reverse1=rev1, reduce_op=nl.add, reduce_res=r)
        nl.store(out, y)
        nl.store(sums, r)
        return out, sums

    x = _rand(128, 16) * 0.5
    scale = np.abs(_rand(128, 1, seed=7))
    out, sums = k(x, scale)
    expected = ref(x.astype(np.float64), scale.astype(np.float64), 0.25)
    assert_close(torch.from_numpy(out), torch.from_numpy(expected).float(), rtol=1e-5, atol=1e-5)
    assert_close(torch.from_numpy(sums), torch.from_numpy(expected.sum(1, keepdims=True)).float(), rtol=1e-5,
                 atol=1e-4)


def test_activate2_prelu_and_its_limits():
    @nki.jit(mode="simulation", platform_target="trn3")
    def k(x, slope):
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.activate2(y, nl.prelu, nl.load(x), imm0=2.0, imm1=None, op0=nl.multiply, op1=nl.bypass,
                       relu_param=nl.load(slope))
        nl.store(out, y)
        return out

    x, slope = _rand(128, 8), np.abs(_rand(128, 1, seed=8))
    y = 2.0 * x
    assert_close(torch.from_numpy(k(x, slope)), torch.from_numpy(np.where(y >= 0, y, y * slope)), rtol=1e-6, atol=1e-6)

    def refused(target, op0):
        @nki.jit(mode="simulation", platform_target=target)
        def kernel(x):
            y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
            nisa.activate2(y, nl.exp, nl.load(x), imm0=1.0, imm1=1.0, op0=op0, op1=nl.add)
        return kernel

    with pytest.raises(ValueError, match="NeuronCore-v4"):
        refused("trn2", nl.multiply)(x)
    with pytest.raises(ValueError, match="op0, op1"):
        refused("trn3", nl.add)(x)  # a pair AWS does not list


def test_loop_reduce_accumulates_into_its_destination():
    @nki.jit(mode="simulation")
    def k(a):
        out = nl.ndarray((128, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        best = nl.full((128, 16), -1e30, dtype=nl.float32)
        total = nl.zeros((128, 16), dtype=nl.float32)
        for i in nl.affine_range(a.shape[0] // 128):
            x = nl.load(a[i * 128:(i + 1) * 128, :])
            best = nl.loop_reduce(x, op=np.maximum, loop_indices=[i], dtype=nl.float32)
            total = nl.loop_reduce(
                x, op=np.add, loop_indices=[i])
        nl.store(out, nl.add(best, total))
        return out

    x = _rand(512, 16)
    blocks = torch.from_numpy(x).reshape(4, 128, 16)
    assert_close(torch.from_numpy(k(x)), blocks.amax(0) + blocks.sum(0), rtol=1e-5, atol=1e-5)

    @nki.jit(mode="simulation")
    def unassigned(a):
        return nl.add(nl.loop_reduce(nl.load(a), op=np.add, loop_indices=[0]), 1.0)

    with pytest.raises(NotImplementedError, match="assigned"):
        unassigned(x[:128])


def test_instructions_results_are_instruction_handles():
    @nki.jit(mode="simulation")
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        x = nl.load(a)
        y = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        first = nisa.tensor_copy(dst=y, src=x)
        second = nisa.activation(dst=y, op=nl.exp, data=y)
        assert isinstance(first, nisa.NkiInstruction) and second.depends_on(first) is second
        stored = nisa.dma_copy(dst=out, src=y)
        assert stored.depends_on(second, first) is stored
        return out

    x = _rand(128, 8)
    assert_close(torch.from_numpy(k(x)), torch.exp(torch.from_numpy(x)), rtol=1e-6, atol=1e-6)

    @nki.jit(mode="simulation")
    def bad(a):
        nl.load(a).depends_on(3)

    with pytest.raises(TypeError, match="depends_on"):
        bad(x)


def test_quantize_mx_and_nc_matmul_mx_match_numpy():
    ml_dtypes = pytest.importorskip("ml_dtypes")  # the host side of fp8 and bfloat16
    K, M, N = 64, 16, 32

    @nki.jit(mode="simulation", platform_target="trn3")
    def k(a, b):
        qa = nl.ndarray((K, M), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        sa = nl.zeros((K, M), dtype=nl.uint8)
        nisa.quantize_mx(dst=qa, src=nl.load(a), dst_scale=sa)
        qb = nl.ndarray((K, N), dtype=nl.float8_e5m2_x4, buffer=nl.sbuf)
        sb = nl.zeros((K, N), dtype=nl.uint8)
        nisa.quantize_mx(qb, nl.load(b), sb)
        res = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul_mx(res, qa, qb, sa, sb)
        out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, res)
        return out, qa, sa, qb, sb

    rng = np.random.default_rng(9)
    a = (rng.standard_normal((K, 4 * M)) * np.exp2(rng.integers(-6, 6, size=(K, 1)))).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((K, 4 * N)).astype(ml_dtypes.bfloat16)
    out, qa, sa, qb, sb = k(a, b)

    def check(x, q, s, fp8, emax):
        x = x.astype(np.float32)
        p, f = x.shape
        amax = np.abs(x).reshape(p // 8, 8, f // 4, 4).max(axis=(1, 3))
        expected_bits = (np.floor(np.log2(amax)) - (emax - 1) + 127).astype(np.uint8)
        rows = [(g // 4) * 32 + g % 4 for g in range(p // 8)]
        np.testing.assert_array_equal(s[rows], expected_bits)
        scale = np.exp2(expected_bits.astype(np.float32) - 127).repeat(8, 0).repeat(4, 1)
        values = q.view(np.uint8).view(fp8).astype(np.float32)              # [P, F]: the x4 words unpacked
        np.testing.assert_array_equal(values, (x / scale).astype(fp8).astype(np.float32))
        group_max = amax.repeat(8, 0).repeat(4, 1)                          # fp8's precision within a group
        assert (np.abs(values * scale - x) <= 2.0 ** -3 * group_max).all()
        return values * scale

    da = check(a, qa, sa, ml_dtypes.float8_e4m3fn, 8)
    db = check(b, qb, sb, ml_dtypes.float8_e5m2, 15)
    expected = np.einsum("kmj,knj->mn", da.reshape(K, M, 4).astype(np.float64), db.reshape(K, N, 4))
    assert_close(torch.from_numpy(out), torch.from_numpy(expected).float(), rtol=1e-5, atol=1e-4)

    @nki.jit(mode="simulation", platform_target="trn2")
    def on_trn2(a):
        q = nl.ndarray((K, M), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        nisa.quantize_mx(q, nl.load(a), nl.zeros((K, M), dtype=nl.uint8))

    with pytest.raises(ValueError, match="NeuronCore-v4"):
        on_trn2(a)


def test_nc_matmul_mx_with_mxfp4_stationary():
    ml_dtypes = pytest.importorskip("ml_dtypes")  # to read the fp8 moving operand on the host
    K, M, N = 32, 8, 16
    fp4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
    rng = np.random.default_rng(10)
    nib = rng.integers(0, 16, size=(K, M, 4))
    words = (nib[..., 0] | nib[..., 1] << 4 | nib[..., 2] << 8 | nib[..., 3] << 12).astype(np.uint16).view(np.int16)
    a_scale = rng.integers(120, 134, size=(K // 8, M)).astype(np.uint8)
    b = rng.standard_normal((K, 4 * N)).astype(np.float16)

    @nki.jit(mode="simulation", platform_target="trn3")
    def k(words, a_scale, b):
        qa = nl.ndarray((K, M), dtype=nl.float4_e2m1fn_x4, buffer=nl.sbuf)
        nisa.dma_copy(dst=qa, src=words)
        sa = nl.zeros((K, M), dtype=nl.uint8)
        nisa.dma_copy(dst=sa[0:4, :], src=a_scale)                   # groups 0..3 on partitions 0..3
        qb = nl.ndarray((K, N), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        sb = nl.zeros((K, N), dtype=nl.uint8)
        nisa.quantize_mx(qb, nl.load(b), sb)
        res = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul_mx(res, qa, qb, sa, sb)
        out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, res)
        return out, qb, sb

    out, qb, sb = k(words, a_scale, b)
    a = fp4[nib] * np.exp2(a_scale.astype(np.float64) - 127).repeat(8, 0)[:, :, None]      # [K, M, 4]
    b_scale = np.exp2(sb[:4].astype(np.float64) - 127).repeat(8, 0)                           # [K, N]
    bv = qb.view(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64).reshape(K, N, 4) * b_scale[:, :, None]
    expected = np.einsum("kmj,knj->mn", a, bv)
    assert_close(torch.from_numpy(out), torch.from_numpy(expected).float(), rtol=1e-5, atol=1e-5)
