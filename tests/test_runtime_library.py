"""The runtime (csrc/runtime/) as a library of its own: built without PyTorch, its contract tested alone.

tests/runtime/test_runtime.cpp checks what neuron_runtime.h promises a caller (and so what a driver
for silicon must provide), through the C++ conveniences of neuron_runtime.inl: capacity and
out-of-memory, copies, stream order, events, launches, asynchronous errors, activity records and
strict mode's protection; tests/runtime/test_c_api.c checks the C API from C. Both are linked here with
the runtime library built from the runtime's sources alone (no include path to PyTorch's headers),
and run in each mode. The library setup.py builds (torchneuron/libtorchneuron_runtime.so) is checked
to export its C API alone and to need nothing of PyTorch, and _C to load it from beside itself.
"""

import os
import re
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


def _compiler(c: bool = False) -> str:
    compiler = os.environ.get("CC" if c else "CXX") or shutil.which("cc" if c else "c++") or shutil.which(
        "gcc" if c else "g++")
    if compiler is None:
        pytest.fail("no C/C++ compiler: the runtime's own tests need one (building torchneuron does too)")
    return compiler


def _run(command: list) -> None:
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]


def _library(directory: Path, *flags: str) -> Path:
    """The runtime library, from the runtime's sources alone, linked as setup.py links it."""
    library = directory / "libtorchneuron_runtime.so"
    if not library.exists():
        sources = sorted(str(p) for p in RUNTIME.glob("*.cpp"))
        _run([_compiler(), "-std=c++17", *flags, "-Wall", "-Werror", "-pthread", "-fPIC", "-shared",
              "-fvisibility=hidden", f"-Wl,--version-script={RUNTIME / 'exports.map'}", "-o", str(library), *sources])
    return library


def _build(directory: Path, *flags: str, main: Path = ROOT / "tests" / "runtime" / "test_runtime.cpp") -> Path:
    """A program (C++ or C) linked with the runtime library alone."""
    _library(directory, *flags)
    binary = directory / main.stem
    c = main.suffix == ".c"
    _run([_compiler(c), "-std=c11" if c else "-std=c++17", *flags, "-Wall", "-Werror", "-pthread", f"-I{RUNTIME}",
          "-o", str(binary), str(main), f"-L{directory}", "-ltorchneuron_runtime", f"-Wl,-rpath,{directory}"])
    return binary


@pytest.fixture(scope="module")
def runtime_build(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runtime")


@pytest.fixture(scope="module")
def runtime_test(runtime_build) -> Path:
    """The contract test, linked with the runtime library alone."""
    return _build(runtime_build, "-O1")


@pytest.fixture(scope="module")
def c_api_test(runtime_build) -> Path:
    """The C API's test, a C program linked with the runtime library alone."""
    return _build(runtime_build, "-O1", main=ROOT / "tests" / "runtime" / "test_c_api.c")


def _env(mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHNEURON_")}
    env.update(TORCHNEURON_NUM_DEVICES="2", TORCHNEURON_DEVICE_MEMORY="64MiB", **MODES[mode])
    return env


def test_the_runtime_includes_nothing_of_pytorch():
    for path in sorted(RUNTIME.iterdir()):
        includes = [line for line in path.read_text().splitlines() if line.startswith("#include")]
        assert not any(name in line for line in includes for name in ("torch", "ATen", "c10")), path


@pytest.mark.parametrize("mode", list(MODES))
def test_the_runtime_keeps_its_contract(runtime_test, mode):
    proc = subprocess.run([str(runtime_test)], env=_env(mode), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    strict = "strict" in mode
    async_ = mode in ("async", "strict")
    assert f"runtime contract: ok (async {int(async_)}, strict {int(strict)})" in proc.stdout
    # Strict mode: each access the test expects to fault (in a child process) was reported as one.
    assert proc.stderr.count(FAULT) == (7 if strict else 0), proc.stderr[-4000:]


@pytest.mark.parametrize("mode", list(MODES))
def test_the_c_api_from_c(c_api_test, mode):
    proc = subprocess.run([str(c_api_test)], env=_env(mode), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert f"runtime C API: ok (async {int(mode in ('async', 'strict'))}, strict {int('strict' in mode)})" in proc.stdout


def _dynamic(library: Path) -> str:
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.fail("readelf (binutils) is needed to read the libraries' dynamic sections")
    return subprocess.run([readelf, "-W", "--dyn-syms", "-d", str(library)], capture_output=True, text=True,
                          check=True).stdout


def test_the_built_library_exports_its_c_api_alone_and_needs_nothing_of_pytorch():
    built = ROOT / "torchneuron" / "libtorchneuron_runtime.so"
    if not built.exists():
        pytest.fail(f"{built} is not built: run setup.py build_ext --inplace")
    dynamic = _dynamic(built)
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)
    assert needed and not any(n.startswith(("libtorch", "libc10", "libpython")) for n in needed), needed
    exported = {line.split()[-1] for line in dynamic.splitlines()
                if re.search(r"\s(FUNC|OBJECT)\s+(GLOBAL|WEAK)\s+DEFAULT\s+\d+\s", line)}
    assert exported and all(name.startswith("tnrt") for name in exported), sorted(exported)[:20]
    header = (RUNTIME / "neuron_runtime.h").read_text()
    declared = set(re.findall(r"TNRT_API [^;]*?\b(tnrt\w+)\(", header))
    assert declared == exported, (declared ^ exported)


def test_c_loads_the_library_beside_it():
    built = sorted((ROOT / "torchneuron").glob("_C*.so"))
    assert built, "torchneuron._C is not built"
    dynamic = _dynamic(built[0])
    assert "[libtorchneuron_runtime.so]" in dynamic
    assert re.search(r"\((RUNPATH|RPATH)\)\s+Library (runpath|rpath): \[\$ORIGIN\]", dynamic), dynamic[:2000]


def test_the_debug_build_keeps_the_contract_and_checks_its_invariants(tmp_path):
    # The debug build's flags (setup.py with TORCHNEURON_DEBUG=1): the contract holds with the
    # runtime's assertions compiled in, and a broken invariant stops at its assertion.
    flags = ("-O0", "-g", "-DTORCHNEURON_DEBUG=1")
    env = _env("default")
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
    checked = _build(tmp_path, *flags, main=broken)  # the debug-built library's assertion
    proc = subprocess.run([str(checked)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "internal assertion failed" in proc.stderr and "released more bytes than it had reserved" in proc.stderr
    (tmp_path / "release").mkdir()
    unchecked = _build(tmp_path / "release", "-O1", main=broken)  # assertions compiled out
    assert subprocess.run([str(unchecked)], env=env, capture_output=True, timeout=60).returncode == 0
