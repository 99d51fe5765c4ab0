"""The exponential of the kernels' ScalarE (``nl.exp``, ``nisa.activation(op=nl.exp)``, ``nisa.exponential``):
float32 ``exp`` computed by Inductor's own generated CPU code, in the interpreter and in the replay.

ATen's ``exp`` (in PyTorch's x86 builds, MKL's vector math) and the ``exp`` Inductor generates
(``at::vec::Vectorized<float>::exp``, SLEEF's ``expf_u10``: at most 1 ulp from the exact value) differ
in the last bit for about one element in ten, and Inductor's is about three times faster on the host.
So the interpreter computes a float32 ``exp`` with an Inductor kernel compiled once per device (for
a 1-D tensor of any length: every element, the tail included, goes through the same vector function;
a tail is a masked vector load), as the custom op ``nki_exact::vec_exp``. A replayed kernel's graph
then lets Inductor fuse that ``exp`` with the ops around it (it computes the same function of each
element); if the first compiled run differs from the interpreter's anyway (code Inductor does not
vectorize calls ``std::exp``), the graph keeps ``nki_exact::vec_exp`` as a call of this same kernel
(:mod:`torchneuron.nki._replay`).

Other dtypes, tensors that require grad and devices other than the CPU and neuron take ATen's ``exp``;
so does every call if the kernel cannot be compiled (logged once).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Dict, Optional

import torch

log = logging.getLogger("torchneuron")

_LIB = torch.library.Library("nki_exact", "FRAGMENT")
_LIB.define("vec_exp(Tensor x) -> Tensor")

_KERNELS: Dict[torch.device, Optional[Callable]] = {}  # device -> the compiled kernel (None: it did not compile)
_LOCK = threading.Lock()
_DEVICES = ("cpu", "neuron")


def _compile(device: torch.device) -> Callable:
    """Inductor's code for ``aten.exp`` of a contiguous 1-D float32 tensor of any length on ``device`` (its
    outputs are allocated on the device it was compiled for: one kernel per device)."""
    from torch._guards import TracingContext, tracing
    from torch.fx.experimental.proxy_tensor import make_fx

    sample = torch.empty(64, dtype=torch.float32, device=device)
    with torch.no_grad():
        gm = make_fx(lambda x: torch.ops.aten.exp.default(x), tracing_mode="symbolic")(sample)
    examples = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    if device.type == "cpu":
        from torch._inductor.compile_fx import compile_fx as compile_graph
    else:
        from torchneuron.compile.dynamo_backend import neuron as compile_graph
    with torch.no_grad(), tracing(TracingContext(examples[0].fake_mode)):
        return compile_graph(gm, examples)


def _kernel(device: torch.device) -> Optional[Callable]:
    found = _KERNELS.get(device, False)
    if found is not False:
        return found
    with _LOCK:
        found = _KERNELS.get(device, False)
        if found is False:
            try:
                found = _compile(device)
            except Exception as e:  # noqa: BLE001  (no compiler: ATen's exp, the same in interpreter and replay)
                log.warning("nki: the vectorized exp did not compile on %s (%s: %s); nl.exp uses ATen's exp",
                            device, type(e).__name__, e)
                found = None
            _KERNELS[device] = found
    return found


def _vec_exp(x: torch.Tensor) -> torch.Tensor:
    kernel = _kernel(x.device)
    if kernel is None:
        return torch.exp(x)
    with torch.no_grad():
        out = kernel(x.contiguous().view(-1))
    out = out[0] if isinstance(out, (tuple, list)) else out
    return out.view(x.shape)


def _fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


_LIB.impl("vec_exp", _vec_exp, "CPU")
_LIB.impl("vec_exp", _vec_exp, "PrivateUse1")
torch.library.register_fake("nki_exact::vec_exp", _fake, lib=_LIB)

#: The op, as graphs hold it.
vec_exp = torch.ops.nki_exact.vec_exp.default


def exp(x: torch.Tensor) -> torch.Tensor:
    """``exp`` of ``x``: a float32 tensor through :data:`vec_exp`, anything else through ATen's ``exp``."""
    if x.dtype is not torch.float32 or x.device.type not in _DEVICES or (x.requires_grad and torch.is_grad_enabled()):
        return torch.exp(x)
    return vec_exp(x)
