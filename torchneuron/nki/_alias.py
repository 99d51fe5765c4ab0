"""The opt-in import alias: kernel files written for AWS's NKI run unchanged on torchneuron.

AWS's kernels import ``neuronxcc.nki`` (``import neuronxcc.nki.language as nl``, ``from neuronxcc import
nki``) or, with the newer NKI, ``nki`` (``import nki.isa as nisa``). Nothing here is installed on its
own: a program opts in with one of::

    import torchneuron.nki
    torchneuron.nki.install_alias()            # until uninstall_alias()
    with torchneuron.nki.aliased(): ...        # for a block
    python -m torchneuron.nki.alias kernel.py [args]     # a script, as __main__
    python -m torchneuron.nki.alias -m pytest test_x.py  # a module, as python -m does

The alias is a finder on ``sys.meta_path`` that answers
``neuronxcc``, ``neuronxcc.nki[.language|.isa|.typing|.compiler|...]`` and ``nki[...]`` with
torchneuron's modules. A real package is never shadowed: when ``neuronxcc`` (or ``nki``) can be
imported without the alias, or is imported already, when the alias is installed, that root is left alone (logged at WARNING), and
its kernels run on AWS's stack as before; :func:`install_alias` returns the roots it aliased.
:func:`uninstall_alias` removes the finder and the modules it put in ``sys.modules``.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import types
from typing import Dict, Iterator, Optional, Tuple

__all__ = ["install_alias", "uninstall_alias", "aliased", "AliasFinder", "ROOTS"]

log = logging.getLogger("torchneuron")

#: The package names the alias answers, each with the module that stands for it (None: a bare package
#: holding only the submodules: ``neuronxcc`` itself).
ROOTS: Dict[str, Optional[str]] = {"neuronxcc": None, "neuronxcc.nki": "torchneuron.nki", "nki": "torchneuron.nki"}
#: Submodules AWS's package has under a module that is no package here (its name -> torchneuron's module):
#: put in ``sys.modules`` with their parent, so ``import neuronxcc.nki.isa.constants`` finds them there.
SUBMODULES: Dict[str, Dict[str, str]] = {"torchneuron.nki.isa": {"constants": "torchneuron.nki._isa_constants"}}


def _target(fullname: str, roots: Tuple[str, ...]) -> Tuple[bool, Optional[str]]:
    """(whether the alias answers ``fullname``, the torchneuron module standing for it)."""
    for root in sorted(ROOTS, key=len, reverse=True):
        if root.split(".")[0] not in roots:
            continue
        if fullname == root:
            return True, ROOTS[root]
        if fullname.startswith(root + ".") and ROOTS[root] is not None:
            return True, ROOTS[root] + fullname[len(root):]
    return False, None


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, finder: "AliasFinder", target: Optional[str]):
        self.finder, self.target = finder, target

    def create_module(self, spec):
        return None  # the default module: replaced in exec_module

    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__spec__.name
        self.finder.created.append(name)
        if self.target is None:  # the bare package (neuronxcc): its submodules come from the finder
            module.__doc__ = "torchneuron's alias of AWS's neuronxcc package (holds .nki only)"
            return
        # The module replaces itself in sys.modules with torchneuron's (importlib returns what is there).
        sys.modules[name] = importlib.import_module(self.target)
        for sub, target in SUBMODULES.get(self.target, {}).items():
            sys.modules[f"{name}.{sub}"] = importlib.import_module(target)
            self.finder.created.append(f"{name}.{sub}")


class AliasFinder(importlib.abc.MetaPathFinder):
    """Answers the aliased names with torchneuron's NKI modules (see the module's docstring)."""

    def __init__(self, roots: Tuple[str, ...]):
        self.roots = roots
        self.created: list = []

    def find_spec(self, fullname, path=None, target=None):
        answered, module = _target(fullname, self.roots)
        if not answered:
            return None
        if module is not None and importlib.util.find_spec(module) is None:
            return None  # a name torchneuron has no module for: ModuleNotFoundError, as without the alias
        is_package = module is None or importlib.util.find_spec(module).submodule_search_locations is not None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(self, module), is_package=is_package)


_FINDER: Optional[AliasFinder] = None


def _real(root: str) -> bool:
    """Whether ``root`` is importable, or imported, without the alias."""
    if root in sys.modules:
        return not isinstance(getattr(sys.modules[root], "__loader__", None), _AliasLoader)
    try:
        spec = importlib.util.find_spec(root)
    except (ImportError, ValueError):
        return False
    return spec is not None and not isinstance(spec.loader, _AliasLoader)


def install_alias() -> Tuple[str, ...]:
    """Make ``import neuronxcc.nki...`` and ``import nki...`` give torchneuron's NKI, leaving a real
    ``neuronxcc`` or ``nki`` package alone. Returns the roots aliased (``()``: none). Idempotent."""
    global _FINDER
    if _FINDER is not None:
        return _FINDER.roots
    roots = []
    for root in ("neuronxcc", "nki"):
        if _real(root):
            log.warning("torchneuron.nki alias: a real %r package is installed; it is left in place and not "
                        "aliased (kernels importing it run on it)", root)
        else:
            roots.append(root)
    _FINDER = AliasFinder(tuple(roots))
    # First: the submodules of an aliased package would otherwise be found again by the path finder
    # in torchneuron's directory, as second copies. Only roots found to be no real package are answered.
    sys.meta_path.insert(0, _FINDER)
    return _FINDER.roots


def uninstall_alias() -> None:
    """Remove the alias: the finder leaves ``sys.meta_path`` and the aliased names ``sys.modules``
    (modules already holding a reference to ``nl`` keep it)."""
    global _FINDER
    finder, _FINDER = _FINDER, None
    if finder is None:
        return
    if finder in sys.meta_path:
        sys.meta_path.remove(finder)
    for name in list(sys.modules):
        if _target(name, finder.roots)[0]:
            del sys.modules[name]


@contextlib.contextmanager
def aliased() -> Iterator[Tuple[str, ...]]:
    """The alias for a block: ``with torchneuron.nki.aliased(): import my_aws_kernel``."""
    installed = _FINDER is not None
    roots = install_alias()
    try:
        yield roots
    finally:
        if not installed:
            uninstall_alias()


def main(argv=None) -> int:
    """``python -m torchneuron.nki.alias script.py [args]`` or ``... -m module [args]``."""
    import runpy

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        sys.stderr.write("usage: python -m torchneuron.nki.alias script.py [args] | -m module [args]\n")
        return 2
    install_alias()
    if argv[0] == "-m":
        if len(argv) < 2:
            sys.stderr.write("torchneuron.nki.alias: -m needs a module name\n")
            return 2
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")
    return 0
