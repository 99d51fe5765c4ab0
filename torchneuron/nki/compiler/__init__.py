"""``nki.compiler`` (``ncc``): the names NKI kernels use to direct AWS's compiler.

Here nothing is compiled: a kernel runs instruction by instruction on the emulated NeuronCore. The
decorators (``skip_middle_end_transformations``, ``enable_stack_allocator``, ``force_auto_alloc``) and
the scopes (``no_reorder``, ``allocation_scope``, ``multi_buffer``) only direct AWS's compiler's passes
and are no-ops that return the kernel (or an empty context). The allocators (``ncc.sbuf.alloc``,
``ncc.sbuf.mod_alloc`` and the ``ncc.psum`` ones) place each logical tile of a tensor at the addresses
they give in the program's SBUF or PSUM, where tiles at overlapping addresses share bytes
(:mod:`torchneuron.nki._memory`); ``auto_alloc()`` is the buffer itself.
"""

from __future__ import annotations

import contextlib

from ..typing import tensor  # noqa: F401
from . import psum as _psum_mod, sbuf as _sbuf_mod  # noqa: F401

# ncc.jit, ncc.benchmark, ncc.baremetal, ncc.simulate_kernel: nki's own, set by the package (torchneuron/nki/
# __init__.py, which imports this module: importing the package from here would be an import circle).

__all__ = ["sbuf", "psum", "skip_middle_end_transformations", "enable_stack_allocator", "force_auto_alloc",
           "allocation_scope", "multi_buffer", "no_reorder", "jit", "benchmark", "baremetal",
           "simulate_kernel", "tensor"]

sbuf = _sbuf_mod
psum = _psum_mod


def _decorator(func=None, **options):
    if func is None:
        return lambda f: f
    return func


def skip_middle_end_transformations(func=None):
    """A no-op here (the kernel runs as written; there are no compiler passes to skip)."""
    return _decorator(func)


def enable_stack_allocator(func=None, log_level=50):
    """A no-op here (tiles take memory when created and give it back when they die, as a stack does)."""
    return _decorator(func)


def force_auto_alloc(func=None):
    """A no-op here: the kernel keeps its direct allocations (AWS's compiler would allocate its tensors
    automatically, to check a kernel suspected of overlapping tiles)."""
    return _decorator(func)


@contextlib.contextmanager
def allocation_scope():
    yield


def multi_buffer(factor=2):
    """A directive for AWS's allocator; here an empty context."""
    return contextlib.nullcontext()


def no_reorder():
    """A scope the compiler must not reorder; here instructions always run in program order."""
    return contextlib.nullcontext()
