"""What other libraries need from torchneuron.

* :mod:`torchneuron.integrations.torch_neuronx`: the module behind the import
  name ``torch_neuronx``, by which Hugging Face accelerate and transformers
  find a native neuron device (``docs/ecosystem.md``).

Nothing here is imported by ``import torchneuron``; each integration is loaded
by the library that looks for it.
"""
