"""AWS's tensor-addition tutorial, in both of NKI's styles: loops over [128, 512] tiles, and a grid of
programs with one tile each.

    python examples/kernels/tensor_add.py
"""

import torch

import torchneuron  # noqa: F401  (the neuron device)
import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


@nki.jit
def tensor_add(a_input, b_input):
    """c = a + b: DMA in, one VectorE add per tile, DMA out (the current NKI style, destinations first)."""
    c_output = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
    M, N = a_input.shape
    for m in nl.affine_range(M // 128):
        for n in nl.affine_range(N // 512):
            a_tile = nl.ndarray((128, 512), dtype=a_input.dtype, buffer=nl.sbuf)
            b_tile = nl.ndarray((128, 512), dtype=b_input.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=a_tile, src=a_input[m * 128:(m + 1) * 128, n * 512:(n + 1) * 512])
            nisa.dma_copy(dst=b_tile, src=b_input[m * 128:(m + 1) * 128, n * 512:(n + 1) * 512])
            c_tile = nl.ndarray((128, 512), dtype=a_input.dtype, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=c_tile, data1=a_tile, data2=b_tile, op=nl.add)
            nisa.dma_copy(dst=c_output[m * 128:(m + 1) * 128, n * 512:(n + 1) * 512], src=c_tile)
    return c_output


@nki.jit
def tensor_add_grid(a_input, b_input):
    """The same on a grid of programs, one [128, 512] tile each (the earlier style): tensor_add_grid[M // 128, N // 512]."""
    c_output = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
    i, j = nl.program_id(0), nl.program_id(1)
    ix, iy = nl.mgrid[0:128, 0:512]
    a = nl.load(a_input[i * 128 + ix, j * 512 + iy])
    b = nl.load(b_input[i * 128 + ix, j * 512 + iy])
    nl.store(c_output[i * 128 + ix, j * 512 + iy], value=a + b)
    return c_output


def main():
    a, b = torch.randn(256, 1024, device="neuron"), torch.randn(256, 1024, device="neuron")
    torch.testing.assert_close(tensor_add(a, b), a + b, rtol=0, atol=0)
    torch.testing.assert_close(tensor_add_grid[2, 2](a, b), a + b, rtol=0, atol=0)
    print("tensor_add equals a + b;", tensor_add.estimate(a, b, target="trn2"))


if __name__ == "__main__":
    main()
