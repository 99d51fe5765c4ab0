"""Running the device suite again in a mode (strict mode, fused eager), for the tests that do."""

from __future__ import annotations

import os
import subprocess
import sys


def assert_suite_passes_with(env: dict, files: list[str]) -> None:
    """Runs the test files again in a new pytest process with `env` added to the environment, and
    asserts that they all pass (a mode's run of the device suite: strict mode, fused eager)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *files],
                          cwd=root, env=dict(os.environ, **env), capture_output=True, text=True, timeout=1800)
    tail = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout.splitlines()[-1] and "failed" not in proc.stdout.splitlines()[-1], tail
