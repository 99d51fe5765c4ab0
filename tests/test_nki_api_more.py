"""The rest of NKI's public API (torchneuron/nki/_language_more.py, _isa_more.py, compiler, the import alias):
each instruction run in a kernel on the neuron device and compared with the same computation by NumPy /
PyTorch on the CPU."""

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


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _t(a):
    return torch.from_numpy(np.asarray(a))


def unary_kernel(fn):
    @nki.jit(mode="simulation")
    def k(a):
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, fn(nl.load(a)))
        return out
    return k


# ---- nki.language: element-wise math, logic, bits -------------------------------------------------------

UNARY = [
    (nl.arctan, torch.atan), (nl.tan, torch.tan), (nl.ceil, torch.ceil), (nl.floor, torch.floor),
    (nl.trunc, torch.trunc), (nl.sign, torch.sign), (nl.mish, torch.nn.functional.mish),
    (nl.softplus, torch.nn.functional.softplus),
    (nl.gelu_apprx_tanh, lambda x: torch.nn.functional.gelu(x, approximate="tanh")),
    (nl.gelu_apprx_sigmoid, lambda x: x * torch.sigmoid(1.702 * x)),
    (nl.erf_dx, lambda x: 2 / np.sqrt(np.pi) * torch.exp(-x * x)),
    (nl.logical_not, lambda x: (~x.bool()).float()),
]


@pytest.mark.parametrize("fn,ref", UNARY, ids=[f.__name__ for f, _ in UNARY])
def test_unary_math_matches_torch(fn, ref):
    x = _rand(128, 64)
    assert_close(_t(unary_kernel(fn)(x)), ref(_t(x)).float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fn,ref", [(nl.silu_dx, torch.nn.functional.silu), (nl.gelu_dx, torch.nn.functional.gelu)])
def test_derivatives_match_autograd(fn, ref):
    x = _rand(128, 32)
    xt = _t(x).clone().requires_grad_()
    ref(xt).sum().backward()
    assert_close(_t(unary_kernel(fn)(x)), xt.grad, rtol=1e-5, atol=1e-5)


BINARY = [(nl.fmod, torch.fmod), (nl.mod, torch.remainder), (nl.abs_max, lambda a, b: torch.maximum(a.abs(), b.abs())),
          (nl.abs_min, lambda a, b: torch.minimum(a.abs(), b.abs())),
          (nl.logical_and, lambda a, b: (a.bool() & b.bool()).float()),
          (nl.logical_xor, lambda a, b: (a.bool() ^ b.bool()).float())]


@pytest.mark.parametrize("fn,ref", BINARY, ids=[f.__name__ for f, _ in BINARY])
def test_binary_math_matches_torch(fn, ref):
    @nki.jit(mode="simulation")
    def k(a, b):
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, fn(nl.load(a), nl.load(b)))
        return out
    a, b = _rand(128, 64), _rand(128, 64, seed=1) + 0.5
    a[:, :4] = 0  # logical ops see zeros too
    assert_close(_t(k(a, b)), ref(_t(a), _t(b)).float())


def test_bitwise_ops_match_numpy():
    @nki.jit(mode="simulation")
    def k(a, b):
        outs = [nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.shared_hbm) for _ in range(5)]
        x, y = nl.load(a), nl.load(b)
        for o, f in zip(outs, (nl.bitwise_and, nl.bitwise_or, nl.bitwise_xor, nl.left_shift, nl.right_shift)):
            nl.store(o, f(x, y))
        return tuple(outs)
    rng = np.random.default_rng(0)
    a = rng.integers(0, 1 << 20, (128, 16), dtype=np.int32)
    b = rng.integers(0, 8, (128, 16), dtype=np.int32)
    got = k(a, b)
    for g, want in zip(got, (a & b, a | b, a ^ b, a << b, a >> b)):
        np.testing.assert_array_equal(g, want)


