"""vLLM on neuron: a platform plugin, so ``LLM(model=...)`` and vLLM's OpenAI server run on ``neuron:N``.

vLLM finds :func:`register` through the ``vllm.platform_plugins`` entry point; it
answers with :class:`~torchneuron.vllm.platform.NeuronPlatform` when a neuron
device exists and ``TORCHNEURON_VLLM`` is not ``0``. The platform derives from
vLLM's CPU platform (the emulated NeuronCore runs vLLM's CPU kernels on its own
memory), with the device, worker and model runner of this package: weights,
KV cache and inputs live in device memory, the cache is sized from the device's
capacity, and tensor parallelism runs over the ``neuron`` process group.

Example::

    >>> from vllm import LLM, SamplingParams
    >>> llm = LLM(model="/path/to/model")          # runs on neuron:0
    >>> llm.generate(["Hello"], SamplingParams(max_tokens=8))

See docs/serving.md.
"""

from __future__ import annotations

import logging
import os
from typing import Optional

__all__ = ["ENV", "PLATFORM", "enabled", "register"]

#: The environment switch: ``0`` leaves vLLM on its own platforms.
ENV = "TORCHNEURON_VLLM"
#: The qualified name vLLM imports.
PLATFORM = "torchneuron.vllm.platform.NeuronPlatform"

logger = logging.getLogger("torchneuron")


def enabled() -> bool:
    """Whether the plugin should activate: ``TORCHNEURON_VLLM`` is not ``0`` and a neuron device exists."""
    value = os.environ.get(ENV, "1").strip().lower()
    if value in ("0", "false", "off", "no"):
        return False
    if value not in ("", "1", "true", "on", "yes"):
        raise ValueError(f"{ENV}={value!r}: expected 1 (use neuron, the default) or 0 (leave vLLM on its platforms)")
    import torch

    import torchneuron  # noqa: F401  (registers the device when autoload is off)

    return torch.neuron.device_count() > 0


def register() -> Optional[str]:
    """vLLM's platform-plugin hook: the platform's qualified name, or ``None`` when the plugin is off."""
    if not enabled():
        logger.info("vLLM platform plugin off (%s=0 or no neuron device)", ENV)
        return None
    return PLATFORM
