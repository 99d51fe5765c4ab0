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

__version__ = "0.1.0"
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


_register()

from . import neuron  # noqa: E402
from . import compile as _compile  # noqa: E402,F401  (TORCHNEURON_CACHE_DIR, TORCHNEURON_COMPILE_LOG; loads no compiler)
from . import distributed  # noqa: E402,F401  (registers the "neuron" torch.distributed backend)

from .migrate import _env  # noqa: E402,F401  (TORCHNEURON_TRANSFER_CUDA=1: the CUDA compatibility layer)
