"""Hugging Face accelerate and transformers on neuron, found through the ``torch_neuronx`` module.

No test code tells either library about neuron: they find the device the way
they find AWS's native backend (``find_spec("torch_neuronx")``, then
``torch.neuron``), which torchneuron's compatibility module answers.

* 1 process: ``TrainingArguments`` picks ``neuron:0``; ``Trainer`` trains a
  small GPT-2 with the same losses and weights as on the CPU; ``Accelerator``
  picks neuron, and its step and bf16 autocast work there.
* 2 processes, under ``accelerate launch`` and under ``torchrun``
  (``tests/data/hf_distributed_worker.py``): ``DistributedType.MULTI_NEURON`` on
  the ``neuron`` process group, one device per rank, and a DDP step equal to the
  CPU step on the whole batch.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "data" / "hf_distributed_worker.py"
LAUNCH_TIMEOUT = 180

transformers = pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")

from accelerate import Accelerator  # noqa: E402
from accelerate.state import AcceleratorState  # noqa: E402
from accelerate.utils import DistributedType  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """accelerate keeps one process-wide state; each test starts and ends without one."""
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def _tiny_gpt2() -> GPT2LMHeadModel:
    """A 2-layer GPT-2 with random weights, built on the CPU from a fixed seed, without dropout."""
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32, bos_token_id=63,
                        eos_token_id=63, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    return GPT2LMHeadModel(config)


def _token_rows(rows: int = 16, length: int = 16) -> list[dict]:
    ids = torch.randint(0, 64, (rows, length), generator=torch.Generator().manual_seed(1))
    return [{"input_ids": row, "labels": row} for row in ids]


# ================================ the module ============================================================

def test_torch_neuronx_is_torchneuron_compatibility_module():
    import torch_neuronx
    from packaging.version import Version

    import torchneuron

    assert torch_neuronx.__version__ == f"{torchneuron.__version__}+torchneuron.compat"
    assert Version(torch_neuronx.__version__).local == "torchneuron.compat"
    for name, caller in torch_neuronx.TORCH_NEURON_CALLS.items():
        assert callable(getattr(torch.neuron, name, None)), f"torch.neuron.{name} (called by {caller}) is missing"
    assert torch.distributed.Backend.default_device_backend_map["neuron"] == torch_neuronx.DISTRIBUTED_BACKEND
    assert torch_neuronx.COMPILE_BACKEND in torch._dynamo.list_backends(exclude_tags=())
    # Nothing that stands for a chip: AWS's chip APIs are absent and say why.
    for name in ("trace", "DataParallel", "xla_impl", "utils"):
        assert not hasattr(torch_neuronx, name)
    with pytest.raises(AttributeError, match="torchneuron's compatibility module"):
        torch_neuronx.trace
    # optimum-neuron reads the distribution's version, transformers' XLA path needs torch_xla: both stay off.
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("torch_neuronx")
    from transformers.utils import is_torch_neuroncore_available
    assert not is_torch_neuroncore_available(check_device=False)


def test_libraries_detect_neuron():
    from accelerate.utils import is_neuron_available
    from transformers.utils import is_torch_bf16_gpu_available, is_torch_neuron_available

    assert is_neuron_available() and is_neuron_available(check_device=True)
    assert is_torch_neuron_available() and is_torch_neuron_available(check_device=True)
    assert is_torch_bf16_gpu_available()


def test_installed_torchneuron_exposes_torch_neuronx(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = ("import importlib.util; spec = importlib.util.find_spec('torch_neuronx'); "
            "print(spec.origin if spec else '')")
    found = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=60)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip(), "the installed torchneuron does not expose the top-level torch_neuronx package"
    assert Path(found.stdout.strip()).resolve() == (ROOT / "torch_neuronx" / "__init__.py").resolve()


# ================================ one process ===========================================================

def test_training_arguments_pick_neuron(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path))
    assert args.device == torch.device("neuron", 0)
    assert str(args.parallel_mode) == "ParallelMode.NOT_PARALLEL"
    assert args.distributed_state.distributed_type == DistributedType.NO
    assert TrainingArguments(output_dir=str(tmp_path), use_cpu=True).device == torch.device("cpu")


def _train(output_dir: Path, use_cpu: bool) -> tuple[torch.device, list[float], dict[str, torch.Tensor]]:
    args = TrainingArguments(output_dir=str(output_dir), use_cpu=use_cpu, per_device_train_batch_size=4,
                             max_steps=4, learning_rate=1e-2, logging_steps=1, save_strategy="no", report_to=[],
                             seed=0, disable_tqdm=True)
    trainer = Trainer(model=_tiny_gpt2(), args=args, train_dataset=_token_rows())
    trainer.train()
    device = next(trainer.model.parameters()).device
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    weights = {name: p.detach().cpu() for name, p in trainer.model.named_parameters()}
    return device, losses, weights


def test_trainer_on_neuron_matches_cpu(tmp_path):
    device, losses, weights = _train(tmp_path / "neuron", use_cpu=False)
    AcceleratorState._reset_state(reset_partial_state=True)
    cpu_device, cpu_losses, cpu_weights = _train(tmp_path / "cpu", use_cpu=True)

    assert device == torch.device("neuron", 0)
    assert cpu_device == torch.device("cpu")
    assert len(losses) == 4
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(cpu_losses))
    torch.testing.assert_close(weights, cpu_weights)


def _train_with_dropout(output_dir: Path, gradient_checkpointing: bool) -> list[float]:
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32, bos_token_id=63,
                        eos_token_id=63, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(output_dir=str(output_dir), per_device_train_batch_size=4, max_steps=4,
                             learning_rate=1e-2, logging_steps=1, save_strategy="no", report_to=[], seed=0,
                             disable_tqdm=True, gradient_checkpointing=gradient_checkpointing)
    trainer = Trainer(model=model, args=args, train_dataset=_token_rows())
    trainer.train()
    assert next(trainer.model.parameters()).device == torch.device("neuron", 0)
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def test_trainer_gradient_checkpointing_with_dropout_trains_as_without(tmp_path):
    # Recomputing a checkpointed layer must draw the dropout masks of its forward pass again
    # (torch.utils.checkpoint restores the device's random state), so the losses are the plain run's.
    plain = _train_with_dropout(tmp_path / "plain", gradient_checkpointing=False)
    AcceleratorState._reset_state(reset_partial_state=True)
    checkpointed = _train_with_dropout(tmp_path / "checkpointed", gradient_checkpointing=True)
    assert len(plain) == 4
    torch.testing.assert_close(torch.tensor(checkpointed), torch.tensor(plain), rtol=1e-6, atol=1e-6)


def test_accelerator_picks_neuron():
    accelerator = Accelerator()
    assert accelerator.device.type == "neuron"
    assert accelerator.distributed_type == DistributedType.NO
    assert accelerator.num_processes == 1

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    reference = torch.nn.Linear(8, 4)
    reference.load_state_dict(model.state_dict())
    x, y = torch.randn(6, 8), torch.randn(6, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model, optimizer = accelerator.prepare(model, optimizer)
    assert next(model.parameters()).device.type == "neuron"
    accelerator.backward(torch.nn.functional.mse_loss(model(x.to(accelerator.device)), y.to(accelerator.device)))
    optimizer.step()
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    torch.nn.functional.mse_loss(reference(x), y).backward()
    reference_optimizer.step()
    torch.testing.assert_close({k: v.cpu() for k, v in model.state_dict().items()}, reference.state_dict())


def test_accelerator_bf16_autocasts_on_neuron():
    accelerator = Accelerator(mixed_precision="bf16")
    x = torch.randn(4, 8, device=accelerator.device)
    with accelerator.autocast():
        assert torch.is_autocast_enabled("neuron")
        assert (x @ x.T).dtype == torch.bfloat16


# ================================ two processes =========================================================

def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _console_script(name: str, module: str) -> list[str]:
    """The library's command next to this interpreter (as a user types it), else its module."""
    script = Path(sys.executable).parent / name
    return [str(script)] if script.exists() else [sys.executable, "-m", module]


