"""FlexAttention (``torch.nn.attention.flex_attention``) on the neuron device.

PyTorch 2.13 runs FlexAttention on a list of devices and decides what to do
with it by asking whether a device is named ``"cpu"``. Three places need an
answer for neuron; each is listed in :data:`PATCHES`. The first two are
applied by :func:`enable` and undone by :func:`disable`; the lowering
(``INDUCTOR_PATCH``) is applied only while a neuron graph compiles, with
Inductor's other changes (:data:`torchneuron.compile.inductor.COMPILE_PATCHES`).
Each answers differently from PyTorch only for neuron tensors:

* ``torch.nn.attention.flex_attention._validate_device`` rejects devices outside
  ``{"cuda", "cpu", "xpu", "hpu", "mps"}`` with a ``ValueError``; it accepts
  neuron tensors, with autograd (on the CPU, 2.13 refuses inputs that require grad).
* The operator ``torch.ops.higher_order.flex_attention`` gets a kernel for
  neuron's autograd key (``DispatchKey.AutogradPrivateUse1``, through the
  operator's own ``py_impl`` registry). When the log-sum-exp is needed (inputs
  that require grad, ``return_aux``/``return_lse``, or grad mode on), it runs
  PyTorch's dense implementation of the operator (``sdpa_dense``, what eager
  CUDA runs) as ordinary differentiable ops: autograd derives the backward
  pass eagerly, and under ``torch.compile`` AOTAutograd traces these ops, so
  Inductor generates the forward and backward kernels like any other. Otherwise
  it defers to PyTorch's kernel.
* Inductor's lowering of the operator sends CPU inputs to the CPU's C++ template
  (``lower_cpu``) and every other device to the Triton template. Neuron inputs
  get the C++ template: a compiled ``flex_attention`` that needs no
  log-sum-exp (``torch.no_grad()``, ``torch.inference_mode()``) is one fused C++
  kernel on device memory, the CPU's kernel, which uses the block mask's sparsity.

:func:`enable` runs at ``import torchneuron``.

Example::

    >>> from torch.nn.attention.flex_attention import flex_attention, create_block_mask
    >>> mask = create_block_mask(lambda b, h, q, kv: q >= kv, 1, 1, 128, 128, device="neuron")
    >>> out = flex_attention(q, k, v, block_mask=mask)                     # eager, autograd works
    >>> out = torch.compile(flex_attention)(q, k, v, block_mask=mask)      # training: generated kernels
    >>> with torch.no_grad():
    ...     out = torch.compile(flex_attention)(q, k, v, block_mask=mask)  # the CPU's C++ template
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Optional

import torch

from .._patch import Patch, PatchSet, Replacement, attribute

__all__ = ["PATCHES", "Patch", "disable", "enable", "is_enabled"]

log = logging.getLogger("torchneuron")

DEVICE = "neuron"



PATCHES: tuple[Patch, ...] = (
    Patch("torch.nn.attention.flex_attention._validate_device",
          "accepts neuron tensors, with autograd (eager runs PyTorch's dense implementation); "
          "other devices get PyTorch's check"),
    Patch("torch.ops.higher_order.flex_attention.py_kernels[DispatchKey.AutogradPrivateUse1]",
          "a neuron flex_attention that needs the log-sum-exp runs PyTorch's dense implementation as "
          "differentiable ops (eager and compiled training); otherwise PyTorch's autograd kernel"),
    Patch("torch._inductor.lowering.lowerings[torch.ops.higher_order.flex_attention]",
          "lowers a neuron flex_attention with the CPU's C++ template (output only, as on the CPU); "
          "other devices get PyTorch's lowering; in force only while a neuron graph compiles"),
)

_lock = threading.RLock()
_eager: Optional[PatchSet] = None  # the first two PATCHES, built by the first enable()


def _validate_device(original: Callable[..., None]) -> Callable[..., None]:
    def validate_device(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        if query.device.type == DEVICE:
            return  # q, k and v are on one device (checked before); autograd runs the dense backward
        original(query, key, value)

    validate_device.__wrapped__ = original  # type: ignore[attr-defined]
    validate_device.__doc__ = f"``{original.__module__}._validate_device``, accepting neuron tensors."
    return validate_device


def _lowering(original: Callable[..., Any]) -> Callable[..., Any]:
    from torch._inductor.kernel.flex.flex_cpu import lower_cpu

    def flex_attention(query, key, value, subgraph, block_mask, scale, kernel_options, *other_buffers):
        if query.get_device().type != DEVICE:
            return original(query, key, value, subgraph, block_mask, scale, kernel_options, *other_buffers)
        if kernel_options.get("OUTPUT_LOGSUMEXP") or kernel_options.get("OUTPUT_MAX"):
            # The autograd kernel above turns such calls into dense ops before they reach Inductor.
            raise NotImplementedError(
                "flex_attention on neuron: Inductor's C++ template computes the attention output only, and this "
                "graph asks for the log-sum-exp; it reached Inductor without passing neuron's autograd kernel "
                "(is torchneuron.compile.flex_attention disabled?).")
        return lower_cpu(query, key, value, subgraph, block_mask, scale, kernel_options, *other_buffers)

    flex_attention.__wrapped__ = original  # type: ignore[attr-defined]
    return flex_attention


def _autograd_kernel(original: Callable[..., Any]) -> Callable[..., Any]:
    from torch._higher_order_ops.flex_attention import sdpa_dense

    def flex_attention_autograd_neuron(query, key, value, score_mod, block_mask, scale, kernel_options,
                                       score_mod_other_buffers=(), mask_mod_other_buffers=()):
        if not kernel_options.get("OUTPUT_LOGSUMEXP") and not kernel_options.get("OUTPUT_MAX"):
            return original(query, key, value, score_mod, block_mask, scale, kernel_options,
                            score_mod_other_buffers, mask_mod_other_buffers)
        from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex  # Dynamo: not at import

        with TransformGetItemToIndex():
            return sdpa_dense(query, key, value, score_mod, block_mask, scale, kernel_options,
                              score_mod_other_buffers, mask_mod_other_buffers)

    flex_attention_autograd_neuron.__wrapped__ = original  # type: ignore[attr-defined]
    return flex_attention_autograd_neuron


def _set_kernel(op: Any, key: Any, kernel: Any) -> None:
    """``op.py_kernels[key] = kernel`` (None: no entry); the operator caches its dispatch: cleared."""
    if kernel is None:
        op.py_kernels.pop(key, None)
    else:
        op.py_kernels[key] = kernel
    op._dispatch_cache.clear()


def _autograd_patch(op: Any, autograd: Callable[..., Any]) -> Replacement:
    """The second of :data:`PATCHES`: ``op``'s PrivateUse1 autograd kernel, which dispatch then reaches."""
    from torch._C import DispatchKey

    key = DispatchKey.AutogradPrivateUse1

    def apply() -> Callable[[], None]:
        keys, original = op.non_fallthrough_keys, op.py_kernels.get(key)
        op.non_fallthrough_keys = keys.add(key)
        try:
            _set_kernel(op, key, _autograd_kernel(original if original is not None else autograd))
        except BaseException:
            op.non_fallthrough_keys = keys
            raise

        def undo() -> None:
            _set_kernel(op, key, original)
            op.non_fallthrough_keys = keys

        return undo

    return Replacement(PATCHES[1], apply)


