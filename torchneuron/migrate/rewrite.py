"""``torchneuron migrate``: rewrite CUDA-specific code into device-agnostic code.

The rewriter parses each file with libcst, so formatting and comments survive,
and rewrites what has a device-agnostic equivalent that runs on the CPU, on
neuron and on CUDA alike:

==============================================  ==============================================
CUDA-specific                                   device-agnostic
==============================================  ==============================================
(module top)                                    ``device = torch.accelerator.current_accelerator(
                                                check_available=True) or torch.device("cpu")``
``x.cuda()``, ``x.cuda(i)``                     ``x.to(device)``, ``x.to(torch.device(device.type, i))``
``x.is_cuda``                                   ``x.device.type == device.type``
``"cuda"``, ``"cuda:0"``, ``f"cuda:{i}"``       ``device`` / ``device.type``, ``f"{device.type}:0"``, ...
``torch.device("cuda")``                        ``device``
``torch.cuda.is_available()`` / ``device_count``  ``torch.accelerator.is_available()`` / ...
``torch.cuda.synchronize()`` (and memory calls)  ``torch.accelerator.synchronize()``, guarded
                                                by ``torch.accelerator.is_available()``
``torch.cuda.manual_seed(s)`` (``_all``)         ``torch.manual_seed(s)``
``torch.cuda.amp.autocast(...)``                ``torch.autocast(device.type, dtype=torch.float16, ...)``
``torch.cuda.amp.GradScaler(...)``              ``torch.amp.GradScaler(device.type, ...)``
``"nccl"``                                      ``torch.distributed.get_default_backend_for_device(device)``
==============================================  ==============================================

What it cannot rewrite it lists with file and line: custom CUDA or Triton
kernels, cupy/pycuda/numba.cuda, comparisons with ``"cuda"``, CUDA graphs,
``torch.cuda.nvtx``, streams and events, other ``torch.cuda`` calls.

Example::

    >>> result = rewrite_source("x = torch.ones(2).cuda()\\n")
    >>> print(result.rewritten)
"""

from __future__ import annotations

import difflib
import os
import sys
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence, TextIO

import libcst as cst
from libcst.metadata import MetadataWrapper

from ._rewrite_rules import Finding, _AmpUses, _device_name, _insert_after_imports, _Rewriter, _Survey

__all__ = ["Finding", "FileResult", "main", "rewrite_file", "rewrite_paths", "rewrite_source"]


@dataclass
class FileResult:
    """The rewrite of one file.

    Attributes:
        path: the file.
        original: its text.
        rewritten: the rewritten text (equal to ``original`` if nothing changed).
        changes: one line per rewrite, ``"line N: what"``.
        findings: what was left as it was.
        error: set if the file could not be parsed.
    """

    path: str
    original: str
    rewritten: str
    changes: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    error: Optional[str] = None

    @property
    def changed(self) -> bool:
        return self.rewritten != self.original

    def diff(self) -> str:
        """The change as a unified diff (empty if nothing changed)."""
        absolute = os.path.isabs(self.path)
        return "".join(difflib.unified_diff(
            self.original.splitlines(keepends=True), self.rewritten.splitlines(keepends=True),
            fromfile=self.path if absolute else f"a/{self.path}", tofile=self.path if absolute else f"b/{self.path}"))


def rewrite_source(source: str, path: str = "<string>") -> FileResult:
    """Rewrite the CUDA-specific code of one Python source text.

    Args:
        source: the text.
        path: its name, for findings and the diff.
    """
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as e:
        return FileResult(path, source, source, error=f"cannot parse: {e}")
    wrapper = MetadataWrapper(module)
    survey = _Survey()
    wrapper.module.visit(survey)
    amp = _AmpUses()
    wrapper.visit(amp)
    torch_name = survey.torch_alias or "torch"
    dev = _device_name(survey.bound)
    dist = survey.dist_alias or f"{torch_name}.distributed"
    rewriter = _Rewriter(path, source.splitlines(), torch_name, dev, dist)
    rewriter._removed_imports = {n for n in amp.imported.values() if n in _AmpUses.REWRITTEN} - amp.other_use
    new_module = wrapper.visit(rewriter)
    if rewriter.uses_device or (rewriter.needs_torch and survey.torch_alias is None):
        new_module = _insert_after_imports(new_module, survey.torch_alias, dev,
                                           add_torch=survey.torch_alias is None, add_device=rewriter.uses_device)
    result = FileResult(path, source, new_module.code, rewriter.changes, rewriter.findings)
    result.findings.sort(key=lambda f: f.line)
    return result


def rewrite_file(path: str) -> FileResult:
    """Rewrite one file (its text is read, not written)."""
    with open(path, encoding="utf-8") as f:
        return rewrite_source(f.read(), path)


def _python_files(paths: Iterable[str]) -> list[str]:
    out = []
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in ("__pycache__", "node_modules"))
                out += [os.path.join(root, f) for f in sorted(files) if f.endswith(".py")]
        else:
            out.append(p)
    return out


def rewrite_paths(paths: Iterable[str]) -> list[FileResult]:
    """Rewrite every ``.py`` file among ``paths`` (directories are searched)."""
    return [rewrite_file(p) for p in _python_files(paths)]


def main(paths: Sequence[str], write: bool = False, out: TextIO = sys.stdout) -> int:
    """``torchneuron migrate PATH... [--write]``: print the diff (or write it), then what was left.

    Returns 0, or 1 if a file could not be read or parsed.
    """
    status = 0
    results = []
    for p in _python_files(paths):
        try:
            results.append(rewrite_file(p))
        except OSError as e:
            print(f"{p}: {e}", file=sys.stderr)
            status = 1
    changed = 0
    for r in results:
        if r.error:
            print(f"{r.path}: {r.error}", file=sys.stderr)
            status = 1
            continue
        if not r.changed:
            continue
        changed += 1
        if write:
            with open(r.path, "w", encoding="utf-8") as f:
                f.write(r.rewritten)
            out.write(f"rewrote {r.path} ({len(r.changes)} changes)\n")
        else:
            out.write(r.diff())
    findings = [f for r in results for f in r.findings]
    summary = f"{'rewrote' if write else 'would rewrite'} {changed} of {len(results)} file(s)"
    if changed and not write:
        summary += "; add --write to apply"
    out.write(f"\n{summary}\n")
    if findings:
        out.write(f"\nNot rewritten ({len(findings)}), these need a decision:\n")
        for f in findings:
            out.write(f"  {f.path}:{f.line}: {f.what}\n      {f.code}\n      -> {f.hint}\n")
    return status
