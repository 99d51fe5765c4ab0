"""PyTorch Lightning on neuron: ``Trainer(accelerator="neuron")`` (torchneuron/integrations/lightning.py).

* 1 device, in this process: the same training as ``accelerator="cpu"``, with
  the model and batches on ``neuron:0``, and no ``torch.cuda`` call beyond those
  Lightning makes on the CPU as well.
* 2 devices with Lightning's DDP, which starts rank 1 by running the script
  again (``tests/data/lightning_train.py``): the ``neuron`` process group, rank r
  on ``neuron:r``, both ranks ending with the parameters of one CPU process
  trained on the two ranks' batches together.
* ``TORCHNEURON_TRANSFER_CUDA=1``: a script written for ``accelerator="gpu"`` runs on neuron.
* Registration: by importing the module before or after Lightning, for both
  ``lightning.pytorch`` and ``pytorch_lightning``, and undone by ``unregister``.
"""

from __future__ import annotations

import functools
import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

L = pytest.importorskip("lightning")

import torchneuron.integrations.lightning as tl  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
sys.path.insert(0, str(DATA))
import lightning_model  # noqa: E402

SCRIPT = DATA / "lightning_train.py"
TIMEOUT = 150
QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
             use_distributed_sampler=False)


def _train(accelerator: str, batch_size: int = 4, devices=1, **kwargs):
    model = lightning_model.Regression(batch_size)
    trainer = L.Trainer(accelerator=accelerator, devices=devices, max_steps=lightning_model.STEPS, **QUIET,
                        **kwargs)
    trainer.fit(model)
    return trainer, model


