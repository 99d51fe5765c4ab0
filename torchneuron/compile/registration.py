"""Inductor's registration for the neuron device, once: its code generators (the Python wrapper and
the scheduling of :mod:`torchneuron.compile.inductor`, the C++ wrapper of
:mod:`torchneuron.compile.aoti`), its device calls and Dynamo's device interface.

Inductor looks the code generators up on ``torch.neuron`` at its first compile, which imports this
module; ``backend="neuron"`` imports it up front. The modules it registers import nothing of it.
"""

from __future__ import annotations

import functools
import hashlib

import torch
from torch._dynamo import device_interface as _di
from torch._inductor.codegen import common as _common
from torch._inductor.codegen.wrapper_fxir import WrapperFxCodegen
from torch._inductor.cpu_vec_isa import pick_vec_isa

from . import _cache, _codegen_config, aoti, diagnostics, flex_attention, inductor


@functools.cache
def register() -> None:
    """Register Inductor's code generators, device calls and Dynamo's interface for the neuron device (once).

    Registration uses PyTorch's own registries and changes nothing for other
    devices; the changes to Inductor's functions (:data:`inductor.PATCHES`) apply only
    inside a neuron compile.
    """
    _cache.apply()
    diagnostics.install()
    # PyTorch's own devices first, whichever compile comes first: the order of the registered device
    # passes is part of every graph's FX cache key, a CPU graph's included.
    _common.init_backend_registration()
    digest = hashlib.sha256()
    # the code generators (Python and C++ wrappers) and the FlexAttention lowering
    for module in (inductor, aoti, flex_attention):
        with open(module.__file__, "rb") as source:
            digest.update(source.read())
    _codegen_config.codegen_version = digest.hexdigest()[:16]
    _codegen_config.vec_isa = str(pick_vec_isa())
    device = inductor.DEVICE
    _di.register_interface_for_device(device, inductor.NeuronInterface)
    for i in range(torch.neuron.device_count()):
        _di.register_interface_for_device(f"{device}:{i}", inductor.NeuronInterface)
    _common.register_device_op_overrides(device, inductor.NeuronDeviceOpOverrides())
    # Every compile's end (Dynamo's frames and AOTAutograd's lazy backward graphs, also failed ones)
    # ends a scope a neuron graph opened.
    from torch._dynamo.callback import callback_handler

    callback_handler.register_end_callback(inductor.end_graph)
    if _common.get_scheduling_for_device(device) is None:
        _common.register_backend_for_device(device, inductor.Scheduling, inductor.NeuronPythonWrapperCodegen,
                                            aoti.NeuronCppWrapper, WrapperFxCodegen,
                                            device_custom_pass=inductor.NeuronGraphPass(),
                                            device_custom_config=_codegen_config)


register()
