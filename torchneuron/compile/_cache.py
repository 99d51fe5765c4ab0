"""Where compiled graphs and kernels are kept on disk.

PyTorch keeps one on-disk cache per process: FX graphs, AOTAutograd
entries and compiled C++ kernels, under ``TORCHINDUCTOR_CACHE_DIR``
(default ``/tmp/torchinductor_<user>``). ``TORCHNEURON_CACHE_DIR``, when set,
names that directory instead (it wins over ``TORCHINDUCTOR_CACHE_DIR``).
"""

from __future__ import annotations

import os

ENV = "TORCHNEURON_CACHE_DIR"
TORCH_ENV = "TORCHINDUCTOR_CACHE_DIR"


def apply() -> None:
    """Point PyTorch's compile cache at ``TORCHNEURON_CACHE_DIR`` if that is set (idempotent)."""
    path = os.environ.get(ENV)
    if path:
        os.environ[TORCH_ENV] = os.path.abspath(os.path.expanduser(path))


def cache_dir() -> str:
    """Return the directory holding the compile caches (created if missing).

    Example::

        >>> torchneuron.compile.cache_dir()
        '/tmp/torchinductor_alice'
    """
    apply()
    from torch._inductor.runtime.cache_dir_utils import cache_dir as _torch_cache_dir

    return _torch_cache_dir()
