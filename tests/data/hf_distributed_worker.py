"""One rank of the 2-process Hugging Face test (tests/test_integrations_hf.py).

Started by ``accelerate launch --num_processes 2`` or ``torchrun --nproc-per-node 2``
with no configuration and no code for neuron: accelerate and transformers find
the device through the ``torch_neuronx`` module. Each rank writes what it found
to ``<output_dir>/result_<rank>.json`` (output_dir is the first argument):

* the ``Accelerator``'s distributed type, device and process group backend;
* an SGD step of a linear model prepared by the ``Accelerator`` (DDP), each
  rank on its half of a batch, against the same step on the CPU on the whole
  batch: equal when DDP averages the gradients;
* a ``Trainer`` run of a small GPT-2 for a few steps: its device, parallel mode
  and a checksum of its parameters, which must be equal on both ranks.
"""

import copy
import json
import os
import sys

import torch
import torch.distributed as dist


def accelerator_step() -> dict:
    from accelerate import Accelerator

    accelerator = Accelerator()
    rank, world = accelerator.process_index, accelerator.num_processes
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)  # built on the CPU: every rank starts from the same weights
    reference = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(4 * world, 8, generator=generator), torch.randn(4 * world, 4, generator=generator)

    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model, optimizer = accelerator.prepare(model, optimizer)
    mine = slice(4 * rank, 4 * (rank + 1))
    loss = torch.nn.functional.mse_loss(model(x[mine].to(accelerator.device)), y[mine].to(accelerator.device))
    accelerator.backward(loss)
    optimizer.step()

    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    torch.nn.functional.mse_loss(reference(x), y).backward()
    reference_optimizer.step()

    trained = accelerator.unwrap_model(model)
    difference = max((p.detach().cpu() - r.detach()).abs().max().item()
                     for p, r in zip(trained.parameters(), reference.parameters()))
    result = {
        "rank": rank,
        "world": world,
        "distributed_type": str(accelerator.distributed_type),
        "device": str(accelerator.device),
        "parameter_device": str(next(trained.parameters()).device),
        "backend": dist.get_backend(),
        "ddp": type(model).__name__,
        "max_difference_from_cpu_full_batch": difference,
    }
    accelerator.wait_for_everyone()
    return result


def trainer_run(output_dir: str) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32, bos_token_id=63,
                        eos_token_id=63, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    generator = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 64, (16, 16), generator=generator)
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = TrainingArguments(output_dir=output_dir, per_device_train_batch_size=2, max_steps=3,
                             learning_rate=1e-2, logging_steps=1, save_strategy="no", report_to=[],
                             seed=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    checksum = sum(p.detach().double().sum().item() for p in trainer.model.parameters())
    return {
        "trainer_device": str(args.device),
        "trainer_parameter_device": str(next(trainer.model.parameters()).device),
        "parallel_mode": str(args.parallel_mode),
        "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        "checksum": checksum,
    }


def main() -> None:
    output_dir = sys.argv[1]
    result = accelerator_step()
    result.update(trainer_run(output_dir))
    with open(os.path.join(output_dir, f"result_{result['rank']}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
