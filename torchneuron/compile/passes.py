"""Inductor's graph pass for the neuron device: rewrites of the post-grad graph.

Convolutions on the device run the CPU's oneDNN kernels, which are fastest in
the channels-last layout. PyTorch, however, fixes the layout of
``aten.convolution``'s output on an out-of-tree device to the one it derives for
such backends (contiguous), so a compiled graph that keeps its activations
channels-last, as Inductor does for convolutional models, would convert each
convolution's output back. :class:`ChannelsLastConvolutions` replaces the 2-d
convolutions of neuron graphs with ``torchneuron::convolution_channels_last``,
the same computation whose output stays channels-last. The op is tagged
``needs_exact_strides`` and the pass records channels-last input and weight as
the values it expects, so the kernels that produce them write that layout, and
those that read its output read it. Graph outputs keep the layout eager
mode gives them (Inductor restores the strides it recorded before the passes).

In a training graph the tensors saved for the backward pass keep the new
layout: AOTAutograd lays out the backward graph's inputs with the strides the
compiled forward graph gave them. The pass is registered as the device's
custom pass (``register_backend_for_device``), so both ``torch.compile``
entry points use it, and its ``uuid`` is part of the cache keys.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphModulePass, get_hash_for_files

__all__ = ["ChannelsLastConvolutions", "CHANNELS_LAST_DTYPES"]

aten = torch.ops.aten

# Dtypes for which the CPU picks channels-last oneDNN kernels (not float64).
CHANNELS_LAST_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@torch.library.register_fake("torchneuron::convolution_channels_last")
def _convolution_channels_last_fake(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                                    groups):
    out = aten.convolution.default(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                                   groups)
    return out.contiguous(memory_format=torch.channels_last)


def _eligible(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or node.target is not aten.convolution.default:
        return False
    x, w = (a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in node.args[:2])
    return (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor) and x.device.type == "neuron"
            and x.dim() == 4 and w.dim() == 4 and x.dtype in CHANNELS_LAST_DTYPES)


class ChannelsLastConvolutions(CustomGraphModulePass):
    """Run the 2-d convolutions of neuron graphs channels-last (see the module docstring)."""

    def __call__(self, gm: torch.fx.GraphModule) -> None:
        for node in gm.graph.nodes:
            if not _eligible(node):
                continue
            val: Any = node.meta.get("val")
            fake_mode = torch._guards.detect_fake_mode([val])
            if fake_mode is None:
                continue
            node.target = torch.ops.torchneuron.convolution_channels_last.default
            with fake_mode:
                node.meta["val"] = val.contiguous(memory_format=torch.channels_last)
                # The layout the op's arguments must arrive in (the op is tagged needs_exact_strides):
                # channels-last input and weight, so the kernels producing them write that layout.
                fake_args = [a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in node.args]
                for i in (0, 1):
                    fake_args[i] = fake_args[i].contiguous(memory_format=torch.channels_last)
                node.meta["eager_input_vals"] = (tuple(fake_args), {})

    def uuid(self) -> bytes:
        return get_hash_for_files((__file__,))
