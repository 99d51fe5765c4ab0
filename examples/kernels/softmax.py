"""Row softmax of a [128 * k, N] tensor, max-subtracted: VectorE for the max and the sum, ScalarE for
the exponential (with the negated max as its bias, as the fused attention tutorial does).

    python examples/kernels/softmax.py
"""

import torch

import torchneuron  # noqa: F401
import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


@nki.jit
def softmax(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // 128):
        t = nl.load(x[i * 128:(i + 1) * 128, :])
        m = nl.max(t, axis=1, keepdims=True)
        e = nisa.activation(op=nl.exp, data=t, bias=-m)
        s = nisa.tensor_reduce(nl.add, e, axis=1, keepdims=True)
        nl.store(out[i * 128:(i + 1) * 128, :], value=nisa.tensor_scalar(e, nl.divide, s))
    return out


def main():
    x = torch.randn(256, 384, device="neuron")
    torch.testing.assert_close(softmax(x), torch.softmax(x, 1))
    print("softmax equals torch.softmax;", softmax.estimate(x, target="trn2"))


if __name__ == "__main__":
    main()
