"""Inductor's per-device config for neuron: it carries the version of the neuron code generators.

Inductor hashes a device's config into its FX graph and AOTAutograd cache
keys, so a graph cached by another version of
:mod:`torchneuron.compile.inductor` is never reused.
"""

import sys

from torch.utils._config_module import install_config_module

# Hash of the sources of the code generators (inductor.py, aoti.py, flex_attention.py; set by registration.py).
codegen_version: str = ""

# The vector instruction set Inductor's C++ kernels are generated for (set when it registers).
# Inductor's FX graph cache keys leave it out: a process in which the instruction set check
# failed would store scalar kernels that every later process reuses, about twice as slow
# (the small CNN's training step: 32 ms instead of 15 ms).
vec_isa: str = ""

# Check the sizes and strides of a forward graph's inputs when it is called. Dynamo's guards check
# them already before every call of a compiled frame, so backend="neuron" turns this off; graphs
# AOTAutograd feeds itself (backward graphs) keep their checks either way.
forward_input_asserts: bool = True

install_config_module(sys.modules[__name__])
