"""``torch.compile`` on the neuron device.

Two ways in, both through PyTorch's own ``torch.compile``:

* the default backend (Inductor) works on neuron tensors unchanged: Inductor
  finds the neuron code generators on ``torch.neuron`` the first time it
  compiles (see :mod:`torchneuron.compile.inductor`);
* ``backend="neuron"`` (:func:`backend`) is the same pipeline with the
  registration done up front, neuron's meaning of the ``mode`` names, and
  diagnostics installed before its first graph.

Diagnostics: :func:`report` (graphs, graph breaks, recompiles, with reasons
and source lines); ``TORCHNEURON_COMPILE_LOG=1`` logs them as they happen.
Cache: PyTorch's on-disk FX graph, AOTAutograd and kernel caches, in
``TORCHNEURON_CACHE_DIR`` if set (else ``TORCHINDUCTOR_CACHE_DIR``); see
:func:`cache_dir`.

Importing this package is cheap: Dynamo and Inductor load at the first compile.

Example::

    >>> model = torch.compile(model.to("neuron"))                  # default backend
    >>> model = torch.compile(model.to("neuron"), backend="neuron")
    >>> print(torchneuron.compile.report())
"""

from __future__ import annotations

from typing import Any, Sequence

from . import _cache, diagnostics, flex_attention
from ._cache import cache_dir
from .diagnostics import CompileReport, install, report, reset

__all__ = ["CompileReport", "backend", "cache_dir", "fused_report", "install", "report", "reset"]


def fused_report(reset: bool = False) -> Any:
    """What fused eager (``torch.neuron.set_eager_mode("fused")``) did: groups, hits, compiles, cuts and why.
    See :func:`torchneuron.compile.fused.fused_report`."""
    from . import fused

    return fused.fused_report(reset)


def backend(gm: Any, example_inputs: Sequence[Any], **kwargs: Any) -> Any:
    """The ``"neuron"`` Dynamo backend: ``torch.compile(model, backend="neuron")``.

    Also usable directly as ``torch.compile(model, backend=torchneuron.compile.backend)``.
    Accepts ``mode`` and ``options`` as ``torch.compile`` passes them; see
    :mod:`torchneuron.compile.dynamo_backend`.
    """
    from .dynamo_backend import neuron

    return neuron(gm, example_inputs, **kwargs)


def _startup() -> None:
    """Apply the environment at ``import torch``: cache directory, FlexAttention on neuron, live compile logging."""
    _cache.apply()
    flex_attention.enable()
    if diagnostics._live():
        diagnostics.install()


_startup()
