"""What other libraries need from torchneuron.

* :mod:`torchneuron.integrations.torch_neuronx`: the module behind the import
  name ``torch_neuronx``, by which Hugging Face accelerate and transformers
  find a native neuron device (``docs/ecosystem.md``).

* :mod:`torchneuron.integrations.lightning`: the ``"neuron"`` accelerator of
  Lightning (``Trainer(accelerator="neuron")``), registered when Lightning is
  imported (``docs/ecosystem.md``).

``import torchneuron`` loads the Lightning module, whose import finder waits
for Lightning to be imported and loads none itself; ``torch_neuronx`` is loaded
by the library that looks for it.
"""
