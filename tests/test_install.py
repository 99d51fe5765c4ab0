"""Packaging: what pyproject.toml and setup.py declare, the installed metadata, a re-run of
scripts/bootstrap.sh, and (with TORCHNEURON_TEST_WHEEL=1) a wheel installed into a second
environment."""

import fnmatch
import importlib.metadata
import os
import pathlib
import subprocess
import sys
import time
import tomllib

import pytest
import setuptools

ROOT = pathlib.Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
TORCH_PIN = "torch==2.13.0"
INCLUDE = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
# The files of the top-level packages that a wheel ships, without what a build leaves beside them.
PACKAGE_FILES = [
    p for top in ROOT.iterdir()
    if (top / "__init__.py").is_file() and any(fnmatch.fnmatch(top.name, pat) for pat in INCLUDE)
    for p in top.rglob("*")
    if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith((".so", ".pyc"))
]


def test_torch_is_pinned_for_build_and_run():
    assert TORCH_PIN in PYPROJECT["build-system"]["requires"]
    assert TORCH_PIN in PYPROJECT["project"]["dependencies"]


def test_migrate_dependency_is_a_runtime_dependency():
    # `torchneuron migrate` parses code with libcst: a plain install must bring it.
    assert "libcst" in PYPROJECT["project"]["dependencies"]


def test_license_is_an_spdx_expression():
    # The table form ({text = ...}) is deprecated by setuptools and warns at every build.
    assert PYPROJECT["project"]["license"] == "BSD-3-Clause"


def test_every_package_directory_is_a_package():
    # setuptools' find_packages skips a directory without __init__.py: its modules would be
    # missing from the wheel while an editable install still finds them.
    found = set(setuptools.find_packages(str(ROOT), include=INCLUDE))
    with_code = {".".join(p.parent.relative_to(ROOT).parts) for p in PACKAGE_FILES if p.suffix == ".py"}
    assert {"torchneuron", "torch_neuronx"} <= with_code
    assert with_code <= found, f"directories without __init__.py: {sorted(with_code - found)}"


def test_package_data_is_declared():
    declared = PYPROJECT["tool"]["setuptools"]["package-data"]
    data = [p.relative_to(ROOT).as_posix() for p in PACKAGE_FILES if p.suffix != ".py"]
    assert "torchneuron/data/tiny_corpus.txt" in data
    undeclared = [
        f for f in data
        if not any(fnmatch.fnmatch(f, f"{package}/{pat}") for package, pats in declared.items() for pat in pats)
    ]
    assert not undeclared, f"files a wheel would leave out; add them to [tool.setuptools.package-data]: {undeclared}"


def test_installed_metadata():
    dist = importlib.metadata.distribution("torchneuron")
    assert any(r.split(";")[0].strip() == "libcst" for r in dist.requires or [])
    eps = {(ep.group, ep.name): ep.value for ep in dist.entry_points}
    assert eps[("torch.backends", "torchneuron")] == "torchneuron:_autoload"
    assert eps[("console_scripts", "torchneuron")] == "torchneuron.cli:main"
    assert eps[("torch_dynamo_backends", "neuron")] == "torchneuron.compile:backend"


