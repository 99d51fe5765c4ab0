"""``torch.distributed`` on neuron devices: the ``neuron`` c10d backend.

Importing torchneuron registers the backend, so that any of these work::

    >>> torch.distributed.init_process_group("neuron")
    >>> torch.distributed.init_process_group(device_id=torch.device("neuron", local_rank))
    >>> torch.distributed.init_process_group("cpu:gloo,neuron:neuron")

Collectives on neuron tensors run through gloo on the device memory itself
(no staging copies): every ``torch.distributed`` collective, point-to-point
operation and barrier, with ``async_op=True`` work handles, DDP, FSDP2
(``fully_shard``), DTensor and ``torch.distributed.checkpoint``. Each rank uses
``neuron:LOCAL_RANK``; see ``docs/distributed.md``.
"""

import logging

import torch
import torch.distributed as dist

__all__ = ["BACKEND_NAME", "DEVICE_SHARING_ENV", "create_backend", "register", "register_kernels", "select_device",
           "is_available"]


def is_available() -> bool:
    """Return whether the neuron backend can run: PyTorch has gloo and a neuron device exists."""
    return dist.is_available() and dist.is_gloo_available() and torch.neuron.device_count() > 0


if dist.is_available() and dist.is_gloo_available():
    from .backend import BACKEND_NAME, DEVICE_SHARING_ENV, create_backend, register, register_kernels, select_device

    try:
        register()
    except Exception:  # never let the backend's registration break `import torch`
        logging.getLogger("torchneuron").warning("could not register the neuron distributed backend",
                                                 exc_info=True)
