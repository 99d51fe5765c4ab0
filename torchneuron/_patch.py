"""The record of the changes torchneuron makes to another library, and the scope they apply in.

Every such change (the CUDA compatibility layer, FlexAttention on neuron,
Lightning's accelerator, Inductor for neuron graphs) is listed as data, applied
in a scope, and undone when the scope ends, also when it ends by an exception;
each module publishes its list as ``PATCHES`` of :class:`Patch` records.

:class:`PatchSet` is the mechanism: a list of replacements, each a :class:`Patch`
and a function that applies it and returns its undo. Applying the set applies
them in order and undoes the ones already applied if a later one fails;
undoing it runs the undos last first. Three kinds of replacement cover what
torchneuron changes:

* :func:`attribute`: an attribute of a module or class. With ``bindings``, the
  same object is also replaced wherever a module under that package bound it by
  name (``from .utils import use_scatter_fallback``), so callers that imported
  the name before the scope began see the replacement too; the undo puts back
  every binding it changed. A class's inherited attribute is deleted again, not
  copied down; the replacement is built once per original, so a scope begun
  again installs the same object (tables keyed by it, such as Dynamo's, stay valid).
* :func:`item`: an entry of a mapping (e.g. Inductor's ``lowerings`` table).
* :func:`config`: values of a config module that has ``patch`` (Inductor's
  ``torch._inductor.config``), through that module's own ``patch``.

Each :class:`Patch` also records why the change exists (``why``), the upstream
issue or version it answers (``upstream``) and its guard: ``package`` and
``fixed_in``, the first version of that package that no longer needs it.
:class:`PatchSet` skips, with a warning, a patch whose guard says the installed
version no longer needs it (the patch is then due for deletion).

Example::

    >>> PATCHES = PatchSet("neuron graph", [attribute(module, "is_cpu", lambda orig: is_cpu, "...")])
    >>> with PATCHES.scope():
    ...     compile_something()
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import re
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

__all__ = ["Patch", "PatchSet", "Replacement", "attribute", "config", "installed_version", "item"]

logger = logging.getLogger("torchneuron")


@dataclass(frozen=True)
class Patch:
    """One attribute replaced.

    Args:
        target: the dotted name of the replaced attribute, e.g. ``"torch.Tensor.to"``.
        what: what the replacement does.
        why: why torchneuron needs it (keyword only, as the fields below).
        upstream: the upstream issue, pull request or version it answers (a link where one exists).
        package: the importable package whose version the guard reads (``"vllm"``, ``"torch"``).
        fixed_in: the guard: the first version of ``package`` that no longer needs the patch; from that
            version on :class:`PatchSet` skips it with a warning. ``None``: no upstream fix yet.
    """

    target: str
    what: str
    why: str = field(default="", kw_only=True)
    upstream: str = field(default="", kw_only=True)
    package: Optional[str] = field(default=None, kw_only=True)
    fixed_in: Optional[str] = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if self.fixed_in is not None and self.package is None:
            raise ValueError(f"Patch {self.target}: fixed_in={self.fixed_in!r} needs the package it refers to")

    def needed(self) -> bool:
        """False when ``package`` is installed at ``fixed_in`` or later (the guard); True otherwise."""
        if self.fixed_in is None:
            return True
        version = installed_version(self.package)
        return version is None or _version_key(version) < _version_key(self.fixed_in)


def installed_version(package: str) -> Optional[str]:
    """The ``__version__`` of an importable package, or ``None`` when it is not installed."""
    module = sys.modules.get(package)
    if module is None:
        try:
            module = importlib.import_module(package)
        except ImportError:
            return None
    return str(getattr(module, "__version__", "")) or None


def _version_key(version: str) -> tuple:
    """``"0.32.0+cpu"`` -> ``(0, 32, 0)``: the release numbers of a version (pre-releases count as the release)."""
    release = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    if release is None:
        raise ValueError(f"cannot read a version from {version!r}")
    parts = [int(p) for p in release.group(1).split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


Undo = Callable[[], None]


@dataclass(frozen=True)
class Replacement:
    """A :class:`Patch` and how to apply it.

    Args:
        patch: the record (target and description).
        apply: makes the change and returns the function that undoes it.
    """

    patch: Patch
    apply: Callable[[], Undo]


_MISSING = object()  # a class attribute it inherits: deleted again by the undo


def _own(owner: Any, name: str) -> Any:
    """What ``owner.name`` holds: a class's own entry (``_MISSING`` if inherited), a module's attribute."""
    return owner.__dict__.get(name, _MISSING) if isinstance(owner, type) else getattr(owner, name, _MISSING)


def _put(owner: Any, name: str, value: Any) -> None:
    if value is _MISSING:
        delattr(owner, name)
    else:
        setattr(owner, name, value)


_index: dict[str, tuple[int, dict[int, list[tuple[Any, str]]]]] = {}  # package -> (modules seen, id -> places)


_modules: dict[str, tuple[int, list[Any]]] = {}  # package -> (len(sys.modules) then, its modules)


def _package_modules(package: str) -> list[Any]:
    total = len(sys.modules)
    cached = _modules.get(package)
    if cached is None or cached[0] != total:
        prefix = package + "."
        cached = _modules[package] = (total, [m for name, m in list(sys.modules.items())
                                              if m is not None and (name == package or name.startswith(prefix))])
    return cached[1]


def _bindings(original: Any, package: str) -> list[tuple[Any, str]]:
    """Every ``(module, name)`` under ``package`` whose attribute ``name`` is ``original``.

    The modules' namespaces are indexed once, and again only when modules were imported since.
    """
    modules = _package_modules(package)
    seen, index = _index.get(package, (-1, {}))
    if seen != len(modules):
        index = {}
        for module in modules:
            for name, value in list(getattr(module, "__dict__", {}).items()):
                index.setdefault(id(value), []).append((module, name))
        _index[package] = (len(modules), index)
    return [(m, n) for m, n in index.get(id(original), ()) if getattr(m, n, None) is original]


def attribute(owner: Any, name: str, build: Callable[[Any], Any], what: str, *,
              bindings: Optional[str] = None, target: Optional[str] = None, **record: Any) -> Replacement:
    """A replacement of ``owner.name`` by ``build(original)``.

    Args:
        owner: the module or class.
        name: the attribute.
        build: receives the original, returns the replacement.
        what: what the replacement does.
        bindings: a package name: also replace the original wherever a module under it bound it.
        target: the dotted name to list (default: ``owner.__name__ + "." + name``).
        record: the :class:`Patch` fields ``why``, ``upstream``, ``package``, ``fixed_in``.
    """
    if target is None:
        target = f"{getattr(owner, '__module__', None) or ''}.{getattr(owner, '__qualname__', '')}" \
            if isinstance(owner, type) else f"{owner.__name__}"
        target = f"{target.strip('.')}.{name}"

    built: list[Any] = [_MISSING, None]  # the last original and its replacement

    def apply() -> Undo:
        original = getattr(owner, name)
        if built[0] is not original:
            built[:] = [original, build(original)]
        replacement = built[1]
        places = [(owner, name)]
        if bindings is not None:
            places += [place for place in _bindings(original, bindings) if place != (owner, name)]
        changed: list[tuple[Any, str, Any]] = []
        try:
            for place_owner, place_name in places:
                before = _own(place_owner, place_name)
                setattr(place_owner, place_name, replacement)
                changed.append((place_owner, place_name, before))
        except BaseException:
            for place_owner, place_name, value in reversed(changed):
                _put(place_owner, place_name, value)
            raise

        modules_at_apply = len(_package_modules(bindings)) if bindings is not None else 0

        def undo() -> None:
            restore = list(changed)
            if bindings is not None and len(_package_modules(bindings)) != modules_at_apply:
                # modules imported inside the scope bound the replacement
                done = {(o, a) for o, a, _ in changed}
                restore += [(m, n, original) for m, n in _bindings(replacement, bindings) if (m, n) not in done]
            for place_owner, place_name, value in reversed(restore):
                if _own(place_owner, place_name) is replacement:
                    _put(place_owner, place_name, value)

        return undo

    return Replacement(Patch(target, what, **record), apply)


def item(mapping: Any, keys: Callable[[], Sequence[Any]], build: Callable[[Any], Any], what: str, *,
         target: str, **record: Any) -> Replacement:
    """A replacement of ``mapping[key]`` by ``build(original)`` for each key ``keys()`` names when applied.

    Args:
        mapping: the dict.
        keys: returns the keys to replace (looked up when the scope begins).
        build: receives an original entry, returns its replacement.
        what: what the replacement does.
        target: the dotted name to list.
        record: the :class:`Patch` fields ``why``, ``upstream``, ``package``, ``fixed_in``.
    """

    def apply() -> Undo:
        changed: list[tuple[Any, Any, Any]] = []
        built: dict[int, Any] = {}
        try:
            for key in keys():
                original = mapping[key]
                if id(original) not in built:  # overloads sharing one entry share one replacement
                    built[id(original)] = build(original)
                mapping[key] = built[id(original)]
                changed.append((key, original, built[id(original)]))
        except BaseException:
            for key, original, _ in reversed(changed):
                mapping[key] = original
            raise

        def undo() -> None:
            for key, original, replacement in reversed(changed):
                if mapping.get(key) is replacement:
                    mapping[key] = original

        return undo

    return Replacement(Patch(target, what, **record), apply)


def config(module: Any, values: dict[str, Any], what: str, *, target: Optional[str] = None,
           **record: Any) -> Replacement:
    """Values of a config module set through its own ``patch`` (e.g. ``torch._inductor.config``).

    Args:
        module: the config module.
        values: the settings.
        what: why they are set.
        target: the dotted name to list (default: the module's name and the keys).
        record: the :class:`Patch` fields ``why``, ``upstream``, ``package``, ``fixed_in``.
    """
    if target is None:
        target = f"{module.__name__}.{{{', '.join(values)}}}"

    def apply() -> Undo:
        patch = module.patch(values)
        patch.__enter__()
        return lambda: patch.__exit__(None, None, None)

    return Replacement(Patch(target, what, **record), apply)


class PatchSet:
    """A list of replacements applied together and undone together.

    Applying an applied set only counts the nesting; the changes are undone when
    the outermost scope ends. A replacement whose :class:`Patch` guard says the
    installed library no longer needs it (:meth:`Patch.needed`) is skipped with a
    warning (the patch is due for deletion).

    Args:
        name: what the set is for (used in errors and logs).
        replacements: the changes, in the order they are applied.
    """

    def __init__(self, name: str, replacements: Sequence[Replacement]) -> None:
        self.name = name
        self.replacements = tuple(replacements)
        self._lock = threading.RLock()
        self._undos: list[Undo] = []
        self._depth = 0

    @property
    def patches(self) -> tuple[Patch, ...]:
        """The :class:`Patch` records of the set, in order."""
        return tuple(r.patch for r in self.replacements)

    @property
    def active(self) -> bool:
        """Whether the set is applied."""
        return self._depth > 0

    def apply(self) -> None:
        """Apply every replacement (or count one more nesting level); on a failure, undo the ones applied."""
        with self._lock:
            if self._depth == 0:
                try:
                    for replacement in self.replacements:
                        patch = replacement.patch
                        if not patch.needed():
                            logger.warning("%s: %s not applied: %s %s has the upstream fix (fixed_in=%s, %s); "
                                           "this patch is due for removal", self.name, patch.target, patch.package,
                                           installed_version(patch.package), patch.fixed_in, patch.upstream or "")
                            continue
                        self._undos.append(replacement.apply())
                except BaseException:
                    self._undo_all()
                    raise
            self._depth += 1

    def undo(self) -> None:
        """End one nesting level; the outermost undoes every replacement, last applied first."""
        with self._lock:
            if self._depth == 0:
                return
            self._depth -= 1
            if self._depth == 0:
                self._undo_all()

    def reset(self) -> None:
        """Undo every replacement whatever the nesting (a scope that cannot end normally)."""
        with self._lock:
            self._depth = 0
            self._undo_all()

    def _undo_all(self) -> None:
        errors = []
        while self._undos:
            try:
                self._undos.pop()()
            except Exception as e:  # keep undoing the rest
                errors.append(e)
        if errors:
            raise RuntimeError(f"{self.name}: {len(errors)} change(s) could not be undone: "
                               f"{errors[0]!r}") from errors[0]

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Context manager: the set applied inside, undone when the block ends (also by an exception)."""
        self.apply()
        try:
            yield
        finally:
            self.undo()

    def __repr__(self) -> str:
        return f"PatchSet({self.name!r}, {len(self.replacements)} changes, {'active' if self.active else 'inactive'})"