def enable() -> None:
    """Run ``flex_attention`` on neuron tensors, eagerly and through AOTAutograd (the first two :data:`PATCHES`).

    Idempotent.
    """
    global _eager
    from torch.nn.attention import flex_attention as fa

    try:
        from torch._higher_order_ops.flex_attention import flex_attention, flex_attention_autograd
    except ImportError:  # another PyTorch: leave FlexAttention as it is rather than fail at import
        log.debug("FlexAttention on neuron: torch._higher_order_ops.flex_attention differs, not enabled")
        return
    if not hasattr(fa, "_validate_device"):
        log.debug("FlexAttention on neuron: no _validate_device in torch.nn.attention.flex_attention, not enabled")
        return
    with _lock:
        if _eager is None:
            _eager = PatchSet("FlexAttention on neuron", (
                attribute(fa, "_validate_device", _validate_device, PATCHES[0].what, target=PATCHES[0].target),
                _autograd_patch(flex_attention, flex_attention_autograd),
            ))
        if not _eager.active:
            _eager.apply()


def _flex_attention_key() -> list[Any]:
    return [torch.ops.higher_order.flex_attention]


def _inductor_patch() -> Any:
    from torch._inductor import lowering

    from .. import _patch

    return _patch.item(lowering.lowerings, _flex_attention_key, _lowering, PATCHES[2].what, target=PATCHES[2].target)


def is_enabled() -> bool:
    """Whether the first two :data:`PATCHES` are applied (the third is applied only while a neuron graph compiles)."""
    return _eager is not None and _eager.active


def disable() -> None:
    """Put back every replaced attribute, last applied first."""
    with _lock:
        if _eager is not None:
            _eager.reset()


def __getattr__(name: str) -> Any:
    if name == "INDUCTOR_PATCH":  # built on use: it needs Inductor, which loads at the first compile
        return _inductor_patch()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
