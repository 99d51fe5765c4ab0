"""Train a tiny regression model with Lightning; run by tests/test_integrations_lightning.py.

Usage: python lightning_train.py OUT_DIR ACCELERATOR DEVICES STRATEGY BATCH_SIZE

Lightning's DDP starts the other ranks by running this script again with the
same arguments. Each rank writes ``rank<r>.pt``: its final parameters (on the
CPU), the devices its parameters and batches were on during training, the
process group backend, and the ``torch.cuda`` functions the run called.
"""

import functools
import os
import sys

import torch

CUDA_CALLS: list[str] = []


def _record_cuda_calls() -> None:
    """Wrap every public function of ``torch.cuda`` (and its Stream/Event classes) to note its calls."""

    def recording(name, fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            CUDA_CALLS.append(name)
            return fn(*args, **kwargs)

        return call

    for name in dir(torch.cuda):
        value = getattr(torch.cuda, name)
        if name.startswith("_") or not callable(value) or isinstance(value, type(torch)):
            continue
        if isinstance(value, type) and name not in ("Stream", "Event", "StreamContext", "device"):
            continue
        setattr(torch.cuda, name, recording(name, value))


if os.environ.get("TORCHNEURON_TRANSFER_CUDA", "0") in ("0", ""):
    _record_cuda_calls()  # under the CUDA compatibility layer torch.cuda is meant to be called

import lightning as L  # noqa: E402

import torchneuron.integrations.lightning  # noqa: E402,F401  (registers accelerator="neuron")

import lightning_model  # noqa: E402


def main() -> None:
    out_dir, accelerator, devices, strategy, batch_size = sys.argv[1:6]
    devices = int(devices) if devices.isdigit() else devices
    model = lightning_model.Regression(int(batch_size))
    trainer = L.Trainer(accelerator=accelerator, devices=devices, strategy=strategy,
                        max_steps=lightning_model.STEPS, use_distributed_sampler=False, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model)
    rank = trainer.global_rank
    torch.save({
        "params": [p.detach().cpu() for p in model.parameters()],
        "seen": sorted(model.seen),
        "backend": model.backend,
        "world_size": trainer.world_size,
        "strategy": type(trainer.strategy).__name__,
        "accelerator": type(trainer.accelerator).__name__,
        "cuda_calls": sorted(set(CUDA_CALLS)),
    }, os.path.join(out_dir, f"rank{rank}.pt"))


if __name__ == "__main__":
    main()
