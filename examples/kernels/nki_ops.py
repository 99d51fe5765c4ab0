"""The example kernels as PyTorch ops: ``nki_examples::rms_norm`` and ``nki_examples::attention``.

Each is a ``torch.library`` custom op (through ``nki_op``) whose forward is an NKI kernel and whose
backward is PyTorch's formula (registered with ``register_autograd``), so it trains, compiles as one
graph node and passes ``torch.library.opcheck``.
"""

import math

import torch

from torchneuron.nki import nki_op

from attention import attention_fwd
from rmsnorm import rmsnorm


@nki_op("nki_examples::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``torch.nn.functional.rms_norm(x, (n,), weight, eps)`` over the last axis, by the RMSNorm kernel."""
    n = x.shape[-1]
    return rmsnorm(x.reshape(-1, n).contiguous(), weight.contiguous(), eps).reshape(x.shape)


def _rms_setup(ctx, inputs, output):
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _rms_backward(ctx, grad):
    x, weight = ctx.saved_tensors
    rstd = torch.rsqrt(x.float().square().mean(-1, keepdim=True) + ctx.eps)
    xhat = x.float() * rstd
    gw = grad.float() * weight.float()
    dx = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
    dweight = (grad.float() * xhat).reshape(-1, x.shape[-1]).sum(0)
    return dx.to(x.dtype), dweight.to(weight.dtype), None


rms_norm.register_autograd(_rms_backward, setup_context=_rms_setup)


@nki_op("nki_examples::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> torch.Tensor:
    """``scaled_dot_product_attention(q, k, v, is_causal=is_causal)`` for [batch, heads, seqlen, d_head]."""
    b, h, t, d = q.shape
    flat = [z.reshape(b * h, t, d).contiguous() for z in (q, k, v)]
    return attention_fwd(*flat, is_causal).reshape(b, h, t, d)


def _attention_setup(ctx, inputs, output):
    q, k, v, is_causal = inputs
    ctx.save_for_backward(q, k, v, output)
    ctx.is_causal = is_causal


def _attention_backward(ctx, grad):
    q, k, v, out = ctx.saved_tensors
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-1, -2)) * scale
    if ctx.is_causal:
        t = q.shape[-2]
        causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    dv = probs.transpose(-1, -2) @ grad
    dprobs = grad @ v.transpose(-1, -2)
    dscores = probs * (dprobs - (grad * out).sum(-1, keepdim=True))
    return dscores @ k * scale, dscores.transpose(-1, -2) @ q * scale, dv, None


attention.register_autograd(_attention_backward, setup_context=_attention_setup)
