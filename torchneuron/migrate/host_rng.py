"""Random numbers of neuron ops drawn from the CPU generator, for run-to-run comparisons.

A CUDA program run with CUDA mapped to the CPU draws every random number (weight
init on the host, dropout on the "device") from the one CPU generator. Run on
neuron, its device ops draw from the neuron generator's Philox stream instead
(as they would from CUDA's), so the two runs see different dropout masks even
though both are correct. Inside
:class:`HostRNGMode`, random ops on neuron tensors run on the CPU with the CPU
generator and their results are copied back, so the neuron run draws exactly the
numbers the CPU run draws. Only ``torchneuron parity`` (and tests) use it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

__all__ = ["HostRNGMode"]

_SEEDED: dict[Any, bool] = {}


def _is_seeded(func: Any) -> bool:
    seeded = _SEEDED.get(func)
    if seeded is None:
        seeded = _SEEDED[func] = torch.Tag.nondeterministic_seeded in func.tags
    return seeded


def _neuron_device(args: tuple, kwargs: dict) -> torch.device | None:
    device = kwargs.get("device")
    if device is not None and torch.device(device).type == "neuron":
        return torch.device(device)
    for a in tree_flatten((args, kwargs))[0]:
        if isinstance(a, torch.Tensor) and a.device.type == "neuron":
            return a.device
    return None


class HostRNGMode(TorchDispatchMode):
    """Run random ops on neuron tensors with the CPU generator (those given a generator are left alone)."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True  # torch.compile keeps compiling; its graphs draw as they would

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not _is_seeded(func) or kwargs.get("generator") is not None:
            return func(*args, **kwargs)
        device = _neuron_device(args, kwargs)
        if device is None:
            return func(*args, **kwargs)

        originals: dict[int, torch.Tensor] = {}

        def to_cpu(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and x.device.type == "neuron":
                y = x.cpu()
                originals[id(y)] = x
                return y
            return x

        cpu_args, cpu_kwargs = tree_map(to_cpu, (args, kwargs))
        if "device" in cpu_kwargs:
            cpu_kwargs["device"] = torch.device("cpu")
        out = func(*cpu_args, **cpu_kwargs)

        written: dict[int, torch.Tensor] = {}
        schema_args = func._schema.arguments
        for i, spec in enumerate(schema_args):
            if spec.alias_info is None or not spec.alias_info.is_write:
                continue
            cpu_value = cpu_args[i] if i < len(cpu_args) else cpu_kwargs.get(spec.name)
            if isinstance(cpu_value, torch.Tensor) and id(cpu_value) in originals:
                original = originals[id(cpu_value)]
                if original.shape != cpu_value.shape:  # an out= argument the op resized
                    original.resize_(cpu_value.shape)
                original.copy_(cpu_value)
                written[id(cpu_value)] = original

        def back(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                return written.get(id(x)) if id(x) in written else x.to(device)
            return x

        return tree_map(back, out)
