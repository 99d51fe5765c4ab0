"""Train the small GPT with FSDP2 (``fully_shard``) on neuron devices; save and resume a sharded checkpoint.

    torchrun --nproc-per-node 2 examples/fsdp_gpt.py --steps 20 --checkpoint /tmp/gpt-ckpt
    torchrun --nproc-per-node 2 examples/fsdp_gpt.py --steps 10 --checkpoint /tmp/gpt-ckpt --resume

Each transformer block and then the whole model are sharded over the ranks:
every rank holds 1/world of each parameter and of the optimizer state,
all-gathers a block's parameters just before it runs, and reduce-scatters its
gradients right after. ``torch.distributed.checkpoint`` writes each rank's
shards in parallel and reads them back into a sharded model (even one on a
different number of ranks). ``--device cpu`` runs the same program with gloo.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard

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
    p.add_argument("--checkpoint", default=None, help="directory of the sharded checkpoint written at the end")
    p.add_argument("--resume", action="store_true", help="first load model and optimizer from --checkpoint")
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

    torch.manual_seed(args.seed)  # the same full weights on every rank before sharding
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=args.block_size, n_layer=args.n_layer,
                       n_head=4, n_embd=args.n_embd)
    model = GPT(config).to(device)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    if args.resume:
        if not args.checkpoint:
            raise SystemExit("--resume needs --checkpoint DIR")
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=args.checkpoint)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        if rank == 0:
            print(f"resumed from {args.checkpoint}")

    if rank == 0:
        local = sum(p.to_local().numel() for p in model.parameters())
        print(f"FSDP2: {world} processes, backend {dist.get_backend()}, rank 0 on {device}, "
              f"{model.num_parameters():,} parameters ({local:,} held by rank 0), global batch "
              f"{world * args.batch_size}")

    batches = torch.Generator().manual_seed(args.seed + 1 + rank + (10_000 if args.resume else 0))
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

    if args.checkpoint:
        model_sd, optim_sd = get_state_dict(model, optimizer)  # sharded (DTensor) state dicts
        writer = dcp.FileSystemWriter(args.checkpoint, overwrite=True)  # each rank writes its own shards
        dcp.save({"model": model_sd, "optim": optim_sd}, storage_writer=writer)
        if rank == 0:
            print(f"saved a sharded checkpoint to {args.checkpoint}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
