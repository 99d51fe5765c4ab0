"""torchneuron's compatibility module for the import name ``torch_neuronx``.

accelerate (1.15) and transformers (5.24) support a native PyTorch backend for
NeuronCores, the device ``"neuron"``. They decide that it is there when
``importlib.util.find_spec("torch_neuronx")`` finds a module and
``torch.neuron.is_available()`` is true; asked to check the device, they import
the module and call ``torch.neuron.device_count()``. Everything they do after
that goes through PyTorch: the device ``"neuron"``, the functions of
``torch.neuron`` in :data:`TORCH_NEURON_CALLS`, the ``torch.distributed``
backend ``"neuron"`` and the ``torch.compile`` backend ``"neuron"``. torchneuron
provides all of these; this module provides the name. Importing it (as
``import torch_neuronx``, through the top-level shim of that name) loads
torchneuron and changes nothing in PyTorch.

With it installed, unchanged programs run on the neuron device::

    >>> from transformers import TrainingArguments
    >>> TrainingArguments(output_dir="out").device
    device(type='neuron', index=0)
    >>> from accelerate import Accelerator
    >>> Accelerator().device
    device(type='neuron', index=0)

and ``accelerate launch --num_processes 2`` or ``torchrun --nproc-per-node 2``
gives accelerate's ``DistributedType.MULTI_NEURON`` on the ``neuron`` process
group, one neuron device per process (``neuron:LOCAL_RANK``).

This is not AWS's torch-neuronx package, and does not stand in for it:
``__version__`` names torchneuron, and the APIs of that package that compile
for or describe a particular chip (``trace``, ``DataParallel``,
``move_trace_to_device``, ``experimental``, ``utils.get_platform_target``,
``xla_impl``, ``parallel_compile``, which optimum-neuron uses) are absent and
raise ``AttributeError`` saying so. optimum-neuron also reads the installed
distribution's version, ``importlib.metadata.version("torch_neuronx")``, which
finds none here, so it does not take this for a Trainium or Inferentia
machine. transformers' XLA path (``is_torch_neuroncore_available``) needs
``torch_xla`` as well and stays off. Do not install both packages in one
environment: they share the import name.
"""

from __future__ import annotations

import torchneuron

__all__ = ["__version__", "TORCH_NEURON_CALLS", "DISTRIBUTED_BACKEND", "COMPILE_BACKEND", "DEVICE_TYPE"]

#: torchneuron's version with a local label that says whose module this is (PEP 440, so it parses).
__version__ = f"{torchneuron.__version__}+torchneuron.compat"

#: The device type the libraries use once they have found this module.
DEVICE_TYPE = "neuron"

#: The functions of ``torch.neuron`` that accelerate and transformers call, and where (read in their
#: sources). torchneuron's ``torch.neuron`` has each one; ``tests/test_integrations_hf.py`` checks it.
TORCH_NEURON_CALLS: dict[str, str] = {
    "is_available": "accelerate utils/imports.py is_neuron_available; transformers utils/import_utils.py "
                    "is_torch_neuron_available",
    "device_count": "the same, with check_device=True; accelerate test_utils/testing.py",
    "current_device": "accelerate state.py set_device (the device of MULTI_NEURON), utils/dataclasses.py (FSDP)",
    "set_device": "transformers training_args.py _setup_devices (one process: neuron:0)",
    "manual_seed_all": "accelerate utils/random.py set_seed",
    "get_rng_state": "accelerate utils/random.py synchronize_rng_state",
    "set_rng_state": "accelerate utils/random.py synchronize_rng_state",
    "get_rng_state_all": "accelerate checkpointing.py save_accelerator_state",
    "set_rng_state_all": "accelerate checkpointing.py load_accelerator_state",
    "empty_cache": "accelerate utils/memory.py clear_device_cache (Trainer's torch_empty_cache_steps)",
    "memory_allocated": "accelerate test_utils (peak memory tests)",
    "max_memory_allocated": "accelerate test_utils (peak memory tests)",
    "is_bf16_supported": "transformers utils/import_utils.py is_torch_bf16_gpu_available (bf16=True)",
}

#: The ``torch.distributed`` backend accelerate's MULTI_NEURON initializes (accelerate state.py
#: _prepare_backend; transformers distributed/utils.py DISTRIBUTED_BACKEND_MAP). torchneuron registers it.
DISTRIBUTED_BACKEND = "neuron"

#: The ``torch.compile`` backend transformers chooses on neuron (training_args.py with torch_compile=True;
#: modeling_utils.py for generation). torchneuron registers it.
COMPILE_BACKEND = "neuron"

# AWS's package has these; they trace, compile or place programs for a particular chip, and
# optimum-neuron calls them. Asked for here, they fail with the reason instead of a bare AttributeError.
_CHIP_APIS = ("trace", "DataParallel", "move_trace_to_device", "experimental", "utils", "xla_impl",
              "parallel_compile", "dynamic_batch", "replace_weights")


def __getattr__(name: str):
    if name in _CHIP_APIS:
        raise AttributeError(
            f"torch_neuronx.{name} is not provided: this torch_neuronx is torchneuron's compatibility module, "
            f"which lets accelerate and transformers find the 'neuron' device, not AWS's torch-neuronx package "
            f"and its chip-specific APIs. Run the model on torch.device('neuron') as it is, or compile it with "
            f"torch.compile(model, backend='neuron').")
    raise AttributeError(f"module 'torch_neuronx' (torchneuron's compatibility module) has no attribute '{name}'")

