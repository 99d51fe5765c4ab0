"""``nki.isa.constants``: the enums of ``nki.isa`` under the submodule AWS's examples import them from
(``from neuronxcc.nki.isa.constants import dge_mode``); the same objects as ``nisa.dge_mode`` and the like.
Also ``nisa.constants``."""

from __future__ import annotations

import sys

from . import isa
from ._isa_more import dge_mode, dma_engine, engine, matmul_perf_mode, nc_version, oob_mode, reduce_cmd

__all__ = ["dge_mode", "dma_engine", "engine", "matmul_perf_mode", "nc_version", "oob_mode", "reduce_cmd"]

isa.constants = sys.modules[__name__]  # nisa.constants (the package imports this module after nisa)
