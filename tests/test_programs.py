"""Programs written for the CPU run on neuron with only the device string changed.

Each example in ``examples/`` trains a model for a few steps, checkpoints it
with ``torch.save``, reloads it onto the device, evaluates it and trains a few
more steps. Run on ``"cpu"`` and on ``"neuron"`` in one process, its float32
losses must agree to 1e-5 when the device's random ops draw the CPU's numbers
(HostRNGMode; on its own the device draws from its Philox stream, as CUDA does).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from torchneuron.migrate.host_rng import HostRNGMode

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
STEPS = 3


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["train_cnn", "train_lstm", "train_transformer"])
def test_losses_match_cpu(name):
    example = load_example(name)
    cpu = example.main("cpu", STEPS, 0)
    with HostRNGMode():
        neuron = example.main("neuron", STEPS, 0)
    own = [example.main("neuron", STEPS, 0) for _ in range(2)]  # the device's own stream: reproducible
    assert own[0] == own[1] and all(torch.isfinite(torch.tensor(own[0]["losses"])))

    assert len(cpu["losses"]) == STEPS and len(cpu["losses_after_reload"]) > 0
    for key in ("losses", "eval_loss", "losses_after_reload"):
        torch.testing.assert_close(neuron[key], cpu[key], rtol=1e-5, atol=1e-5, msg=lambda m: f"{key}: {m}")
    # Training did something: the losses are finite and not all the same.
    losses = cpu["losses"] + cpu["losses_after_reload"]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert len(set(losses)) > 1


def test_example_runs_as_a_script():
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "train_cnn.py"), "--device", "neuron", "--steps", "2"],
        capture_output=True, text=True, timeout=120, env=env, cwd=EXAMPLES.parent,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "step 0", "step 1", "eval loss after reload", "step 2 (after reload)", "step 3 (after reload)",
    ], proc.stdout


def _noise_then_dropout(device):
    torch.manual_seed(0)
    x = torch.ones(64, device=device)
    noisy = x + 0.1 * torch.randn_like(x)  # randn_like draws from the device's generator
    return F.dropout(noisy, 0.5).cpu()  # so does dropout


def test_dropout_draws_from_the_device_generator():
    torch.manual_seed(0)
    before = torch.neuron.get_rng_state()
    F.dropout(torch.ones(16, device="neuron"), 0.5)
    assert not torch.equal(before, torch.neuron.get_rng_state()), "dropout left the neuron generator untouched"
    torch.testing.assert_close(_noise_then_dropout("neuron"), _noise_then_dropout("neuron"), rtol=0, atol=0)
    with HostRNGMode():
        torch.testing.assert_close(_noise_then_dropout("neuron"), _noise_then_dropout("cpu"))
