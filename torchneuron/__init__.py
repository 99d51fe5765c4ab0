"""torchneuron: PyTorch on NeuronCore accelerators.

Importing the package registers the ``neuron`` device with PyTorch; PyTorch
does so by itself at ``import torch`` through the ``torch.backends`` entry
point (set ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` to turn that off). Without a
NeuronCore driver the device is an emulated NeuronCore whose kernels run on
the host CPU.

Example::

    >>> import torch
    >>> x = torch.ones(3, device="neuron")
    >>> (x * 2).cpu()
    tensor([2., 2., 2.])
"""



def _autoload() -> None:
    """Entry point PyTorch calls at ``import torch``; importing the package does the work.

    Defined before ``import torch``: when torchneuron is imported first, PyTorch's
    autoload finds this module half-initialized and calls this function.
    """


import torch  # noqa: E402

from . import _C  # noqa: F401  (registers allocator, guard, hooks and kernels)
from . import _patch  # noqa: E402

if _C._strict_mode():
    # TORCHNEURON_STRICT=1: a host access to device memory outside the runtime stops the process;
    # faulthandler then prints the Python stack of the access after the runtime's message.
    import faulthandler

    if not faulthandler.is_enabled():
        faulthandler.enable()
    _C._install_strict_fault_handler()

from .version import __version__  # noqa: E402
__all__ = ["neuron", "__version__"]


def _register() -> None:
    """Name PrivateUse1 ``neuron`` and attach ``torch.neuron`` and ``.neuron()`` methods."""
    if torch._C._get_privateuse1_backend_name() != "neuron":
        torch.utils.rename_privateuse1_backend("neuron")
    from . import neuron

    if getattr(torch, "neuron", None) is not neuron:
        torch._register_device_module("neuron", neuron)
    if not hasattr(torch.Tensor, "is_neuron"):
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
        )


def _accelerators_with_autograd_threads() -> list[str]:
    """The other accelerators of this process whose backward ops PyTorch runs on device threads.

    Asked without creating a device context: on a build without the device the
    answer is immediate.
    """
    found = []
    for name in ("cuda", "xpu", "mps"):
        module = getattr(torch, name, None)
        try:
            if module is not None and module.is_available():
                found.append(name)
        except Exception:  # a broken driver is not ours to report here
            continue
    return found


def _run_backward_on_calling_thread() -> None:
    """Let backward passes over neuron tensors run on the thread that calls ``backward()``.

    PyTorch's autograd engine runs the backward ops of an accelerator on a
    thread of its own per device, which suits a device that the host only
    feeds. The emulated NeuronCore's kernels run on the host's cores, and a
    second thread running them gets OpenMP thread teams of its own next to the
    calling thread's: with more threads than cores, OpenMP stops spinning
    between parallel regions, and every region waits for its threads to wake.
    A compiled MLP training step took 8.2-8.4 ms that way against 5.5 ms for
    the same step on the CPU, and 5.5 ms with backward on the calling thread
    (2 cores, 2 threads). So the importing thread turns autograd's per-device
    threads off (``torch.autograd.set_multithreading_enabled(False)``, which
    changes nothing for CPU tensors); ``TORCHNEURON_AUTOGRAD_THREADS=1`` keeps
    PyTorch's behaviour. Other threads keep PyTorch's default unless they
    call that function themselves.

    The switch cannot be made for neuron alone: PyTorch's engine
    (``Engine::ready_queue`` in torch/csrc/autograd/engine.cpp) sends a node to
    the caller's queue when the thread's multithreading flag is off or its
    device type is CPU, Meta or Lazy, and otherwise to the device thread of its
    device *index*, one thread shared by every accelerator type (neuron:0 and
    cuda:0 run on the same one). So when another accelerator is present (CUDA,
    XPU or MPS), the flag stays on for it, and a backward pass whose roots are
    neuron tensors turns it off for its own duration instead
    (:data:`AUTOGRAD_PATCHES`: ``torch.autograd``'s ``_engine_run_backward``, the
    one function ``backward()`` and ``torch.autograd.grad`` call from Python).
    """
    import logging
    import os

    if os.environ.get("TORCHNEURON_AUTOGRAD_THREADS", "0") == "1":
        return
    others = _accelerators_with_autograd_threads()
    if others:
        logging.getLogger("torchneuron").info(
            "autograd device threads left on for %s; neuron backward passes turn them off for themselves",
            ", ".join(others))
        AUTOGRAD_PATCHES.apply()
        return
    torch.autograd.set_multithreading_enabled(False)


def _neuron_roots_on_calling_thread(original):
    def _engine_run_backward(t_outputs, *args, **kwargs):
        roots = t_outputs if isinstance(t_outputs, (tuple, list)) else (t_outputs,)
        if torch.autograd.is_multithreading_enabled() and any(
                isinstance(t, torch.Tensor) and t.device.type == "neuron" for t in roots):
            with torch.autograd.set_multithreading_enabled(False):
                return original(t_outputs, *args, **kwargs)
        return original(t_outputs, *args, **kwargs)

    _engine_run_backward.__wrapped__ = original
    return _engine_run_backward


#: Applied at import only when another accelerator with autograd device threads is present.
AUTOGRAD_PATCHES = _patch.PatchSet("neuron backward on the calling thread", (
    _patch.attribute(torch.autograd.graph, "_engine_run_backward", _neuron_roots_on_calling_thread,
                     "a backward pass whose roots are neuron tensors runs on the calling thread "
                     "(set_multithreading_enabled(False) for its duration); others as PyTorch runs them",
                     bindings="torch.autograd"),
))


_register()
_run_backward_on_calling_thread()

from . import neuron  # noqa: E402
from . import compile as _compile  # noqa: E402,F401  (TORCHNEURON_CACHE_DIR, TORCHNEURON_COMPILE_LOG; loads no compiler)
from . import distributed  # noqa: E402,F401  (registers the "neuron" torch.distributed backend)


def _compile_fused_group(*args):
    """Fused eager's graph compiler (torchneuron.compile.fused), loaded at the first group it compiles."""
    from .compile import fused

    return fused.compile_group(*args)


def _fused_expect(key, ops):
    """Fused eager's pay-off rule: what compiling a group should cost and save (torchneuron.compile.fused)."""
    from .compile import fused

    return fused.expect(key, ops)


def _fused_learned(*args):
    from .compile import fused

    fused.learned(*args)


_C._set_fused_compiler(_compile_fused_group)
_C._set_fused_policy(_fused_expect, _fused_learned)
neuron.eager._from_env()  # TORCHNEURON_EAGER=fused

from .migrate import _env  # noqa: E402,F401  (TORCHNEURON_TRANSFER_CUDA=1: the CUDA compatibility layer)
from .integrations import lightning as _lightning  # noqa: E402,F401  (registers "neuron" with Lightning when it is imported; imports no Lightning)
