"""AWS's LayerNorm tutorial (the nl version): mean and variance per row on VectorE, rsqrt on ScalarE,
the weight and bias loaded once and broadcast across the 128 partitions.

    python examples/kernels/layernorm.py
"""

import torch

import torchneuron  # noqa: F401
import torchneuron.nki as nki
import torchneuron.nki.language as nl


@nki.jit
def layernorm(x, gamma, beta, eps: float = 1e-5):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    n = x.shape[1]
    g = nl.load(gamma.reshape((1, n))).broadcast_to((128, n))
    b = nl.load(beta.reshape((1, n))).broadcast_to((128, n))
    for i in nl.affine_range(x.shape[0] // 128):
        t = nl.load(x[i * 128:(i + 1) * 128, :])
        mean = nl.mean(t, axis=1, keepdims=True)
        centered = nl.subtract(t, mean)
        var = nl.mean(nl.square(centered), axis=1, keepdims=True)
        y = nl.multiply(centered, nl.rsqrt(var + eps))
        nl.store(out[i * 128:(i + 1) * 128, :], value=y * g + b)
    return out


def main():
    x = torch.randn(256, 384, device="neuron")
    gamma, beta = torch.randn(384, device="neuron"), torch.randn(384, device="neuron")
    torch.testing.assert_close(layernorm(x, gamma, beta), torch.nn.functional.layer_norm(x, (384,), gamma, beta),
                               rtol=1e-4, atol=1e-4)
    print("layernorm equals F.layer_norm;", layernorm.estimate(x, gamma, beta, target="trn2"))


if __name__ == "__main__":
    main()
