"""``torch_neuronx``: torchneuron's compatibility module under the import name Hugging Face looks for.

accelerate and transformers use the native ``neuron`` device when a module
named ``torch_neuronx`` exists; this one loads torchneuron and adds nothing
that pretends to be a chip. It is not AWS's torch-neuronx package. The code
and its documentation are in :mod:`torchneuron.integrations.torch_neuronx`.
"""

from torchneuron.integrations.torch_neuronx import (  # noqa: F401
    COMPILE_BACKEND,
    DEVICE_TYPE,
    DISTRIBUTED_BACKEND,
    TORCH_NEURON_CALLS,
    __all__,
    __getattr__,
    __version__,
)
