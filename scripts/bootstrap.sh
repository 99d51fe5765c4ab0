#!/usr/bin/env bash
# Creates .venv with torch 2.13.0 (CPU) and torchneuron built from this checkout.
# Re-running it is cheap: pip skips what is installed and the build is incremental.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q "torch==2.13.0" setuptools wheel ninja numpy tqdm \
    pytest hypothesis expecttest libcst
# torch must be importable while the C++ core builds, hence no build isolation.
MAX_JOBS=${MAX_JOBS:-$(nproc)} .venv/bin/python -m pip install -q --no-build-isolation --no-deps -e .
.venv/bin/python -c "import torch; assert torch.accelerator.current_accelerator().type == 'neuron'; print('torchneuron ready:', torch.neuron.device_count(), 'neuron devices')"
