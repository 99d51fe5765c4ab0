"""Inductor's graph pass for the neuron device: rewrites of the post-grad graph.

Convolutions on the device run the CPU's oneDNN kernels, which are fastest in
the channels-last layout. PyTorch, however, fixes the layout of
``aten.convolution``'s output on an out-of-tree device to the one it derives for
such backends (contiguous), so a compiled graph that keeps its activations
channels-last, as Inductor does for convolutional models, would convert each
convolution's output back. :class:`ChannelsLastConvolutions` replaces the 2-d
convolutions of neuron graphs with ``torchneuron::convolution_channels_last``,
the same computation whose output stays channels-last, and their gradients
(``aten.convolution_backward``) with ``torchneuron::convolution_backward_channels_last``.
The ops are tagged ``needs_exact_strides`` and the pass records channels-last
arguments as the values they expect, so the kernels that produce them write
that layout, and those that read the results read it. The new layout is
propagated through the graph's fake values; a flatten of a channels-last
activation gets the contiguous copy eager mode makes of it, written by the
kernel that computes the activation. Graph outputs keep the layout eager mode
gives them (Inductor restores the strides it recorded before the passes).

In a training graph the tensors saved for the backward pass keep the new
layout: AOTAutograd lays out the backward graph's inputs with the strides the
compiled forward graph gave them. The pass is registered as the device's
custom pass (``register_backend_for_device``), so both ``torch.compile``
entry points use it, and its ``uuid`` is part of the cache keys.
"""

from __future__ import annotations

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


@torch.library.register_fake("torchneuron::convolution_backward_channels_last")
def _convolution_backward_channels_last_fake(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                                             transposed, output_padding, groups, output_mask):
    grads = aten.convolution_backward.default(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                                              transposed, output_padding, groups, output_mask)
    return tuple(grad_output.new_empty(0) if g is None else
                 g.contiguous(memory_format=torch.channels_last) if i < 2 else g for i, g in enumerate(grads))


# aten op -> (its channels-last op in torchneuron, the arguments that op expects channels-last).
_SWAPS = {
    aten.convolution.default: ("convolution_channels_last", (0, 1)),
    aten.convolution_backward.default: ("convolution_backward_channels_last", (0, 1, 2)),
}


def _eligible(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or node.target not in _SWAPS:
        return False
    _, args_cl = _SWAPS[node.target]
    tensors = [a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in node.args[:len(args_cl)]]
    return all(isinstance(t, torch.Tensor) and t.device.type == "neuron" and t.dim() == 4
               and t.dtype in CHANNELS_LAST_DTYPES for t in tensors)


def _flattens_channels_last(node: torch.fx.Node) -> bool:
    """Whether ``node`` reshapes a channels-last 4-d tensor to another rank (a copy, as in eager mode)."""
    if node.op != "call_function" or node.target not in (aten.reshape.default, aten.view.default):
        return False
    x = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    return (isinstance(x, torch.Tensor) and x.device.type == "neuron" and x.dim() == 4 and len(node.args[1]) != 4
            and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last))


class ChannelsLastConvolutions(CustomGraphModulePass):
    """Run the 2-d convolutions of neuron graphs and their gradients channels-last (see the module docstring)."""

    def __call__(self, gm: torch.fx.GraphModule) -> None:
        from torch._inductor.fx_utils import FakeTensorUpdater

        convolutions = [node for node in gm.graph.nodes if _eligible(node)]
        if not convolutions:  # (detect_fake_mode would answer the tracing context's mode for no tensors)
            return
        fake_mode = torch._guards.detect_fake_mode([node.args[0].meta["val"] for node in convolutions])
        if fake_mode is None:
            return
        updater = FakeTensorUpdater(gm)
        for node in convolutions:
            name, args_cl = _SWAPS[node.target]
            node.target = getattr(torch.ops.torchneuron, name).default
            with fake_mode:
                # The layout the op's arguments must arrive in (the op is tagged needs_exact_strides):
                # channels-last, so the kernels producing them write that layout.
                fake_args = [a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in node.args]
                for i in args_cl:
                    fake_args[i] = fake_args[i].contiguous(memory_format=torch.channels_last)
                node.meta["eager_input_vals"] = (tuple(fake_args), {})
        # The new layout flows on to the ops that follow (the fake values are computed again).
        updater.incremental_update()
        # A classifier's flatten of a channels-last activation copies it, as eager mode does; an
        # explicit contiguous clone lets Inductor write that copy from the kernel that computes it
        # (e.g. the last max-pool) instead of storing the activation and gathering it again.
        for node in list(gm.graph.nodes):
            if not _flattens_channels_last(node):
                continue
            x = node.args[0]
            with gm.graph.inserting_before(node):
                copy = gm.graph.call_function(aten.clone.default, (x,), {"memory_format": torch.contiguous_format})
            copy.meta["val"] = x.meta["val"].clone(memory_format=torch.contiguous_format)
            node.replace_input_with(x, copy)
        updater.incremental_update()

    def uuid(self) -> bytes:
        return get_hash_for_files((__file__,))
