"""torchneuron's version, the torch it is built for, and the runtime interface's version.

Like ``torch.version``: ``torchneuron.version.__version__`` is the package's version (PEP 440,
``MAJOR.MINOR.PATCH``; ``.devN`` between releases), ``torchneuron.version.torch`` the one torch
release it builds and runs against (each torchneuron release pins one), and
``torchneuron.version.runtime_api`` the ``(major, minor)`` version of the runtime interface
(``csrc/runtime/neuron_runtime.h``) that the loaded runtime implements. The versioning policy is in
CHANGELOG.md.

Example::

    >>> import torchneuron.version
    >>> torchneuron.version.torch
    '2.13.0'
"""

__version__ = "0.2.0.dev0"
torch = "2.13.0"

__all__ = ["__version__", "torch", "runtime_api"]


def __getattr__(name: str):
    if name == "runtime_api":  # asked of the loaded runtime, not written down twice
        from . import _C

        return tuple(_C._runtime_api_version())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
