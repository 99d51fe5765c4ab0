"""CUDA-only code that `torchneuron migrate` must leave alone and list. Never run by the tests."""

import os

import cupy
import torch
import triton
import triton.language as tl
from torch.utils.cpp_extension import load_inline

os.environ["CUDA_VISIBLE_DEVICES"] = "0"


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


ext = load_inline("my_ext", cpp_sources="", cuda_sources="__global__ void k() {}")


def step(model, x, device):
    if device.type == "cuda":            # a comparison only a person can rewrite
        torch.cuda.nvtx.range_push("step")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = model(x)
    start = torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda.nvtx.range_pop()
    return y, cupy.asarray(x), torch.cuda.get_device_properties(0).major
