#!/usr/bin/env bash
# Builds a release: the sdist and the wheel into dist/ (or $1), then installs the wheel into a new
# environment with the torch it pins and runs scripts/smoke_test.py there, with and without autoload.
#
#   bash scripts/release.sh [OUTDIR]
#
# Run it from a checkout set up by scripts/bootstrap.sh (the build uses .venv's torch, without build
# isolation, as the README's "Install as a library" does). PYTHON overrides the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=$(realpath -m "${1:-dist}")
version=$("$PY" -c "import ast, pathlib; t = ast.parse(pathlib.Path('torchneuron/version.py').read_text()); \
print(next(n.value.value for n in t.body if isinstance(n, ast.Assign) and n.targets[0].id == '__version__'))")
torch_pin=$("$PY" -c "import ast, pathlib; t = ast.parse(pathlib.Path('torchneuron/version.py').read_text()); \
print(next(n.value.value for n in t.body if isinstance(n, ast.Assign) and n.targets[0].id == 'torch'))")
echo "release: torchneuron $version for torch $torch_pin into $OUT"

mkdir -p "$OUT"
rm -f "$OUT"/torchneuron-"$version"*
"$PY" -m build --no-isolation --sdist --wheel --outdir "$OUT" . >"$OUT/build.log" 2>&1 || {
    tail -40 "$OUT/build.log"; echo "release: the build failed (whole log: $OUT/build.log)"; exit 1; }
sdist=$(ls "$OUT"/torchneuron-"$version".tar.gz)
wheel=$(ls "$OUT"/torchneuron-"$version"-*.whl)
echo "release: built $(basename "$sdist") and $(basename "$wheel")"
# The wheel carries the runtime library beside _C, which loads it from there ($ORIGIN).
"$PY" -c "import sys, zipfile; names = zipfile.ZipFile(sys.argv[1]).namelist(); \
missing = [n for n in ('torchneuron/libtorchneuron_runtime.so',) if n not in names]; \
sys.exit(f'release: the wheel lacks {missing}') if missing else None" "$wheel"

# The wheel in a new environment, away from the checkout (so nothing of it is imported).
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PY" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q "torch==$torch_pin"
"$work/venv/bin/python" -m pip install -q "$wheel"
cp scripts/smoke_test.py "$work/"
(cd "$work" && env -u PYTHONPATH "$work/venv/bin/python" smoke_test.py)
echo "release: torchneuron $version passed the smoke test in a new environment"
