"""AWS's matrix-multiplication tutorial: one tile, then tiled over M, N and K, then with the loads
hoisted out of the inner loop (the step the cost estimate rewards: the tiled kernel is DMA-bound).

    python examples/kernels/matmul.py
"""

import torch

import torchneuron  # noqa: F401
import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


@nki.jit
def matmul_basic(lhsT, rhs):
    """lhsT.T @ rhs for lhsT [K <= 128, M <= 128] and rhs [K, N <= 512]: one TensorE instruction."""
    result = nl.ndarray((lhsT.shape[1], rhs.shape[1]), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    lhs_tile = nl.ndarray(lhsT.shape, dtype=lhsT.dtype, buffer=nl.sbuf)
    rhs_tile = nl.ndarray(rhs.shape, dtype=rhs.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=lhs_tile, src=lhsT)
    nisa.dma_copy(dst=rhs_tile, src=rhs)
    result_psum = nl.ndarray(result.shape, dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(result_psum, lhs_tile, rhs_tile)
    result_sbuf = nl.ndarray(result_psum.shape, dtype=result.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=result_sbuf, src=result_psum)
    nisa.dma_copy(dst=result, src=result_sbuf)
    return result


@nki.jit
def matmul_tiled(lhsT, rhs):
    """Any multiple of the tile sizes: [128, 512] PSUM tiles accumulated over K in steps of 128."""
    K, M = lhsT.shape
    _, N = rhs.shape
    TM, TK, TN = nl.tile_size.gemm_stationary_fmax, nl.tile_size.pmax, nl.tile_size.gemm_moving_fmax
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // TM):
        for n in nl.affine_range(N // TN):
            res_psum = nl.ndarray((TM, TN), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TK):
                lhsT_tile = nl.ndarray((TK, TM), dtype=lhsT.dtype, buffer=nl.sbuf)
                rhs_tile = nl.ndarray((TK, TN), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=lhsT_tile, src=lhsT[k * TK:(k + 1) * TK, m * TM:(m + 1) * TM])
                nisa.dma_copy(dst=rhs_tile, src=rhs[k * TK:(k + 1) * TK, n * TN:(n + 1) * TN])
                nisa.nc_matmul(dst=res_psum, stationary=lhsT_tile, moving=rhs_tile)
            res_sb = nl.ndarray(res_psum.shape, dtype=result.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res_sb, src=res_psum)
            nisa.dma_copy(dst=result[m * TM:(m + 1) * TM, n * TN:(n + 1) * TN], src=res_sb)
    return result


@nki.jit
def matmul_hoisted(lhsT, rhs):
    """The tiled kernel with the loads hoisted out of the inner loop (the tutorial's first optimization):
    a column of lhsT tiles once per m, a column of rhs tiles once per (m, n), then the K matmuls."""
    K, M = lhsT.shape
    _, N = rhs.shape
    TM, TK, TN = nl.tile_size.gemm_stationary_fmax, nl.tile_size.pmax, nl.tile_size.gemm_moving_fmax
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // TM):
        lhsT_tiles = []  # a new list per m, as the tutorial builds it
        for k in nl.affine_range(K // TK):
            lhsT_tiles.append(nl.load(lhsT[k * TK:(k + 1) * TK, m * TM:(m + 1) * TM]))
        for n in nl.affine_range(N // TN):
            rhs_tiles = []
            for k in nl.affine_range(K // TK):
                rhs_tiles.append(nl.load(rhs[k * TK:(k + 1) * TK, n * TN:(n + 1) * TN]))
            res_psum = nl.ndarray((TM, TN), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TK):
                nisa.nc_matmul(dst=res_psum, stationary=lhsT_tiles[k], moving=rhs_tiles[k])
            nl.store(result[m * TM:(m + 1) * TM, n * TN:(n + 1) * TN], value=nl.copy(res_psum, dtype=result.dtype))
    return result


def main():
    for dtype, tol in ((torch.float32, dict(rtol=1e-5, atol=1e-4)), (torch.bfloat16, dict(rtol=2e-2, atol=5e-2))):
        lhsT = torch.randn(128, 64, device="neuron", dtype=dtype)
        rhs = torch.randn(128, 512, device="neuron", dtype=dtype)
        torch.testing.assert_close(matmul_basic(lhsT, rhs), (lhsT.float().t() @ rhs.float()).to(dtype), **tol)
        lhsT = torch.randn(256, 256, device="neuron", dtype=dtype)
        rhs = torch.randn(256, 1024, device="neuron", dtype=dtype)
        want = (lhsT.float().t() @ rhs.float()).to(dtype)
        torch.testing.assert_close(matmul_tiled(lhsT, rhs), want, **tol)
        torch.testing.assert_close(matmul_hoisted(lhsT, rhs), want, **tol)
    lhsT = torch.randn(1024, 1024, device="neuron", dtype=torch.bfloat16)
    rhs = torch.randn(1024, 1024, device="neuron", dtype=torch.bfloat16)
    print("matmul_tiled:  ", matmul_tiled.estimate(lhsT, rhs, target="trn2"))
    print("matmul_hoisted:", matmul_hoisted.estimate(lhsT, rhs, target="trn2"))


if __name__ == "__main__":
    main()
