"""Neuron kernels for vLLM's catch-all CPU ops. These rely on host-addressable device memory.

vLLM registers most of its CPU ops for the CPU dispatch key; on neuron tensors
those reach torchneuron's fallback, which runs them on device memory seen as
CPU tensors. A few (the CPU attention ops and the oneDNN matmul's handle) are
registered as catch-alls (``CompositeImplicitAutograd``) and would receive
neuron tensors directly, outside any kernel launch. This file gives each an
explicit ``PrivateUse1`` kernel that runs vLLM's kernel as device work on the
tensors' device (``torchneuron._C._launch``), where the emulated NeuronCore's
memory may be read and written by the host.

This file belongs with the kernel library under ``csrc/aten`` (CPU kernels run on
device memory), which a port to real silicon replaces together with the runtime
and ``csrc/aten/host_addressable`` (docs/runtime.md, "What a port replaces"): its
kernels would run these ops on the device, not hand the device's memory to host
code.
"""

from __future__ import annotations

import logging

import torch

__all__ = ["OPS", "register"]

logger = logging.getLogger("torchneuron")

#: vLLM's catch-all ops that receive neuron tensors: ``_C::name``.
OPS = (
    "cpu_attn_reshape_and_cache",
    "cpu_attention_with_kv_cache",
    "get_scheduler_metadata",
    "create_onednn_mm_handler",
    "create_onednn_scaled_mm_handler",
)

_library = None


def _device_of(args) -> int:
    for a in args:
        if isinstance(a, torch.Tensor) and a.device.type == "neuron":
            return a.device.index
    return torch.neuron.current_device()


def _kernel(name: str, op: torch._ops.OpOverload):
    from torchneuron import _C

    implicit = torch._C.DispatchKey.CompositeImplicitAutograd
    call = op._op_dk
    launch_name = f"vllm::{name}"

    def kernel(*args):
        return _C._launch(launch_name, _device_of(args), call, implicit, *args)

    kernel.__name__ = name
    return kernel


def register() -> list[str]:
    """Register the neuron kernels of :data:`OPS` (once per process); return the ops registered."""
    global _library
    if _library is not None:
        return list(_library._neuron_ops)
    library = torch.library.Library("_C", "IMPL")
    done = []
    for name in OPS:
        packet = getattr(torch.ops._C, name, None)
        if packet is None:
            continue
        op = packet.default
        if not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
            continue  # registered for the CPU key: torchneuron's fallback runs it
        library.impl(name, _kernel(name, op), "PrivateUse1")
        done.append(name)
    library._neuron_ops = done
    _library = library
    logger.info("vLLM: neuron kernels for %s", ", ".join(done))
    return done