@pytest.fixture
def cuda_calls(monkeypatch):
    """The names of the ``torch.cuda`` functions called while the test runs."""
    calls: list[str] = []

    def recording(name, fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            calls.append(name)
            return fn(*args, **kwargs)

        return call

    for name in dir(torch.cuda):
        value = getattr(torch.cuda, name)
        if name.startswith("_") or not callable(value) or isinstance(value, type(torch)):
            continue
        if isinstance(value, type) and name not in ("Stream", "Event", "StreamContext", "device"):
            continue
        monkeypatch.setattr(torch.cuda, name, recording(name, value))
    return calls


class _Runs:
    """The runs in fresh interpreters, all started at once so that they overlap, each read when its test asks."""

    def __init__(self, root: Path) -> None:
        self.root, self.procs = root, {}

    def start(self, key: str, args: list[str], **env: str) -> None:
        full_env = {**os.environ, "MASTER_ADDR": "127.0.0.1", **env}
        for name in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK"):
            full_env.pop(name, None)
        out = self.root / key
        out.mkdir()
        self.procs[key] = (out, subprocess.Popen([sys.executable, *[a.format(out=out) for a in args]], env=full_env,
                                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))

    def start_training(self, key: str, accelerator: str, devices: int, strategy: str, batch_size: int,
                       port: int, **env: str) -> None:
        self.start(key, [str(SCRIPT), "{out}", accelerator, str(devices), strategy, str(batch_size)],
                   MASTER_PORT=str(port), **env)

    def result(self, key: str) -> tuple[str, Path]:
        out, proc = self.procs[key]
        try:
            stdout, stderr = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
            pytest.fail(f"{key}: no end after {TIMEOUT} s\n{stdout[-2000:]}\n{stderr[-4000:]}")
        assert proc.returncode == 0, f"{key}:\n{stdout[-2000:]}\n{stderr[-5000:]}"
        return stdout, out

    def ranks(self, key: str, devices: int) -> list[dict]:
        _, out = self.result(key)
        return [torch.load(out / f"rank{r}.pt") for r in range(devices)]

    def stop(self) -> None:
        for _, proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


# torchneuron's import may happen inside Lightning's (torch's autoload does that): here it happens while
# pytorch_lightning is being imported; lightning.pytorch is imported afterwards.
LATER_IMPORT = """
import sys
class ImportTorchneuronInside:
    def find_spec(self, name, path, target=None):
        if name == 'lightning_fabric':
            sys.meta_path.remove(self)
            assert 'pytorch_lightning' in sys.modules
            import torchneuron.integrations.lightning
        return None
sys.meta_path.insert(0, ImportTorchneuronInside())
import pytorch_lightning as pl
import torchneuron.integrations.lightning as tl
assert tl.is_registered('pytorch_lightning') and not tl.is_registered('lightning.pytorch')
assert 'lightning.pytorch' not in sys.modules
import lightning
assert tl.is_registered('lightning.pytorch')
t = pl.Trainer(accelerator='neuron', devices=1, logger=False)
assert type(t.accelerator).__module__ == 'torchneuron.integrations.lightning'
assert isinstance(t.accelerator, pl.accelerators.Accelerator), type(t.accelerator).__mro__
print(t.strategy.root_device, lightning.Trainer(accelerator='neuron', devices=[1], logger=False).strategy.root_device)
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Starts every run in a fresh interpreter (a Lightning import each, DDP's rendezvous) side by side."""
    runs = _Runs(tmp_path_factory.mktemp("lightning"))
    sockets = [socket.socket() for _ in range(2)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    runs.start("later_import", ["-c", LATER_IMPORT])
    runs.start_training("transfer1", "gpu", 1, "auto", 4, ports[0], TORCHNEURON_TRANSFER_CUDA="1")
    if torch.neuron.device_count() >= 2:
        runs.start_training("ddp", "neuron", 2, "ddp", 4, ports[0])
        runs.start_training("transfer2", "gpu", 2, "auto", 4, ports[1], TORCHNEURON_TRANSFER_CUDA="1")
    yield runs
    runs.stop()


# ================================ one device ===========================================================

def test_one_device_trains_as_on_the_cpu(cuda_calls):
    _, cpu_model = _train("cpu")
    cpu_calls = set(cuda_calls)
    cuda_calls.clear()
    trainer, model = _train("neuron")
    assert type(trainer.accelerator).__name__ == "NeuronAccelerator"
    assert trainer.strategy.root_device == torch.device("neuron:0")
    assert model.seen == {"neuron:0"}, "parameters and batches were on neuron:0 during training"
    for p, q in zip(model.parameters(), cpu_model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach().cpu())
    assert set(cuda_calls) <= cpu_calls, f"torch.cuda calls of the neuron run only: {set(cuda_calls) - cpu_calls}"


def test_device_selection_and_stats():
    acc = tl.NeuronAccelerator
    n = torch.neuron.device_count()
    assert acc.parse_devices(1) == [0]
    assert acc.parse_devices(-1) == acc.parse_devices("auto") == list(range(n))
    assert acc.parse_devices("0,") == [0] and acc.parse_devices([n - 1]) == [n - 1]
    assert acc.get_parallel_devices(n) == [torch.device("neuron", i) for i in range(n)]
    assert acc.auto_device_count() == n and acc.is_available()
    for bad in (0, n + 1, [n], "x"):
        with pytest.raises(ValueError, match="NeuronAccelerator"):
            acc.parse_devices(bad)
    trainer = L.Trainer(accelerator="neuron", devices=[n - 1], **QUIET)
    assert trainer.strategy.root_device == torch.device("neuron", n - 1)
    # ddp_spawn pickles the Trainer: the accelerator's class is found again by name.
    assert type(pickle.loads(pickle.dumps(trainer.accelerator))) is type(trainer.accelerator)
    torch.ones(4, device="neuron")
    assert "allocated_bytes.all.current" in trainer.accelerator.get_device_stats(torch.device("neuron:0"))
    # Lightning's "auto" knows no registered accelerator: it stays on the CPU (see docs/ecosystem.md).
    assert type(L.Trainer(accelerator="auto", devices=1, **QUIET).accelerator).__name__ == "CPUAccelerator"


def test_bf16_mixed_autocasts_on_neuron():
    class Probe(lightning_model.Regression):
        def training_step(self, batch, batch_idx):
            self.dtype_seen = self.net(batch[0]).dtype
            return super().training_step(batch, batch_idx)

    model = Probe()
    trainer = L.Trainer(accelerator="neuron", devices=1, precision="bf16-mixed", max_steps=1, **QUIET)
    assert trainer.precision_plugin.device == "neuron"
    trainer.fit(model)
    assert model.dtype_seen == torch.bfloat16


def test_unregister_puts_lightning_back():
    from lightning.pytorch.accelerators import AcceleratorRegistry
    from lightning.pytorch.strategies.ddp import DDPStrategy
    from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector

    assert tl.is_registered() and "neuron" in AcceleratorRegistry
    assert [p.target for p in tl.PATCHES if p.target.startswith("lightning.")] == [
        "lightning.pytorch.trainer.connectors.accelerator_connector._AcceleratorConnector._choose_strategy",
        "lightning.pytorch.strategies.ddp.DDPStrategy._setup_model",
        "lightning.pytorch.trainer.connectors.accelerator_connector._AcceleratorConnector._check_and_init_precision",
    ]
    patched = (_AcceleratorConnector._choose_strategy, DDPStrategy._setup_model)
    tl.unregister("lightning.pytorch")
    try:
        assert not tl.is_registered() and "neuron" not in AcceleratorRegistry
        assert _AcceleratorConnector._choose_strategy is patched[0].__wrapped__
        assert DDPStrategy._setup_model is patched[1].__wrapped__
        with pytest.raises(ValueError, match="invalid accelerator name"):
            L.Trainer(accelerator="neuron", devices=1, **QUIET)
    finally:
        tl.register("lightning.pytorch")
    assert L.Trainer(accelerator="neuron", devices=1, **QUIET).strategy.root_device.type == "neuron"


def test_register_failing_half_way_puts_lightning_back(monkeypatch):
    """A patch that fails while register() applies them: those applied before it and the registry entry
    are undone, last first, and register() works again afterwards."""
    from lightning.pytorch.accelerators import AcceleratorRegistry
    from lightning.pytorch.strategies.ddp import DDPStrategy
    from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector

    def state():
        return dict(AcceleratorRegistry), dict(_AcceleratorConnector.__dict__), dict(DDPStrategy.__dict__)

    tl.unregister("lightning.pytorch")
    try:
        before = state()

        def fails(orig, namespace, accelerator_cls):
            raise RuntimeError("third patch")

        monkeypatch.setattr(tl, "_TABLE", tl._TABLE[:2] + (tl._TABLE[2][:4] + (fails,),))
        with pytest.raises(RuntimeError, match="third patch"):
            tl.register("lightning.pytorch")
        assert not tl.is_registered() and state() == before
    finally:
        monkeypatch.undo()
        tl.register("lightning.pytorch")
    assert tl.is_registered() and "neuron" in AcceleratorRegistry


def test_registered_when_lightning_is_imported_later(runs):
    stdout, _ = runs.result("later_import")
    assert stdout.strip().splitlines()[-1] == "neuron:0 neuron:1"


# ================================ two devices: DDP =====================================================

def test_ddp_on_two_devices_equals_one_cpu_process(runs, two_devices):
    ranks = runs.ranks("ddp", 2)
    _, cpu_model = _train("cpu", batch_size=8)  # both ranks' batches of 4 in one batch
    for rank, out in enumerate(ranks):
        assert out["backend"] == "neuron" and out["world_size"] == 2
        assert (out["strategy"], out["accelerator"]) == ("DDPStrategy", "NeuronAccelerator")
        assert out["seen"] == [f"neuron:{rank}"]
        assert set(out["cuda_calls"]) <= {"is_available", "device_count", "empty_cache", "set_rng_state_all"}, (
            "Lightning makes these calls on the CPU too")
        for p, q in zip(out["params"], cpu_model.parameters()):
            torch.testing.assert_close(p, q.detach())
    for p, q in zip(ranks[0]["params"], ranks[1]["params"]):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


# ================================ TORCHNEURON_TRANSFER_CUDA=1 ==========================================

@pytest.mark.parametrize("devices", [1, 2])
def test_transfer_cuda_runs_a_gpu_script_on_neuron(runs, devices):
    if devices == 2 and torch.neuron.device_count() < 2:
        pytest.skip("needs TORCHNEURON_NUM_DEVICES >= 2")
    ranks = runs.ranks(f"transfer{devices}", devices)
    _, cpu_model = _train("cpu", batch_size=4 * devices)
    for rank, out in enumerate(ranks):
        assert out["accelerator"] == "CUDAAccelerator" and out["seen"] == [f"neuron:{rank}"]
        if devices == 2:
            assert out["backend"] == "neuron"  # Lightning asked for "nccl"
        for p, q in zip(out["params"], cpu_model.parameters()):
            torch.testing.assert_close(p, q.detach())
