"""NumPy arrays of tensors, as AWS's host harness returns them (``nki.simulate_kernel`` and the like, and
``nl.static_cast`` of an array on the host)."""

from __future__ import annotations

import torch

from . import _dtypes


def numpy_of(t: torch.Tensor, what: str):
    """A CPU tensor as a numpy array; bfloat16 and fp8 as ml_dtypes' types (AWS's NumPy bfloat16 and fp8) when
    ml_dtypes is installed, else widened to float32 (exact) with a warning in the log."""
    return _dtypes.to_numpy(t, what)
