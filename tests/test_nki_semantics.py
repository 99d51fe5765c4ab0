"""NKI semantics AWS's reference kernels rely on: views of views indexed down to a partition column,
[P, 1] operands of [P] tiles, reductions of unsigned 32-bit tiles, 16-bit PSUM tiles (TensorE's transpose
mode from trn2 on, its bfloat16 results on trn3), a matmul's first ``+=`` into PSUM writing it, helper
kernels inlined into their caller, and ``nl.loop_reduce``. Kernels written here, each checked against
PyTorch on the CPU."""

import numpy as np
import pytest
import torch

import torchneuron  # noqa: F401
import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


@pytest.fixture(autouse=True)
def interpreted(monkeypatch):
    monkeypatch.setenv("TORCHNEURON_NKI_REPLAY", "0")


def test_a_column_view_indexed_again_at_its_unit_axis():
    # AWS's flash attention passes `l_buffer[:, i]` to a helper that reads and writes `l[:, 0]`.
    @nki.jit
    def bump_column(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        col = t[:, 3]  # [128]: the same elements as [128, 1]
        col[:, 0] = nl.add(col[:, 0], 1.0)
        nl.store(out, value=t)
        return out

    x = torch.randn(128, 8)
    want = x.clone()
    want[:, 3] += 1.0
    torch.testing.assert_close(bump_column(x.to("neuron")).cpu(), want)

    @nki.jit
    def past_the_unit_axis(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        nl.store(out, value=t[:, 3][:, 1])
        return out

    with pytest.raises(IndexError):
        past_the_unit_axis(x.to("neuron"))


def test_a_per_partition_operand_of_a_column():
    # exp(-l + m) with l a [128] column and m a [128, 1] tile: per partition, not an outer sum.
    @nki.jit
    def scale(l, m):
        out = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        lt, mt = nl.load(l), nl.load(m)
        e = nisa.activation(nl.exp, lt[:, 2], bias=mt, scale=-1.0)
        nl.store(out, value=e)
        return out

    l, m = torch.randn(128, 4), torch.randn(128, 1)
    torch.testing.assert_close(scale(l.to("neuron"), m.to("neuron")).cpu(), torch.exp(-l[:, 2:3] + m))


def test_unsigned_32_bit_reductions_are_exact():
    @nki.jit
    def reduce_u32(x):
        out = nl.ndarray((128, 3), dtype=nl.uint32, buffer=nl.shared_hbm)
        t = nl.load(x)
        r = nl.ndarray((128, 3), dtype=nl.uint32, buffer=nl.sbuf)
        r[:, 0:1] = nl.min(t, axis=1, dtype=nl.uint32, keepdims=True)
        r[:, 1:2] = nl.max(t, axis=1, dtype=nl.uint32, keepdims=True)
        r[:, 2:3] = nisa.tensor_reduce(nl.add, t, axis=1, dtype=nl.uint32, keepdims=True)
        nl.store(out, value=r)
        return out

    wide = torch.randint(0, 2**32, (128, 16), dtype=torch.int64)  # values past int32's range too
    got = reduce_u32(wide.to(torch.uint32).to("neuron")).cpu().to(torch.int64)
    want = torch.stack([wide.amin(1), wide.amax(1), wide.sum(1) % 2**32], dim=1)
    torch.testing.assert_close(got, want)


def _transpose16(target):
    @nki.jit(platform_target=target)
    def transpose16(x):  # a float16 transpose through TensorE's transpose mode into a float16 PSUM tile
        out = nl.ndarray((128, 128), dtype=nl.float16, buffer=nl.shared_hbm)
        t = nl.load(x)
        identity = nl.load(nl.shared_identity_matrix(128, dtype=nl.float16))
        tp = nl.ndarray((128, 128), dtype=nl.float16, buffer=nl.psum)
        tp[...] = nisa.nc_matmul(t, identity, is_transpose=True)
        nl.store(out, value=nl.copy(tp))
        return out
    return transpose16


def test_a_16_bit_transpose_into_a_16_bit_psum_tile_from_trn2_on():
    x = torch.randn(128, 128, dtype=torch.float16)
    for target in ("trn2", "trn3"):
        torch.testing.assert_close(_transpose16(target)(x.to("neuron")).cpu(), x.T, rtol=0, atol=0)
    with pytest.raises(TypeError, match="TensorE writes float32 into PSUM"):  # trn1: transposes come out float32
        _transpose16("trn1")(x.to("neuron"))


def _bf16_matmul(target):
    @nki.jit(platform_target=target)
    def mm(a, b):  # a: [K, M], b: [K, N], accumulated over two K tiles in a bfloat16 PSUM tile
        out = nl.ndarray((128, 256), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        acc = nl.ndarray((128, 256), dtype=nl.bfloat16, buffer=nl.psum)
        for k in nl.affine_range(2):
            acc += nisa.nc_matmul(nl.load(a[k * 128:(k + 1) * 128, :]), nl.load(b[k * 128:(k + 1) * 128, :]))
        nl.store(out, value=nl.copy(acc))
        return out
    return mm


def test_bfloat16_matmul_results_in_psum_on_trn3_only():
    a, b = torch.randn(256, 128, dtype=torch.bfloat16), torch.randn(256, 256, dtype=torch.bfloat16)
    got = _bf16_matmul("trn3")(a.to("neuron"), b.to("neuron")).cpu()
    # each partial product is rounded to bfloat16 as written into PSUM, the sum taken in float32
    first = (a[:128].float().T @ b[:128].float()).bfloat16()
    second = a[128:].float().T @ b[128:].float()
    torch.testing.assert_close(got, (first.float() + second).bfloat16(), rtol=0, atol=0)
    with pytest.raises(TypeError, match="TensorE writes float32 into PSUM"):
        _bf16_matmul("trn2")(a.to("neuron"), b.to("neuron"))


def test_other_engines_write_16_bit_psum_tiles():
    @nki.jit
    def through_psum(x):
        out = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
        p = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.psum)
        p[...] = nl.multiply(nl.load(x), 2.0)  # VectorE into PSUM
        nl.store(out, value=nl.copy(p))
        return out

    x = torch.randn(128, 64)
    torch.testing.assert_close(through_psum(x.to("neuron")).cpu(), (x * 2.0).bfloat16())


def test_the_first_matmul_added_into_unwritten_psum_writes_it():
    @nki.jit
    def mm(a, b):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray((1, nl.par_dim(128), 512), dtype=nl.float32, buffer=nl.psum)  # never zeroed
        for k in nl.affine_range(4):
            acc[0] += nisa.nc_matmul(nl.load(a[k * 128:(k + 1) * 128, :]), nl.load(b[k * 128:(k + 1) * 128, :]))
        nl.store(out, value=nl.copy(acc[0]))
        return out

    a, b = torch.randn(512, 128), torch.randn(512, 512)
    torch.testing.assert_close(mm(a.to("neuron"), b.to("neuron")).cpu(), a.T @ b, rtol=1e-4, atol=1e-4)


@nki.jit(mode="trace")
def _scale_rows_into(dst, src, factor):  # a helper kernel, as AWS's reference kernels write them
    dst[...] = nl.multiply(src, factor * (nl.program_id(axis=0) + 1))


def test_a_helper_kernel_runs_in_its_callers_program():
    @nki.jit
    def scaled(x):  # program p scales its rows by 2 * (p + 1)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        p = nl.program_id(axis=0)
        t = nl.load(x[p])
        r = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.sbuf)
        _scale_rows_into(r, t, 2.0)
        nl.store(out[p], value=r)
        return out

    x = torch.randn(3, 128, 64)
    want = x * torch.tensor([2.0, 4.0, 6.0]).reshape(3, 1, 1)
    with nki.record_calls() as calls:
        got = scaled[3](x.to("neuron")).cpu()
    torch.testing.assert_close(got, want)
    # one kernel call: the helper's instructions are the caller's, one multiply per program
    assert len(calls) == 1 and [i.name for i in calls[0].instructions].count("multiply") == 3


def test_loop_reduce_accumulates_into_its_destination():
    @nki.jit
    def column_sums(x):  # x: [4, 128, 64]; the sum and the max over the first axis
        out = nl.ndarray((2, 128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((2, nl.par_dim(128), 64), dtype=nl.float32, buffer=nl.sbuf)
        acc[1] = nl.full((128, 64), -1e30, dtype=nl.float32)
        for i in nl.affine_range(4):
            t = nl.load(x[i])
            acc[0, :, :] = nl.loop_reduce(t, op=np.add, loop_indices=(i,), dtype=nl.float32)
            acc[1, :, :] = nl.loop_reduce(t, op=np.maximum, loop_indices=(i,), dtype=nl.float32)
        nl.store(out[0], value=acc[0])
        nl.store(out[1], value=acc[1])
        return out

    x = torch.randn(4, 128, 64)
    got = column_sums(x.to("neuron")).cpu()
    torch.testing.assert_close(got, torch.stack([x.sum(0), x.amax(0)]))


def test_a_masked_instructions_result_assigned_leaves_the_rest():
    # `dst[...] = nisa.affine_select(..., mask=m)`: the instruction writes dst where its mask holds; where it
    # does not (a False mask: not at all) dst keeps its values, as AWS's flash attention relies on.
    @nki.jit
    def select_some(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        i_p, i_f = nl.mgrid[0:128, 0:64]
        t[...] = nisa.affine_select(pred=(i_p >= i_f), on_true_tile=t, on_false_value=-1.0, dtype=nl.float32,
                                    mask=False)  # skipped
        t[...] = nl.multiply(t, 2.0, mask=(i_f < 32))  # columns 0..31 doubled, 32..63 kept
        nl.store(out, value=t)
        return out

    x = torch.randn(128, 64)
    want = x.clone()
    want[:, :32] *= 2.0
    torch.testing.assert_close(select_some(x.to("neuron")).cpu(), want)
