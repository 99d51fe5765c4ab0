"""AWS's RMSNorm tutorial: rows in tiles of 128 partitions, the last tile masked, the weight broadcast
across partitions. ``eps`` (0 in the tutorial) makes it ``torch.nn.functional.rms_norm``.

    python examples/kernels/rmsnorm.py
"""

import math

import torch

import torchneuron  # noqa: F401
import torchneuron.nki as nki
import torchneuron.nki.language as nl


@nki.jit
def rmsnorm(a_tensor, g_tensor, eps: float = 0.0):
    """a * rsqrt(mean(a^2, row) + eps) * g for a [rows, n], g [n]."""
    out_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
    ix = nl.arange(128)[:, None]
    iw = nl.arange(1)[:, None]
    iy = nl.arange(a_tensor.shape[1])[None, :]
    num_rows = a_tensor.shape[0]
    g_tile = nl.load(g_tensor.reshape((1, g_tensor.shape[0]))[iw, iy])
    for i in nl.affine_range(math.ceil(num_rows / 128)):
        a_tile = nl.load(a_tensor[i * 128 + ix, iy], mask=(i * 128 + ix < num_rows))
        square_sum = nl.sum(nl.square(a_tile), axis=[1])
        rms_reciprocal = nl.rsqrt(square_sum / a_tensor.shape[1] + eps)
        out_tile = nl.multiply(a_tile, rms_reciprocal)
        g_bcast = g_tile.broadcast_to((128, g_tensor.shape[0]))
        out_tile[...] = nl.multiply(out_tile, g_bcast, mask=(i * 128 + ix < num_rows))
        nl.store(out_tensor[i * 128 + ix, iy], value=out_tile, mask=(i * 128 + ix < num_rows))
    return out_tensor


def main():
    a, g = torch.randn(300, 256, device="neuron"), torch.randn(256, device="neuron")  # 300 rows: a masked tile
    torch.testing.assert_close(rmsnorm(a, g), a * torch.rsqrt(a.square().mean(1, keepdim=True)) * g)
    torch.testing.assert_close(rmsnorm(a, g, 1e-6), torch.nn.functional.rms_norm(a, (256,), g, 1e-6))
    print("rmsnorm equals PyTorch's;", rmsnorm.estimate(a, g, target="trn2"))


if __name__ == "__main__":
    main()
