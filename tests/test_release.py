"""Releases: the version scheme, the sdist's contents, the smoke test (scripts/smoke_test.py) in this
environment, and (with TORCHNEURON_TEST_WHEEL=1, minutes) scripts/release.sh end to end: sdist and
wheel built, the wheel installed into a new environment and smoke-tested there."""

import importlib.metadata
import os
import pathlib
import re
import subprocess
import sys
import tarfile

import pytest
import torch

import torchneuron
import torchneuron.version

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_version_is_one_string_everywhere():
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.dev\d+)?", torchneuron.__version__)
    assert torchneuron.__version__ == torchneuron.version.__version__
    assert importlib.metadata.version("torchneuron") == torchneuron.__version__
    assert torch.__version__.split("+")[0] == torchneuron.version.torch
    assert f"torch=={torchneuron.version.torch}" in importlib.metadata.requires("torchneuron")
    # the changelog has a section for the version being made
    release = torchneuron.__version__.split(".dev")[0]
    assert f"## {release}" in (ROOT / "CHANGELOG.md").read_text()


def test_the_runtime_interface_version_is_the_headers():
    header = (ROOT / "csrc" / "runtime" / "neuron_runtime.h").read_text()
    major = int(re.search(r"#define TNRT_API_VERSION_MAJOR (\d+)", header).group(1))
    minor = int(re.search(r"#define TNRT_API_VERSION_MINOR (\d+)", header).group(1))
    assert torchneuron.version.runtime_api == (major, minor)
    with pytest.raises(AttributeError):
        torchneuron.version.no_such_version  # noqa: B018


def test_the_sdist_carries_what_a_build_from_source_needs(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--sdist", "--outdir", str(tmp_path), "."],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (sdist,) = tmp_path.glob(f"torchneuron-{torchneuron.__version__}.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "csrc").rglob("*") if p.suffix in (".cpp", ".h", ".inl", ".map")}
    assert sources and sources <= names, sorted(sources - names)
    assert {"setup.py", "pyproject.toml", "README.md", "CHANGELOG.md", "SECURITY.md",
            "torchneuron/version.py", "torchneuron/data/tiny_corpus.txt"} <= names


def test_the_smoke_test_passes_with_and_without_autoload(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "smoke_test.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "smoke test passed (autoload on)" in proc.stdout
    assert "smoke test passed (autoload off)" in proc.stdout


def test_the_smoke_test_fails_on_a_wrong_answer(tmp_path):
    # A smoke test that cannot fail proves nothing: a device whose matmul is wrong must stop it.
    script = (f"import sys; sys.path.insert(0, {str(ROOT / 'scripts')!r}); import torch, smoke_test\n"
              "real = torch.Tensor.__matmul__\n"
              "torch.Tensor.__matmul__ = lambda a, b: real(a, b) + (1 if a.device.type == 'neuron' else 0)\n"
              "smoke_test.check_matmul_and_autograd()\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "Tensor-likes are not close" in proc.stderr


@pytest.mark.skipif(os.environ.get("TORCHNEURON_TEST_WHEEL") != "1", reason="set TORCHNEURON_TEST_WHEEL=1 (minutes)")
def test_the_release_script_builds_installs_and_smoke_tests_the_wheel(tmp_path):
    proc = subprocess.run(["bash", "scripts/release.sh", str(tmp_path / "dist")], cwd=ROOT, capture_output=True,
                          text=True, timeout=3600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    version = torchneuron.__version__
    assert (tmp_path / "dist" / f"torchneuron-{version}.tar.gz").is_file()
    assert list((tmp_path / "dist").glob(f"torchneuron-{version}-*.whl"))
    assert "smoke test passed (autoload on)" in proc.stdout
    assert "smoke test passed (autoload off)" in proc.stdout
    assert f"torchneuron {version} passed the smoke test in a new environment" in proc.stdout
