"""The record of one change torchneuron makes to another library's attribute.

Every such change (the CUDA compatibility layer, FlexAttention on neuron,
Lightning's accelerator) is listed as data, applied in a scope, and undone when
the scope ends; each module publishes its list as ``PATCHES`` of these.
"""

from dataclasses import dataclass

__all__ = ["Patch"]


@dataclass(frozen=True)
class Patch:
    """One attribute replaced.

    Args:
        target: the dotted name of the replaced attribute, e.g. ``"torch.Tensor.to"``.
        what: what the replacement does.
    """

    target: str
    what: str
