"""Mixed precision on neuron: ``torch.neuron.amp.autocast`` and ``GradScaler``."""

import functools

import torch

__all__ = ["GradScaler", "autocast"]


class autocast(torch.amp.autocast):
    """``torch.autocast("neuron", ...)``.

    Args:
        enabled: whether autocasting is on.
        dtype: ``torch.bfloat16`` (default) or ``torch.float16``.
        cache_enabled: whether casted weights are cached inside the region.
    """

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.bfloat16, cache_enabled: bool = True):
        super().__init__("neuron", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


GradScaler = functools.partial(torch.amp.GradScaler, "neuron")
GradScaler.__doc__ = """``torch.amp.GradScaler("neuron", ...)``: loss scaling for float16 training."""
