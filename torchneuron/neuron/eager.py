"""Eager modes: ops run one by one (``"op"``), or recorded and run as fused groups (``"fused"``).

In fused mode, ops on neuron tensors are recorded instead of run. A recorded group runs when the
host needs the device: a read of a value (``.item()``, ``.cpu()``, printing), a copy, a
synchronization, an op that cannot be recorded (random ops, data-dependent sizes, collectives), or
a size bound. A group seen often enough runs as one graph compiled by the same Inductor pipeline as
``torch.compile(backend="neuron")``, in which intermediates that nothing refers to any more are
never written to device memory; other groups run op by op. Where groups are cut depends only on the
program's order of ops. ``torch.use_deterministic_algorithms(True)`` records nothing.
``torchneuron.compile.fused_report()`` says what happened.

The mode is process-wide, starts as ``TORCHNEURON_EAGER`` says (``op`` when unset), and is changed
with :func:`set_eager_mode` or, for a block, :func:`eager_mode`.

When a group seen again is compiled: ``TORCHNEURON_FUSED_COMPILE=payoff`` (the default) once its
op-by-op runs have cost enough that what compiling saves pays for the compile (a minute for a large
training step with an empty cache, seconds with its graph in the cache); ``early`` the second time it
is seen, whatever the compile costs (a long run that should reach its fastest steps at once). In a
process group of several processes, ``early`` is used: what ranks run must not depend on time.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

from .. import _C

__all__ = ["eager_mode", "get_eager_mode", "set_eager_mode"]

MODES = ("op", "fused")
COMPILE_RULES = ("payoff", "early")


def get_eager_mode() -> str:
    """Return the eager mode: ``"op"`` or ``"fused"``."""
    return "fused" if _C._fused_mode() else "op"


def set_eager_mode(mode: str) -> None:
    """Set the eager mode of neuron ops for the process.

    Args:
        mode: ``"op"`` (each op runs when called) or ``"fused"`` (ops are recorded and run as
            fused groups). Leaving fused mode runs what is recorded first.

    Example::

        >>> torch.neuron.set_eager_mode("fused")
        >>> loss = model(x).sum()   # recorded
        >>> loss.item()             # the group runs here
    """
    if mode not in MODES:
        raise ValueError(f"eager mode must be one of {', '.join(map(repr, MODES))}, not {mode!r}")
    _C._set_fused_mode(mode == "fused")


@contextlib.contextmanager
def eager_mode(mode: str) -> Iterator[None]:
    """A block run in the given eager mode (see :func:`set_eager_mode`); the mode before comes back after it,
    also when it raises.

    Example::

        >>> with torch.neuron.eager_mode("fused"):
        ...     train_step()
    """
    before = get_eager_mode()
    set_eager_mode(mode)
    try:
        yield
    finally:
        set_eager_mode(before)


def _from_env() -> None:
    rule = os.environ.get("TORCHNEURON_FUSED_COMPILE", "").strip().lower() or "payoff"
    if rule not in COMPILE_RULES:
        raise ValueError(f"TORCHNEURON_FUSED_COMPILE must be one of {', '.join(COMPILE_RULES)}, not {rule!r}")
    _C._fused_config(payoff=rule == "payoff")
    value = os.environ.get("TORCHNEURON_EAGER", "").strip().lower()
    if value in ("", "op"):
        return
    if value not in MODES:
        raise ValueError(f"TORCHNEURON_EAGER must be one of {', '.join(MODES)}, not {value!r}")
    set_eager_mode(value)
