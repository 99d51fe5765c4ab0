"""Inductor's per-device config for neuron: it carries the version of the neuron code generators.

Inductor hashes a device's config into its FX graph and AOTAutograd cache
keys, so a graph cached by another version of
:mod:`torchneuron.compile.inductor` is never reused.
"""

import sys

from torch.utils._config_module import install_config_module

# Hash of the source of torchneuron/compile/inductor.py (set when it registers).
codegen_version: str = ""

# Check the sizes and strides of a forward graph's inputs when it is called. Dynamo's guards check
# them already before every call of a compiled frame, so backend="neuron" turns this off; graphs
# AOTAutograd feeds itself (backward graphs) keep their checks either way.
forward_input_asserts: bool = True

install_config_module(sys.modules[__name__])
