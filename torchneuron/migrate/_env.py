"""Turns the CUDA compatibility layer on at import when ``TORCHNEURON_TRANSFER_CUDA`` asks for it.

``torchneuron/__init__.py`` imports this module last. With the variable unset (or
``0``) nothing else is imported; ``1`` (or ``neuron``) makes CUDA mean neuron,
``cpu`` makes it mean the CPU.
"""

import os

if os.environ.get("TORCHNEURON_TRANSFER_CUDA", "").strip().lower() not in ("", "0", "false", "no", "off"):
    from .cuda_compat import enable_from_env

    enable_from_env()
