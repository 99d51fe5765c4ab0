#!/usr/bin/env python
"""Run AWS's NKI samples and examples against torchneuron.nki, from local copies the user gives.

    python scripts/nki_conformance.py --samples ~/src/nki-samples --sdk ~/src/aws-neuron-sdk [--json out.json]

Nothing of AWS's code is in this repository: ``--samples`` is a checkout of github.com/aws-neuron/nki-samples
(the reference kernels and their unit tests were removed in its commit c4b806e; check out its parent,
8370e11, to run them), ``--sdk`` one of github.com/aws-neuron/aws-neuron-sdk (the ISA examples are
``general/nki/test`` up to cca3784, ``nki/test`` since). Each suite runs in a child process with the
import alias installed (``python -m torchneuron.nki.alias``), each kernel checked by the sample's own
check: its pytest/unittest assertions, or, for a script, its ``__main__`` (exit status 0 and no
"differ" in its output). The table printed says, per kernel, pass / fail / error (an exception before
the check: a missing name, an unsupported argument) / not run (needs torch_xla, JAX or a device).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent

# Scripts that need more than torchneuron: a framework's device, a profiler on hardware.
NEEDS = [(re.compile(r"_torch\.py$|getting_started_torch\.py$"), "torch_xla (an XLA device)"),
         (re.compile(r"_jax\.py$"), "JAX"),
         (re.compile(r"prof-kernel-profile\.py$"), "neuron-profile on a device (nki.profile)")]


def _env(extra_path: List[Path]) -> Dict[str, str]:
    env = dict(os.environ)
    paths = [str(ROOT)] + [str(p) for p in extra_path] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "1")
    return env


def _last_error(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^(E\s+)?[A-Za-z_.]*(Error|Exception|Interrupt)\b", ln):
            return ln[:200]
    return (lines[-1][:200] if lines else "")


def run_pytest(name: str, files: List[Path], cwd: Path, extra_path: List[Path], timeout: int,
               args: Tuple[str, ...] = ()) -> List[Tuple[str, str, str]]:
    """(kernel, outcome, detail) for every test of ``files``, run by pytest under the alias."""
    if not files:
        return []
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "out.xml"
        cmd = [sys.executable, "-m", "torchneuron.nki.alias", "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "--continue-on-collection-errors", f"--junitxml={xml}", "-o", "junit_family=xunit1",
               *args, *[str(f) for f in files]]
        try:
            subprocess.run(cmd, cwd=cwd, env=_env(extra_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout)
        except subprocess.TimeoutExpired:
            return [(f"{name}/{f.name}", "error", f"timed out after {timeout} s") for f in files]
        results: List[Tuple[str, str, str]] = []
        if not xml.exists():
            return [(f"{name}/{f.name}", "error", "pytest wrote no report") for f in files]
        seen = set()
        for case in ET.parse(xml).getroot().iter("testcase"):
            file = case.get("file") or (case.get("classname") or "").replace(".", "/") + ".py"
            base = Path(file).name
            test = case.get("name") or "?"
            outcome, detail = "pass", ""
            for tag in ("failure", "error", "skipped"):
                el = case.find(tag)
                if el is not None:
                    text = (el.get("message") or "") + "\n" + (el.text or "")
                    if tag == "skipped":
                        outcome = "not run"
                    elif tag == "failure" and re.search(r"AssertionError|assert ", text) and \
                            not re.search(r"^E\s+(?!AssertionError)[A-Za-z_.]*Error", el.text or "", re.M):
                        outcome = "fail"
                    else:
                        outcome = "error"
                    detail = _last_error(text)
            if not case.get("name") or case.get("classname", "").endswith(base[:-3]) and test == base[:-3]:
                pass
            if (case.find("error") is not None and test in ("", base[:-3])) or \
                    (case.get("classname") == "" and test.endswith(".py")):
                # a collection error: every test the file defines is an error
                src = next((f for f in files if f.stem == Path(test).stem or f.name == base), None)
                names = re.findall(r"^\s*def (test_\w+)", src.read_text(), re.M) if src else []
                for t in names or [Path(test).stem]:
                    results.append((f"{name}/{Path(src.name if src else base).stem}::{t}", "error", detail))
                seen.add(src.name if src else base)
                continue
            results.append((f"{name}/{Path(base).stem}::{test}", outcome, detail))
            seen.add(base)
        for f in files:  # files pytest could not even report on
            if f.name not in seen and Path(f.name).stem not in {Path(s).stem for s in seen}:
                names = re.findall(r"^\s*def (test_\w+)", f.read_text(), re.M)
                for t in names:
                    results.append((f"{name}/{f.stem}::{t}", "error", "no report (collection failed)"))
        return results


# A module missing here that torchneuron does not stand in for: the kernel is not run (not a failure of ours).
MISSING = re.compile(r"No module named '(torch_xla|jax|jaxlib|scipy|loguru|neuronxcc\.starfish)[.']")


def _not_run(results: List[Tuple[str, str, str]]) -> List[Tuple[str, str, str]]:
    out = []
    for kernel, outcome, detail in results:
        m = MISSING.search(detail)
        out.append((kernel, "not run", f"needs {m.group(1)} (not installed)") if outcome == "error" and m
                   else (kernel, outcome, detail))
    return out


def run_script(name: str, script: Path, extra_path: List[Path], timeout: int) -> Tuple[str, str, str]:
    for pattern, what in NEEDS:
        if pattern.search(script.name):
            return (f"{name}/{script.name}", "not run", f"needs {what}")
    if re.search(r"^\s*(import|from) torch_xla", script.read_text(errors="replace"), re.M):
        return (f"{name}/{script.name}", "not run", "needs torch_xla (an XLA device)")
    cmd = [sys.executable, "-m", "torchneuron.nki.alias", str(script)]
    try:
        p = subprocess.run(cmd, cwd=script.parent, env=_env(extra_path), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=timeout, text=True)
    except subprocess.TimeoutExpired:
        return (f"{name}/{script.name}", "error", f"timed out after {timeout} s")
    out = p.stdout
    if p.returncode == 0 and not re.search(r"\bdiffer\b|mismatch", out, re.I):
        return (f"{name}/{script.name}", "pass", "")
    if re.search(r"AssertionError|\bdiffer\b|mismatch", out) and not re.search(r"^\w*Error(?<!AssertionError):", out, re.M):
        return (f"{name}/{script.name}", "fail", _last_error(out))
    return (f"{name}/{script.name}", "error", _last_error(out))


def _scripts_calling_their_tests(results: List[Tuple[str, str, str]], files: List[Path], extra_path: List[Path],
                                 timeout: int) -> List[Tuple[str, str, str]]:
    """A test file that calls its own test function at module level with the arguments it wants (as
    nki-samples' attention tutorial does: ``test_attn_tutorial("accuracy", attn_fwd_v1)``, its
    parameters no pytest fixtures) is a script: an error of that test under pytest is replaced by the
    outcome of running the file, whose call is the check."""
    out = []
    ran: Dict[Path, Tuple[str, str, str]] = {}  # a file run once for all of its tests it calls itself
    for kernel, outcome, detail in results:
        stem, _, test = kernel.split("/", 1)[1].partition("::")
        f = next((f for f in files if f.stem == stem), None)
        if outcome == "error" and f is not None and test and \
                re.search(rf"^{re.escape(test)}\(", f.read_text(errors="replace"), re.M):
            if f not in ran:
                ran[f] = run_script(kernel.split("/", 1)[0], f, extra_path + [f.parent], timeout)
            _, outcome, detail = ran[f]
            kernel += " (the file's own call, run as a script)"
        out.append((kernel, outcome, detail))
    return out


def _main_scripts(folder: Path) -> List[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__main__" in p.read_text(errors="replace"))


def _commit(path: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True).stdout.strip() or "?"
    except OSError:
        return "?"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=Path, help="a checkout of aws-neuron/nki-samples")
    ap.add_argument("--sdk", type=Path, help="a checkout of aws-neuron/aws-neuron-sdk")
    ap.add_argument("--suite", action="append", help="run only these suites (sdk-isa, sdk-examples, "
                                                     "samples-unit, samples-tutorials)")
    ap.add_argument("-k", help="only kernels whose file name contains this")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per child process")
    ap.add_argument("--json", type=Path, help="write the results here too")
    a = ap.parse_args(argv)
    if not a.samples and not a.sdk:
        ap.error("give --samples and/or --sdk (local checkouts)")
    want = set(a.suite or ["sdk-isa", "sdk-examples", "samples-unit", "samples-tutorials"])
    pick = (lambda files: [f for f in files if a.k in f.name]) if a.k else (lambda files: files)
    results: List[Tuple[str, str, str]] = []
    if a.sdk:
        nki_dir = a.sdk / "general" / "nki" if (a.sdk / "general" / "nki" / "test").is_dir() else a.sdk / "nki"
        if "sdk-isa" in want:
            tests = pick(sorted((nki_dir / "test").glob("test_*.py")))
            results += run_pytest("sdk-isa", tests, nki_dir / "test", [], a.timeout)
        if "sdk-examples" in want:
            for s in pick(_main_scripts(nki_dir / "examples")):
                results.append(run_script("sdk-examples", s, [s.parent], a.timeout))
    if a.samples:
        src = a.samples / "src"
        if "samples-unit" in want and (a.samples / "test" / "unit").is_dir():
            for test in pick(sorted((a.samples / "test" / "unit").glob("test_*.py"))):  # one process each
                results += run_pytest("samples-unit", [test], a.samples / "test" / "unit", [src], a.timeout,
                                      ("--simulation-only",))
        if "samples-tutorials" in want:
            tut = src / "nki_samples" / "tutorials"
            tests = pick(sorted(tut.rglob("test_*.py")))
            results += _scripts_calling_their_tests(
                run_pytest("samples-tutorials", tests, tut, [src], a.timeout), tests, [src], a.timeout)
            for s in pick(_main_scripts(tut)):
                results.append(run_script("samples-tutorials", s, [src, s.parent], a.timeout))
    results = _not_run(results)
    width = max((len(k) for k, _, _ in results), default=10)
    for kernel, outcome, detail in results:
        print(f"{kernel:<{width}}  {outcome:<7}  {detail}")
    suites: Dict[str, Dict[str, int]] = {}
    for kernel, outcome, _ in results:
        s = suites.setdefault(kernel.split("/")[0], {})
        s[outcome] = s.get(outcome, 0) + 1
    print()
    for s, counts in suites.items():
        print(f"{s}: " + ", ".join(f"{counts.get(o, 0)} {o}" for o in ("pass", "fail", "error", "not run"))
              + f" of {sum(counts.values())}")
    commits = {k: _commit(p) for k, p in (("samples", a.samples), ("sdk", a.sdk)) if p}
    print("commits:", ", ".join(f"{k} {v}" for k, v in commits.items()))
    if a.json:
        a.json.write_text(json.dumps({"commits": commits, "suites": suites,
                                      "results": [dict(kernel=k, outcome=o, detail=d) for k, o, d in results]},
                                     indent=1))
    return 0 if all(o in ("pass", "not run") for _, o, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