def test_build_objects_persist_in_build_dir(tmp_path):
    # An editable install hands build_ext a fresh temporary directory; setup.py keeps the
    # objects in build/ instead so that ninja recompiles only what changed.
    script = f"""
import setuptools
from distutils.core import run_setup
dist = run_setup("setup.py", script_args=["build_ext"], stop_after="commandline")
dist.get_command_obj("build").build_temp = {str(tmp_path)!r}
cmd = dist.get_command_obj("build_ext")
cmd.ensure_finalized()
print(cmd.build_temp)
print(*dist.ext_modules[0].sources)
print(*dist.ext_modules[1].sources)
print(*dist.ext_modules[2].sources)
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    build_temp, runtime, sources, gloo_exit = out.stdout.strip().splitlines()[-4:]
    assert pathlib.Path(build_temp).parent == ROOT / "build"
    # The runtime library is csrc/runtime/ alone; every other C++ file is in torchneuron._C but
    # csrc/distributed/exit.cpp, torchneuron._gloo_exit.
    expected = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "csrc").rglob("*.cpp"))
    in_runtime = [p for p in expected if p.startswith("csrc/runtime/")]
    assert runtime.split() == in_runtime and "csrc/runtime/capi.cpp" in in_runtime
    assert sources.split() + gloo_exit.split() == [
        p for p in expected if p != "csrc/distributed/exit.cpp" and p not in in_runtime] + ["csrc/distributed/exit.cpp"]


@pytest.mark.parametrize("debug", ["0", "1"])
def test_debug_build_configuration(debug):
    # TORCHNEURON_DEBUG=1: -O0 -g with NDEBUG undefined and the runtime's assertions defined, in a build
    # directory of its own; the release build keeps -O2 and no assertions.
    script = """
from distutils.core import run_setup
dist = run_setup("setup.py", script_args=["build_ext"], stop_after="commandline")
cmd = dist.get_command_obj("build_ext")
cmd.ensure_finalized()
print(cmd.build_temp)
print(*dist.ext_modules[0].extra_compile_args["cxx"])
"""
    env = {**os.environ, "TORCHNEURON_DEBUG": debug}
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    build_temp, args = out.stdout.strip().splitlines()[-2:]
    args = args.split()
    if debug == "1":
        assert build_temp.endswith("-debug")
        assert {"-O0", "-g", "-UNDEBUG", "-DTORCHNEURON_DEBUG=1"} <= set(args) and "-O2" not in args
    else:
        assert not build_temp.endswith("-debug")
        assert "-O2" in args and not any(a.startswith(("-O0", "-UNDEBUG", "-DTORCHNEURON_DEBUG")) for a in args)


def test_bootstrap_rerun_is_quick():
    if pathlib.Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        pytest.skip("runs in the checkout's .venv only")
    check = subprocess.run(["bash", "scripts/bootstrap.sh", "--check"], cwd=ROOT, capture_output=True, text=True)
    if check.returncode != 0:
        pytest.skip("the checkout changed since the last scripts/bootstrap.sh")
    start = time.perf_counter()
    run = subprocess.run(["bash", "scripts/bootstrap.sh"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    elapsed = time.perf_counter() - start
    assert run.returncode == 0, run.stderr
    assert "torchneuron ready" in run.stdout
    assert elapsed < 30, f"a re-run on an unchanged checkout took {elapsed:.1f} s"


@pytest.mark.skipif(os.environ.get("TORCHNEURON_TEST_WHEEL") != "1", reason="set TORCHNEURON_TEST_WHEEL=1 (minutes)")
def test_wheel_installs_into_another_environment(tmp_path):
    """Builds a wheel with this environment's torch, installs it into a new venv with torch
    2.13.0, and uses it there: autoload, package data, torch_neuronx and `torchneuron migrate`."""
    dist_dir, venv = tmp_path / "dist", tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", ".", "--no-build-isolation", "--no-deps",
                    "-w", str(dist_dir)], cwd=ROOT, check=True)
    (wheel,) = dist_dir.glob("torchneuron-*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "-q", TORCH_PIN], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", str(wheel)], check=True)
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    check = ("import torch, importlib.resources as r, importlib.util; print(torch.neuron.device_count()); "
             "print(r.files('torchneuron.data').joinpath('tiny_corpus.txt').is_file()); "
             "print(importlib.util.find_spec('torch_neuronx') is not None)")
    out = subprocess.run([python, "-c", check], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [os.environ.get("TORCHNEURON_NUM_DEVICES", "2"), "True", "True"]
    source = tmp_path / "uses_cuda.py"
    source.write_text("import torch\nx = torch.zeros(3).cuda()\n")
    out = subprocess.run([venv / "bin" / "torchneuron", "migrate", str(source)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, check=True)
    assert ".to(device)" in out.stdout
