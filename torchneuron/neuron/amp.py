"""Mixed precision on neuron: ``torch.neuron.amp.autocast`` and ``GradScaler``."""

import torch

__all__ = ["GradScaler", "autocast"]


class autocast(torch.amp.autocast):
    """``torch.autocast("neuron", ...)``.

    Args:
        enabled: whether autocasting is on.
        dtype: ``torch.float16`` (default, as ``torch.cuda.amp.autocast``) or ``torch.bfloat16``.
        cache_enabled: whether casted weights are cached inside the region.
    """

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True):
        super().__init__("neuron", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler("neuron", ...)``: loss scaling for float16 training.

    A class (as ``torch.cuda.amp.GradScaler`` is), so ``isinstance`` checks and subclassing work.

    Args:
        init_scale: the initial scale factor.
        growth_factor: factor the scale grows by after ``growth_interval`` finite steps.
        backoff_factor: factor the scale shrinks by after a step with inf/NaN gradients.
        growth_interval: number of finite steps between growths.
        enabled: whether scaling is on.
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True) -> None:
        super().__init__("neuron", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)
