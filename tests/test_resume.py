"""Crash and resume under torchrun: a rank dies mid-run, the job restarts from its last
torch.distributed.checkpoint save, and its final weights equal an uninterrupted run's bit for bit."""

import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).parent / "data" / "resume_train.py"


def _torchrun(tmp: Path, wrap: str, *extra: str, restarts: int = 1) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHNEURON_STRICT", "TORCHNEURON_ASYNC"))}
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", TORCHNEURON_NUM_DEVICES="2", PYTHONWARNINGS="ignore")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "--max-restarts", str(restarts), str(SCRIPT), "neuron", wrap, str(tmp), *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def _final(tmp: Path) -> dict:
    return torch.load(tmp / "final.pt")


@pytest.mark.parametrize("wrap", ["ddp", "fsdp2"])
def test_a_crashed_rank_resumes_to_the_uninterrupted_weights(tmp_path, wrap):
    crashed, clean = tmp_path / "crashed", tmp_path / "clean"
    crashed.mkdir()
    clean.mkdir()
    run = _torchrun(crashed, wrap, "--crash")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # The first attempt died after step 3; the restart resumed there on both ranks.
    assert "rank 0 attempt 1 starts at step 3" in run.stdout and "rank 1 attempt 1 starts at step 3" in run.stdout, run.stdout
    base = _torchrun(clean, wrap)
    assert base.returncode == 0, base.stdout[-3000:] + base.stderr[-3000:]
    assert "attempt 1" not in base.stdout
    got, want = _final(crashed), _final(clean)
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k


def test_a_truncated_checkpoint_fails_clearly_and_overwrites_nothing(tmp_path):
    run = _torchrun(tmp_path, "ddp")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (tmp_path / "step").write_text("3")  # resume from the saved checkpoint ...
    shard = sorted(glob.glob(str(tmp_path / "dcp" / "*.distcp")))[0]
    with open(shard, "r+b") as f:  # ... whose first shard lost its second half
        f.truncate(os.path.getsize(shard) // 2)
    saved = {p: (os.path.getsize(p), os.path.getmtime(p)) for p in glob.glob(str(tmp_path / "dcp" / "*"))}
    again = _torchrun(tmp_path, "ddp", restarts=0)
    assert again.returncode != 0
    out = again.stdout + again.stderr
    # PyTorch's own error: a CheckpointException naming the ranks whose reads failed, with each one's cause
    # (the truncated shard's pickle ends early: EOFError).
    assert "CheckpointException ranks:dict_keys([0, 1])" in out and "EOFError" in out, out[-3000:]
    assert {p: (os.path.getsize(p), os.path.getmtime(p)) for p in glob.glob(str(tmp_path / "dcp" / "*"))} == saved
    assert (tmp_path / "step").read_text() == "3"
