"""Shared fixtures of the neuron device tests.

The emulator exposes ``TORCHNEURON_NUM_DEVICES`` devices (2 by default), so
tests may use ``neuron:0`` and ``neuron:1``. Every test ends on device 0 with
the default streams current, whatever it did in between.
"""

import os
import subprocess
import sys

import pytest
import torch

import torchneuron  # noqa: F401  (also autoloaded by `import torch`)


@pytest.fixture(autouse=True)
def _restore_device_state():
    """Put the current device back to 0 and every device's default stream back after each test."""
    yield
    # set_stream also makes the stream's device current (as torch.cuda.set_stream does),
    # so the current device is restored last.
    for i in range(torch.neuron.device_count()):
        torch.neuron.set_stream(torch.neuron.default_stream(i))
    torch.neuron.set_device(0)


@pytest.fixture(scope="session")
def two_devices():
    """neuron:0 and neuron:1 (skipped, visibly, if fewer than two devices exist)."""
    if torch.neuron.device_count() < 2:
        pytest.skip("needs TORCHNEURON_NUM_DEVICES >= 2")
    return torch.device("neuron:0"), torch.device("neuron:1")


def _device_works(device="neuron"):
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    b = torch.full((3, 2), 0.5)
    out = (a.to(device) @ b.to(device) + 1).relu().sum(0)
    assert out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), (a @ b + 1).relu().sum(0))
    return True


@pytest.fixture(scope="session")
def device_works():
    """``device_works(device="neuron")``: assert a small computation on the device matches the CPU."""
    return _device_works


def _run_python(code, env=None, timeout=120):
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full_env, timeout=timeout)


@pytest.fixture(scope="session")
def run_python():
    """``run_python(code, env=None)``: run code in a fresh interpreter, return the CompletedProcess."""
    return _run_python
