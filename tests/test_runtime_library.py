"""The runtime (csrc/runtime/) as a library of its own: built without PyTorch, its contract tested alone.

tests/runtime/test_runtime.cpp checks what neuron_runtime.h promises a caller (and so what a driver
for silicon must provide): capacity and out-of-memory, copies, stream order, events, launches,
asynchronous errors, activity records and strict mode's protection. It is built here from the
runtime's sources alone, with no include path to PyTorch's headers, and run in each mode.
"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUNTIME = ROOT / "csrc" / "runtime"
MODES = {
    "default": {},
    "async": {"TORCHNEURON_ASYNC": "1"},
    "strict": {"TORCHNEURON_STRICT": "1"},
    "strict-sync": {"TORCHNEURON_STRICT": "1", "TORCHNEURON_ASYNC": "0"},
}
FAULT = "torchneuron strict mode (TORCHNEURON_STRICT=1): the host accessed neuron:0 device memory"


def _build(directory: Path, *flags: str, main: Path = ROOT / "tests" / "runtime" / "test_runtime.cpp") -> Path:
    """A program linked with the runtime's sources only."""
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.fail("no C++ compiler: the runtime's own tests need one (building torchneuron does too)")
    binary = directory / main.stem
    sources = sorted(str(p) for p in RUNTIME.glob("*.cpp"))
    proc = subprocess.run([cxx, "-std=c++17", *flags, "-Wall", "-Werror", "-pthread", "-o", str(binary), *sources,
                           str(main)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return binary


@pytest.fixture(scope="module")
def runtime_test(tmp_path_factory) -> Path:
    """The contract test, compiled and linked with the runtime's sources only."""
    return _build(tmp_path_factory.mktemp("runtime"), "-O1")


def test_the_runtime_includes_nothing_of_pytorch():
    for path in sorted(RUNTIME.iterdir()):
        includes = [line for line in path.read_text().splitlines() if line.startswith("#include")]
        assert not any(name in line for line in includes for name in ("torch", "ATen", "c10")), path


@pytest.mark.parametrize("mode", list(MODES))
def test_the_runtime_keeps_its_contract(runtime_test, mode):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHNEURON_")}
    env.update(TORCHNEURON_NUM_DEVICES="2", TORCHNEURON_DEVICE_MEMORY="64MiB", **MODES[mode])
    proc = subprocess.run([str(runtime_test)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    strict = "strict" in mode
    async_ = mode in ("async", "strict")
    assert f"runtime contract: ok (async {int(async_)}, strict {int(strict)})" in proc.stdout
    # Strict mode: each access the test expects to fault (in a child process) was reported as one.
    assert proc.stderr.count(FAULT) == (7 if strict else 0), proc.stderr[-4000:]


def test_the_debug_build_keeps_the_contract_and_checks_its_invariants(tmp_path):
    # The debug build's flags (setup.py with TORCHNEURON_DEBUG=1): the contract holds with the
    # runtime's assertions compiled in, and a broken invariant stops at its assertion.
    flags = ("-O0", "-g", "-DTORCHNEURON_DEBUG=1")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHNEURON_")}
    env.update(TORCHNEURON_NUM_DEVICES="2", TORCHNEURON_DEVICE_MEMORY="64MiB")
    proc = subprocess.run([str(_build(tmp_path, *flags))], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "runtime contract: ok" in proc.stdout
    broken = tmp_path / "over_release.cpp"
    broken.write_text(
        '#include "neuron_runtime.h"\n'
        "int main() {\n"
        "  using namespace torchneuron::rt;\n"
        "  if (reserve(0, 100) != Status::Success) return 1;\n"
        "  release(0, 200);  // more than was reserved\n"
        "  return 0;\n"
        "}\n")
    checked = _build(tmp_path, *flags, f"-I{RUNTIME}", main=broken)
    proc = subprocess.run([str(checked)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "internal assertion failed" in proc.stderr and "released more bytes than it had reserved" in proc.stderr
    (tmp_path / "release").mkdir()
    unchecked = _build(tmp_path / "release", "-O1", f"-I{RUNTIME}", main=broken)  # assertions compiled out
    assert subprocess.run([str(unchecked)], env=env, capture_output=True, timeout=60).returncode == 0
