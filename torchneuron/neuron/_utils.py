"""Device arguments as the ``torch.neuron`` functions accept them."""

from typing import Any

import torch

from .. import _C


def _get_device_index(device: Any = None, optional: bool = True) -> int:
    """Return the neuron device index of ``device`` (int, str, torch.device or None).

    Args:
        device: ``None`` (the current device when ``optional``), an index,
            ``"neuron"``, ``"neuron:1"`` or a ``torch.device``.
        optional: whether ``None`` or a device without index means the current device.
    """
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "neuron":
            raise ValueError(f"Expected a neuron device, but got: {device}")
        device = device.index
    if device is None:
        if not optional:
            raise ValueError("Expected a neuron device with an index, but got none")
        return _C._current_device()
    if isinstance(device, bool) or not isinstance(device, int):
        raise TypeError(f"Expected a device index, a device string or a torch.device, but got {device!r}")
    _C._check_device(device)
    return device
