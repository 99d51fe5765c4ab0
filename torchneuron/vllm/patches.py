"""The changes torchneuron makes to vLLM's behaviour on neuron, listed in :data:`PATCHES`.

Two of vLLM's CPU paths allocate a tensor without ``device=``, so on any device
but the CPU they get a host tensor next to device tensors. Both are upstream
bugs (the fix is the ``device=`` argument), and both are replaced here by
versions that allocate where their inputs are:

* ``vllm._custom_ops.onednn_mm``: the oneDNN matmul's output;
* ``TopKTopPSampler.forward_cpu``: the per-row seeds of the Gumbel-max sampler,
  drawn from the default generator of the logits' device, and from a request's
  own generator (a ``torch.Generator`` on the device) for seeded requests.

The set is applied by the worker when it starts (:func:`apply`) and undone when
it shuts down (:func:`undo`), also when a change fails half-way.
"""

from __future__ import annotations

import torch

from .._patch import PatchSet, attribute

__all__ = ["PATCHES", "apply", "undo"]

_patches = None


def _onednn_mm(original):
    def onednn_mm(dnnl_handler, x: torch.Tensor, bias):
        out = torch.empty((*x.shape[:-1], dnnl_handler.n), dtype=x.dtype, device=x.device)
        torch.ops._C.onednn_mm(out, x.reshape(-1, dnnl_handler.k), bias, dnnl_handler.handler_tensor)
        return out

    onednn_mm.__wrapped__ = original
    return onednn_mm


def _forward_cpu(original):
    from vllm.v1.sample.ops.topk_topp_sampler import (
        apply_top_k_top_p,
        empty_exponential_noise_like,
        sample_with_exponential_noise,
    )

    def forward_cpu(self, logits: torch.Tensor, generators: dict, k, p):
        if logits.device.type == "cpu":
            return original(self, logits, generators, k, p)
        logits = apply_top_k_top_p(logits, k, p)
        processed = None
        if self.logprobs_mode == "processed_logits":
            processed = logits
        elif self.logprobs_mode == "processed_logprobs":
            processed = logits.log_softmax(dim=-1, dtype=torch.float32)
        if self.use_fp64_gumbel:
            probs = logits.softmax(dim=-1, dtype=torch.float32)
            noise = empty_exponential_noise_like(probs, self.use_fp64_gumbel)
            noise.exponential_()
            for row, generator in generators.items():
                noise[row].exponential_(generator=generator)
            return sample_with_exponential_noise(probs, noise), processed
        device = logits.device
        seeds = torch.randint(0, 2**31, (logits.shape[0],), dtype=torch.long, device=device)
        for row, generator in generators.items():
            seeds[row] = torch.randint(0, 2**31, (1,), generator=generator, dtype=torch.long,
                                       device=generator.device)[0].to(device)
        return torch.ops._C.fused_gumbel_argmax(logits.to(torch.float32), seeds), processed

    forward_cpu.__wrapped__ = original
    return forward_cpu


def _build() -> PatchSet:
    import vllm._custom_ops as ops
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    return PatchSet("vLLM on neuron", (
        attribute(ops, "onednn_mm", _onednn_mm,
                  "the oneDNN matmul's output is allocated on its input's device (upstream: no device=)",
                  bindings="vllm"),
        attribute(TopKTopPSampler, "forward_cpu", _forward_cpu,
                  "the Gumbel-max sampler's seeds are drawn on the logits' device, a seeded request's from its "
                  "own device generator (upstream: no device=)"),
    ))


def __getattr__(name: str):
    if name == "PATCHES":  # built on use: it imports vLLM
        global _patches
        if _patches is None:
            _patches = _build()
        return _patches
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def apply() -> None:
    """Apply :data:`PATCHES` (nesting counts; the outermost :func:`undo` ends them)."""
    __getattr__("PATCHES").apply()


def undo() -> None:
    """End one :func:`apply`."""
    __getattr__("PATCHES").undo()
