"""Train the small GPT on the bundled corpus with DistributedDataParallel, one process per neuron device.

    torchrun --nproc-per-node 2 examples/ddp_gpt.py --steps 20

An ordinary DDP program: ``init_process_group(device_id=...)`` picks the
``neuron`` backend for neuron tensors (and gloo for CPU tensors), each rank
trains on its own batches, and DDP averages the gradients. ``--device cpu``
runs the same program with gloo on CPU tensors. See docs/distributed.md for
several machines.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from torchneuron.data import load_text
from torchneuron.models import GPT, CharTokenizer, GPTConfig, get_batch


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="neuron", help="neuron (default) or cpu")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=8, help="sequences per rank and step")
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-embd", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", default=None, help="write rank 0's model state_dict here at the end")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if args.device == "cpu":
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    else:
        device = torch.device(args.device, local_rank)
        dist.init_process_group(device_id=device)  # the neuron backend; rank r uses neuron:LOCAL_RANK
    rank, world = dist.get_rank(), dist.get_world_size()

    text = load_text()
    tokenizer = CharTokenizer(text)
    data = torch.tensor(tokenizer.encode(text), dtype=torch.long)
    split = int(0.9 * data.numel())
    train_data, val_data = data[:split], data[split:]

    torch.manual_seed(args.seed)  # DDP also broadcasts rank 0's weights to the others
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=args.block_size, n_layer=args.n_layer,
                       n_head=4, n_embd=args.n_embd)
    model = DDP(GPT(config).to(device), device_ids=[local_rank] if device.type != "cpu" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    batches = torch.Generator().manual_seed(args.seed + 1 + rank)  # each rank its own batches
    if rank == 0:
        print(f"DDP: {world} processes, backend {dist.get_backend()}, rank 0 on {device}, "
              f"{model.module.num_parameters():,} parameters, global batch {world * args.batch_size}")

    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        x, y = get_batch(train_data, args.block_size, args.batch_size, batches, device)
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == 1 or step % args.log_every == 0 or step == args.steps:
            mean_loss = loss.detach().clone()
            dist.all_reduce(mean_loss, op=dist.ReduceOp.AVG)
            if rank == 0:
                ms = (time.perf_counter() - start) / step * 1e3
                print(f"step {step:4d}  loss {mean_loss.item():.4f}  ({ms:.0f} ms/step)", flush=True)

    model.eval()
    with torch.no_grad():
        g = torch.Generator().manual_seed(1234 + rank)
        x, y = get_batch(val_data, args.block_size, args.batch_size, g, device)
        _, val_loss = model(x, y)
        dist.all_reduce(val_loss, op=dist.ReduceOp.AVG)
    if rank == 0:
        print(f"validation loss {val_loss.item():.4f}")
        if args.save:
            torch.save({k: v.cpu() for k, v in model.module.state_dict().items()}, args.save)
            print(f"saved {args.save}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