def test_reductions_all_var_softmax_rms_norm():
    @nki.jit(mode="simulation")
    def k(a, w):
        outs = [nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm) for _ in range(2)]
        sm = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        rn = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.load(a)
        nl.store(outs[0], nl.var(x, axis=1, keepdims=True))
        nl.store(outs[1], nl.all(nl.greater(x, -10.0), axis=1, keepdims=True, dtype=nl.float32))
        nl.store(sm, nl.softmax(x, axis=1))
        nl.store(rn, nl.rms_norm(x, nl.load(w), axis=1, n=a.shape[1]))
        return outs[0], outs[1], sm, rn
    a, w = _rand(128, 64), _rand(1, 64, seed=2)
    var, al, sm, rn = k(a, np.broadcast_to(w, (128, 64)).copy())
    x = _t(a)
    assert_close(_t(var), x.var(1, unbiased=False, keepdim=True))
    assert_close(_t(al), (x > -10).all(1, keepdim=True).float())
    assert_close(_t(sm), torch.softmax(x, 1))
    assert_close(_t(rn), x * torch.rsqrt((x * x).mean(1, keepdim=True) + 1e-6) * _t(w), rtol=1e-5, atol=1e-5)


def test_rand_dropout_seeded_and_in_range():
    @nki.jit(mode="simulation")
    def k(a):
        r = nl.ndarray((32, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        d = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nl.random_seed(7)
        nl.store(r, nl.rand((32, 128)))
        nl.store(d, nl.dropout(nl.load(a), 0.5))
        return r, d
    a = _rand(128, 256) + 10
    r1, d1 = k(a)
    r2, d2 = k(a)
    assert (r1 >= 0).all() and (r1 < 1).all() and r1.std() > 0.2
    np.testing.assert_array_equal(r1, r2)  # the same seed, the same numbers
    np.testing.assert_array_equal(d1, d2)
    kept = d1 != 0
    np.testing.assert_array_equal(d1[kept], a[kept])  # kept elements unscaled
    assert 0.4 < kept.mean() < 0.6


def test_replay_keeps_the_interpreter_for_unseeded_random_numbers(monkeypatch):
    from torchneuron.nki import _replay

    monkeypatch.setenv("TORCHNEURON_NKI_REPLAY", "early")  # traced and compiled at the second call

    def make(seed):
        @nki.jit
        def k(a):
            out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
            if seed is not None:
                nl.random_seed(seed)
            nl.store(out, nl.add(nl.load(a), nl.rand(a.shape)))
            return out
        return k

    a = torch.zeros(32, 64, device="neuron")
    unseeded = make(None)
    outs = [unseeded(a).cpu() for _ in range(4)]
    (entry,) = _replay.entries(unseeded.fn).values()
    assert entry.runner is None and "random" in entry.reason  # a graph would repeat one call's numbers
    assert all(not torch.equal(outs[i], outs[i + 1]) for i in range(3))
    torch.manual_seed(3)
    first = unseeded(a).cpu()
    torch.manual_seed(3)
    assert_close(unseeded(a).cpu(), first, rtol=0, atol=0)  # torch.manual_seed makes them reproducible
    seeded = make(11)
    outs = [seeded(a).cpu() for _ in range(4)]  # interpreted, traced, then replayed or interpreted
    (entry,) = _replay.entries(seeded.fn).values()
    assert "random" not in entry.reason
    for o in outs[1:]:
        assert_close(o, outs[0], rtol=0, atol=0)


def test_gather_flattened_and_expand_dims_and_broadcast_to():
    @nki.jit(mode="simulation")
    def k(a, idx, r):
        out = nl.ndarray(idx.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        b = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        e = nl.ndarray((128, 1, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.gather_flattened(nl.load(a), nl.load(idx)))
        b_tile = nl.broadcast_to(nl.load(r), shape=(128, 64))
        nl.store(b, b_tile)
        nl.store(e, nl.expand_dims(b_tile, 1))
        return out, b, e
    a = _rand(128, 4, 16)
    idx = np.random.default_rng(1).integers(0, 64, (128, 10)).astype(np.uint32)
    r = _rand(1, 64, seed=3)
    got, b, e = k(a, idx, r)
    np.testing.assert_array_equal(got, np.take_along_axis(a.reshape(128, -1), idx.astype(np.int64), 1))
    np.testing.assert_array_equal(b, np.broadcast_to(r, (128, 64)))
    np.testing.assert_array_equal(e, np.broadcast_to(r, (128, 64))[:, None, :])


def test_atomic_rmw_accumulates_repeated_indices():
    @nki.jit(mode="simulation")
    def k(t, v, idx):
        values = nl.load(v)
        i = nl.load(idx)
        _, iy = nl.mgrid[0:32, 0:16]
        nl.atomic_rmw(t[i, iy], value=values, op=np.add)
        return t
    t = np.zeros((8, 16), np.float32)
    v = _rand(32, 16)
    idx = (np.arange(32) % 8).astype(np.int32)[:, None]
    want = np.zeros((8, 16), np.float32)
    np.add.at(want, idx[:, 0], v)
    assert_close(_t(k(t, v, idx)), _t(want))


def test_spmd_dim_num_programs_program_ndim():
    @nki.jit
    def k(out):
        i, j = nl.program_id(0), nl.program_id(1)
        t = nl.full((1, 4), 0.0, dtype=nl.float32)
        t2 = nl.add(t, float(nl.num_programs() * 1000 + nl.num_programs(axes=0) * 100 + nl.program_ndim() * 10))
        nl.store(out[i * 2 + j:i * 2 + j + 1, :], t2)
    out = torch.zeros(8, 4, device="neuron")
    k[nl.spmd_dim(nl.nc(2), 2), 2](out)
    assert_close(out.cpu(), torch.full((8, 4), 8 * 1000 + 4 * 100 + 2 * 10.0))


def test_control_flow_and_memory_queries():
    assert nl.fori_loop(0, 5, lambda i, v: v + i, 10) == 20
    assert nl.while_loop(lambda v: v < 100, lambda v: v * 2, 3) == 192

    @nki.jit(mode="simulation")
    def k(a):
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.load(a)
        p = nl.zeros((128, 8), dtype=nl.float32, buffer=nl.psum)
        assert nl.is_sbuf(x) and nl.is_on_chip(p) and nl.is_psum(p) and nl.is_hbm(out) and not nl.is_hbm(x)
        acc = x
        for _ in nl.dynamic_range(3):
            acc = nl.add(acc, x)
        with nl.no_reorder():
            nl.store(out, acc)
        return out
    a = _rand(128, 8)
    assert_close(_t(k(a)), _t(a) * 4)


# ---- nki.isa -----------------------------------------------------------------------------------------

def test_max8_find_index8_match_replace8():
    @nki.jit(mode="simulation")
    def k(a):
        m = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        i = nl.ndarray((16, 8), dtype=nl.uint32, buffer=nl.shared_hbm)
        r = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        ri = nl.ndarray((16, 8), dtype=nl.uint32, buffer=nl.shared_hbm)
        x = nl.load(a)
        top = nisa.max8(src=x)
        nl.store(m, top)
        nl.store(i, nisa.nc_find_index8(data=x, vals=top))
        idx = nl.ndarray((16, 8), dtype=nl.uint32)
        nl.store(r, nisa.nc_match_replace8(data=x, vals=top, imm=-1e9, dst_idx=idx))
        nl.store(ri, idx)
        return m, i, r, ri
    a = _rand(16, 100)
    m, i, r, ri = k(a)
    order = np.argsort(-a, axis=1)[:, :8]
    np.testing.assert_array_equal(m, np.take_along_axis(a, order, 1))
    np.testing.assert_array_equal(i, order)
    np.testing.assert_array_equal(ri, order)
    want = a.copy()
    np.put_along_axis(want, order, -1e9, 1)
    np.testing.assert_array_equal(r, want)


def test_nc_stream_shuffle_within_quadrants():
    @nki.jit(mode="simulation")
    def k(a):
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.load(a)
        y = nl.ndarray(a.shape, dtype=nl.float32)
        nisa.memset(dst=y, value=-1.0)
        mask = [31 - i for i in range(31)] + [255]
        nisa.nc_stream_shuffle(src=x, dst=y, shuffle_mask=mask)
        nl.store(out, y)
        return out
    a = _rand(64, 8)
    got = k(a)
    want = np.full_like(a, -1.0)
    for q in (0, 32):
        for i in range(31):
            want[q + i] = a[q + 31 - i]
    np.testing.assert_array_equal(got, want)


def test_select_reduce_range_select_tensor_scalar_reduce_activation_reduce():
    @nki.jit(mode="simulation")
    def k(a, p, b0, b1):
        outs = [nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm) for _ in range(4)]
        reds = [nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm) for _ in range(4)]
        x, pr = nl.load(a), nl.load(p)
        dst = nl.ndarray(a.shape, dtype=nl.float32)
        rr = [nl.ndarray((128, 1), dtype=nl.float32) for _ in range(4)]
        nisa.select_reduce(dst=dst, predicate=pr, on_true=x, on_false=-5.0, reduce_res=rr[0],
                           reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_op=np.max)
        nl.store(outs[0], dst)
        y = nisa.range_select(on_true_tile=x, comp_op0=np.greater_equal, comp_op1=np.less, bound0=nl.load(b0),
                              bound1=nl.load(b1), reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_res=rr[1],
                              reduce_op=np.max, range_start=2, on_false_value=nl.fp32.min)
        nl.store(outs[1], y)
        nl.store(outs[2], nisa.tensor_scalar_reduce(data=x, op0=np.multiply, operand0=2.0, reduce_op=np.add,
                                                    reduce_res=rr[2]))
        nl.store(outs[3], nisa.activation_reduce(op=np.exp, data=x, reduce_op=np.add, reduce_res=rr[3], scale=0.5))
        for o, r in zip(reds, rr):
            nl.store(o, r)
        return tuple(outs) + tuple(reds)
    a = _rand(128, 32)
    p = (np.random.default_rng(1).random((128, 32)) > 0.5).astype(np.uint8)
    b0 = np.full((128, 1), 5.0, np.float32)
    b1 = np.full((128, 1), 20.0, np.float32)
    sel, rng_, tsr, act, r_sel, r_rng, r_tsr, r_act = k(a, p, b0, b1)
    x = _t(a)
    want_sel = torch.where(_t(p).bool(), x, torch.tensor(-5.0))
    assert_close(_t(sel), want_sel)
    assert_close(_t(r_sel), want_sel.amax(1, keepdim=True))
    idx = 2 + torch.arange(32.0)
    want_rng = torch.where((idx >= 5) & (idx < 20), x, torch.tensor(torch.finfo(torch.float32).min))
    assert_close(_t(rng_), want_rng)
    assert_close(_t(r_rng), want_rng.amax(1, keepdim=True))
    assert_close(_t(tsr), x * 2)
    assert_close(_t(r_tsr), (x * 2).sum(1, keepdim=True))
    assert_close(_t(act), torch.exp(x * 0.5))
    assert_close(_t(r_act), torch.exp(x * 0.5).sum(1, keepdim=True))


def test_bn_stats_bn_aggr_give_mean_and_variance():
    @nki.jit(mode="simulation")
    def k(a):
        out = nl.ndarray((128, 2), dtype=nl.float32, buffer=nl.shared_hbm)
        stats = nl.ndarray((128, 12), dtype=nl.float32)
        x = nl.load(a)
        stats[:, 0:6] = nisa.bn_stats(x[:, 0:512])
        stats[:, 6:12] = nisa.bn_stats(x[:, 512:1000])
        nl.store(out, nisa.bn_aggr(stats))
        return out
    a = _rand(128, 1000)
    got = _t(k(a))
    x = _t(a)
    assert_close(got[:, 0], x.mean(1), rtol=1e-5, atol=1e-5)
    assert_close(got[:, 1], x.var(1, unbiased=False), rtol=1e-5, atol=1e-5)


def test_local_gather_matches_numpy_semantics():
    @nki.jit(mode="simulation")
    def k(src, index):
        out = nl.ndarray((128, 64 * 4), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nisa.local_gather(nl.load(src), nl.load(index), 4, 64))
        return out
    rng = np.random.default_rng(0)
    src = rng.random((128, 512, 4)).astype(np.float32)
    per_core = rng.integers(0, 512, (16, 4)).astype(np.uint16)
    index = np.tile(per_core, (8, 1))
    got = k(src, index * 4)
    want = np.empty((128, 64, 4), np.float32)
    for c in range(8):
        ids = index[c * 16:(c + 1) * 16].flatten(order="F")[:64]
        want[c * 16:(c + 1) * 16] = np.take(src[c * 16:(c + 1) * 16], ids, axis=1)
    np.testing.assert_array_equal(got, want.reshape(128, -1))


def test_scans_partition_reduce_reciprocal_dropout_copy_predicated():
    @nki.jit(mode="simulation")
    def k(a, b, p):
        outs = [nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm) for _ in range(4)]
        pr = nl.ndarray((1, a.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
        x, y = nl.load(a), nl.load(b)
        nl.store(outs[0], nisa.tensor_tensor_scan(x, y, 0.0, np.multiply, np.add))
        nl.store(outs[1], nisa.reciprocal(x))
        d = nl.ndarray(a.shape, dtype=nl.float32)
        nisa.memset(dst=d, value=7.0)
        nisa.tensor_copy_predicated(src=x, dst=d, predicate=nl.load(p))
        nl.store(outs[2], d)
        nl.store(outs[3], nisa.scalar_tensor_tensor(data=x, op0=np.subtract, operand0=1.0, op1=np.multiply,
                                                    operand1=y))
        nl.store(pr, nisa.tensor_partition_reduce(np.add, x))
        return tuple(outs) + (pr,)
    a, b = _rand(32, 16) + 3, _rand(32, 16, seed=1)
    p = (np.random.default_rng(2).random((32, 16)) > 0.5).astype(np.uint8)
    scan, rec, cp, stt, pr = k(a, b, p)
    want = np.empty_like(a)
    prev = np.zeros(32, np.float32)
    for i in range(16):
        prev = a[:, i] * prev + b[:, i]
        want[:, i] = prev
    assert_close(_t(scan), _t(want), rtol=1e-5, atol=1e-5)
    assert_close(_t(rec), 1 / _t(a))
    np.testing.assert_array_equal(cp, np.where(p != 0, a, 7.0))
    assert_close(_t(stt), (_t(a) - 1) * _t(b))
    assert_close(_t(pr), _t(a).sum(0, keepdim=True), rtol=1e-5, atol=1e-5)


def test_sequence_bounds_example():
    @nki.jit(mode="simulation")
    def k(s):
        out = nl.ndarray((1, 2, 9), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nisa.sequence_bounds(segment_ids=nl.load(s)))
        return out
    s = np.array([[0, 1, 1, 2, 2, 2, 0, 3, 3]], np.float32)
    want = np.array([[[9, 1, 1, 3, 3, 3, 9, 7, 7], [-1, 3, 3, 6, 6, 6, -1, 9, 9]]], np.float32)
    np.testing.assert_array_equal(k(s), want)


def test_dma_transpose_and_indirect_dma_oob_modes():
    @nki.jit(mode="simulation")
    def k(a):
        t = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        o = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(t, nisa.dma_transpose(a[0:128, 0:64]))
        idx = nisa.iota(3 * nl.arange(64)[:, None], dtype=nl.int32)
        dst = nisa.memset(shape=(64, 64), value=-1.0, dtype=nl.float32)
        _, iy = nl.mgrid[0:64, 0:64]
        nisa.dma_copy(dst=dst, src=a[idx, iy], oob_mode=nisa.oob_mode.skip)
        nl.store(o, dst)
        return t, o
    a = _rand(128, 64)
    t, o = k(a)
    np.testing.assert_array_equal(t, a.T)
    rows = 3 * np.arange(64)
    want = np.full((64, 64), -1.0, np.float32)
    want[rows < 128] = a[rows[rows < 128]]
    np.testing.assert_array_equal(o, want)

    @nki.jit(mode="simulation")
    def strict(a):
        o = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        idx = nisa.iota(3 * nl.arange(64)[:, None], dtype=nl.int32)
        dst = nl.ndarray((64, 64), dtype=nl.float32)
        _, iy = nl.mgrid[0:64, 0:64]
        nisa.dma_copy(dst=dst, src=a[idx, iy])
        nl.store(o, dst)
        return o
    with pytest.raises(IndexError, match="out of bounds"):
        strict(a)


def test_numpy_ufuncs_as_op_and_psum_store():
    @nki.jit(mode="simulation")
    def k(a, b):
        o1 = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        o2 = nl.ndarray((a.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
        o3 = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        x, y = nl.load(a), nl.load(b)
        nl.store(o1, nisa.tensor_scalar(nisa.tensor_tensor(x, y, op=np.subtract), np.multiply, 3.0))
        nl.store(o2, nisa.tensor_reduce(np.max, x, axis=1, keepdims=True))
        nl.store(o3, nisa.nc_matmul(x[:, 0:64], y[:, 0:64]))  # a PSUM tile stored straight to HBM
        return o1, o2, o3
    a, b = _rand(128, 64), _rand(128, 64, seed=1)
    o1, o2, o3 = k(a, b)
    assert_close(_t(o1), (_t(a) - _t(b)) * 3)
    assert_close(_t(o2), _t(a).amax(1, keepdim=True))
    assert_close(_t(o3), _t(a).T @ _t(b), rtol=1e-4, atol=1e-4)


def test_isa_enums_and_version():
    assert nisa.vector_engine == nisa.engine.vector and nisa.oob_mode.skip == 1 and nisa.dge_mode.hwdge == 2
    assert nisa.reduce_cmd.reset_reduce == 3
    assert nisa.get_nc_version() in (nisa.nc_version.gen2, nisa.nc_version.gen3, nisa.nc_version.gen4)


def test_compiler_directives_are_noops():
    import torchneuron.nki.compiler as ncc

    @ncc.enable_stack_allocator
    @ncc.skip_middle_end_transformations
    @nki.jit(mode="simulation")
    def k(a):
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((2, nl.par_dim(128), 8), dtype=nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=0,
                                                                                          num_free_tiles=(2,)))
        t[0] = nl.load(a)
        nl.store(out, nl.exp(t[0]))
        return out
    a = _rand(128, 8)
    assert_close(_t(k(a)), torch.exp(_t(a)))
    assert ncc.psum.auto_alloc() is nl.psum


# ---- the import alias -------------------------------------------------------------------------------

ALIASED = textwrap.dedent("""
    import numpy as np
    import neuronxcc.nki as nki
    import neuronxcc.nki.language as nl
    import neuronxcc.nki.isa as nisa
    from neuronxcc import nki as nki2
    import nki.isa as nisa2
    import torchneuron.nki
    assert nki is nki2 is torchneuron.nki and nisa is nisa2 is torchneuron.nki.isa

    @nki.jit(mode="simulation")
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nisa.activation(op=np.exp, data=nl.load(a)))
        return out

    x = np.linspace(-1, 1, 128 * 8, dtype=np.float32).reshape(128, 8)
    assert np.allclose(k(x), np.exp(x), rtol=1e-6)
    print("ALIAS-OK")
""")


def test_alias_runs_an_aws_kernel_file_unchanged(tmp_path):
    script = tmp_path / "aws_kernel.py"
    script.write_text(ALIASED)
    p = subprocess.run([sys.executable, "-m", "torchneuron.nki.alias", str(script)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "ALIAS-OK" in p.stdout


def test_alias_is_opt_in_and_removable():
    for name in ("neuronxcc", "nki"):
        assert name not in sys.modules
    with pytest.raises(ModuleNotFoundError):
        __import__("neuronxcc.nki")
    with nki.aliased() as roots:
        assert roots == ("neuronxcc", "nki")
        import neuronxcc.nki.language as aliased_nl
        assert aliased_nl is nl
    assert "neuronxcc" not in sys.modules and "neuronxcc.nki.language" not in sys.modules
    assert not any(type(f).__name__ == "AliasFinder" for f in sys.meta_path)
    with pytest.raises(ModuleNotFoundError):
        __import__("neuronxcc.nki")


def test_alias_leaves_a_real_package_alone(tmp_path, monkeypatch):
    real = tmp_path / "neuronxcc"
    (real / "nki").mkdir(parents=True)
    (real / "__init__.py").write_text("REAL = True\n")
    (real / "nki" / "__init__.py").write_text("REAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        roots = nki.install_alias()
        assert roots == ("nki",)  # neuronxcc is real: not aliased
        import neuronxcc.nki
        assert getattr(neuronxcc.nki, "REAL", False)
        import nki.language as aliased_nl
        assert aliased_nl is nl
    finally:
        nki.uninstall_alias()
        for name in [n for n in sys.modules if n == "neuronxcc" or n.startswith("neuronxcc.")]:
            del sys.modules[name]


# ---- the API table of docs/kernels.md -----------------------------------------------------------------

def _table_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "nki_api_table.py"
    spec = importlib.util.spec_from_file_location("nki_api_table", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_api_table_matches_the_code():
    t = _table_script()
    rows = t.status()
    modules = {"nki": nki, "nki.language": nl, "nki.isa": nisa, "nki.compiler": nki.compiler}
    for mod, name, _, ok, reason in rows:
        if ok:  # every name claimed supported exists (and is not None)
            obj = modules[mod]
            for part in name.split("."):
                obj = getattr(obj, part)
            assert obj is not None, (mod, name)
        else:
            assert reason and "no reason recorded" not in reason, (mod, name)
    assert t.main(["--check"]) == 0, "docs/kernels.md's table is stale: python scripts/nki_api_table.py --write"