def _launch_command(launcher: str, port: int) -> list[str]:
    if launcher == "accelerate":
        return [*_console_script("accelerate", "accelerate.commands.accelerate_cli"), "launch",
                "--num_processes", "2", "--main_process_ip", "127.0.0.1", "--main_process_port", str(port)]
    return [*_console_script("torchrun", "torch.distributed.run"), "--nproc-per-node", "2",
            "--master-addr", "127.0.0.1", "--master-port", str(port)]


@pytest.mark.parametrize("launcher", ["accelerate", "torchrun"])
def test_two_processes_are_multi_neuron(tmp_path, launcher):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TORCHELASTIC_", "ACCELERATE_")) and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env.update(HF_HOME=str(tmp_path / "hf"),  # no accelerate config of the user's: the launch is unconfigured
               HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TORCHNEURON_NUM_DEVICES="2", GLOO_SOCKET_IFNAME="lo",
               PYTHONWARNINGS="ignore")
    command = [*_launch_command(launcher, _free_port()), str(WORKER), str(tmp_path)]
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT)
    assert run.returncode == 0, f"{' '.join(command)} failed:\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"

    results = [json.loads((tmp_path / f"result_{rank}.json").read_text()) for rank in range(2)]
    for rank, result in enumerate(results):
        assert result["rank"] == rank and result["world"] == 2
        assert result["distributed_type"] == str(DistributedType.MULTI_NEURON)
        assert result["backend"] == "neuron"
        assert result["device"] == result["parameter_device"] == f"neuron:{rank}"
        assert result["ddp"] == "DistributedDataParallel"
        # Each rank stepped on its half of the batch: with averaged gradients that is the whole-batch step.
        assert result["max_difference_from_cpu_full_batch"] < 1e-6
        assert result["trainer_device"] == result["trainer_parameter_device"] == f"neuron:{rank}"
        assert result["parallel_mode"] == "ParallelMode.DISTRIBUTED"
        assert len(result["losses"]) == 3
    assert results[0]["checksum"] == results[1]["checksum"]
    assert results[0]["losses"] == results[1]["losses"]

