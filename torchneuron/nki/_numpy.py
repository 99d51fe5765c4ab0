"""NumPy arrays of tensors, as AWS's host harness returns them (``nki.simulate_kernel`` and the like, and
``nl.static_cast`` of an array on the host)."""

from __future__ import annotations

import logging

import torch


def numpy_of(t: torch.Tensor, what: str):
    """A CPU tensor as a numpy array; bfloat16 as ml_dtypes.bfloat16 (AWS's NumPy bfloat16) when ml_dtypes is
    installed, else widened to float32 (exact) with a warning in the log."""
    if t.dtype == torch.bfloat16:
        try:
            import ml_dtypes
        except ImportError:
            logging.getLogger("torchneuron").warning(
                "%s: a bfloat16 result is returned as float32 (exact): NumPy has no bfloat16 without ml_dtypes", what)
            return t.float().numpy()
        return t.view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
    try:
        return t.numpy()
    except TypeError:
        raise TypeError(f"{what}: a result of dtype {t.dtype} has no NumPy counterpart") from None
