"""Fused attention forward: softmax(q k^T * scale) v per head, with an optional causal mask, tile by tile
(the online softmax of flash attention): the scores of a [128, 128] block never leave the chip.

q, k and v are [heads, seqlen, d_head] in HBM, d_head <= 128, seqlen a multiple of the tile (128, or
seqlen itself when shorter). Per block: TensorE for q k^T, the transpose of the probabilities and
p v (accumulated in PSUM); GpSimd for the causal mask (``nisa.affine_select``); VectorE for the
running max and sum; ScalarE for the exponentials (``nisa.activation`` with the max as bias).

    python examples/kernels/attention.py
"""

import math

import torch

import torchneuron  # noqa: F401
import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


@nki.jit
def attention_fwd(q, k, v, causal: bool = True, scale: float = 0.0):
    """softmax(q k^T * scale (+ causal mask)) v; scale 0 means 1/sqrt(d_head)."""
    heads, seqlen, d_head = q.shape
    tile = min(nl.tile_size.pmax, seqlen)
    if seqlen % tile or d_head > nl.tile_size.pmax:
        raise ValueError(f"attention_fwd: seqlen {seqlen} must be a multiple of {tile} and d_head {d_head} <= 128")
    scale = scale or 1.0 / math.sqrt(d_head)
    out = nl.ndarray(q.shape, dtype=q.dtype, buffer=nl.shared_hbm)
    i_q, i_k = nl.arange(tile)[:, None], nl.arange(tile)[None, :]
    for h in nl.affine_range(heads):
        for i in nl.affine_range(seqlen // tile):
            q_t = nl.load_transpose2d(q[h, i * tile:(i + 1) * tile, :])           # [d_head, tile]: stationary
            running_max = nl.full((tile, 1), -math.inf, nl.float32)
            running_sum = nl.zeros((tile, 1), nl.float32)
            acc = nl.zeros((tile, d_head), nl.float32)
            for j in nl.sequential_range(i + 1 if causal else seqlen // tile):
                k_t = nl.load_transpose2d(k[h, j * tile:(j + 1) * tile, :])       # [d_head, tile]: moving
                scores = nisa.nc_matmul(q_t, k_t)                                  # [tile q, tile k] in PSUM
                scores = nisa.tensor_scalar(scores, nl.multiply, scale, dtype=nl.float32)
                if causal and j == i:
                    scores = nisa.affine_select(i_q - i_k >= 0, scores, -math.inf)
                new_max = nl.maximum(running_max, nl.max(scores, axis=1, keepdims=True))
                probs = nisa.activation(op=nl.exp, data=scores, bias=-new_max)    # exp(s - max) on ScalarE
                correction = nl.exp(running_max - new_max)
                running_sum = running_sum * correction + nl.sum(probs, axis=1, keepdims=True)
                probs_t = nl.copy(nisa.nc_transpose(probs), dtype=v.dtype)        # [tile k, tile q]
                v_tile = nl.load(v[h, j * tile:(j + 1) * tile, :])                # [tile k, d_head]
                acc = acc * correction + nisa.nc_matmul(probs_t, v_tile)          # [tile q, d_head]
                running_max = new_max
            nl.store(out[h, i * tile:(i + 1) * tile, :], value=nl.divide(acc, running_sum, dtype=q.dtype))
    return out


def main():
    q, k, v = (torch.randn(4, 256, 64, device="neuron") for _ in range(3))
    for causal in (True, False):
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.testing.assert_close(attention_fwd(q, k, v, causal), want, rtol=1e-4, atol=1e-5)
    qb, kb, vb = (t.bfloat16() for t in (q, k, v))
    torch.testing.assert_close(attention_fwd(qb, kb, vb),
                               torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, is_causal=True),
                               rtol=2e-2, atol=2e-2)
    print("attention_fwd equals scaled_dot_product_attention;", attention_fwd.estimate(qb, kb, vb, target="trn2"))


if __name__ == "__main__":
    main()
