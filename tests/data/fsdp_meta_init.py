"""FSDP2's meta-device recipe on neuron, run by torchrun with two processes.

    torchrun --nproc-per-node 2 tests/data/fsdp_meta_init.py

The model is built on the meta device, sharded with ``fully_shard``, given
device memory with ``to_empty`` and drawn with ``init_weights()``: every random
op runs on DTensor shards, whose random-op tracker moves the neuron generator's
Philox offset so that each shard draws its own part of the stream. The result
must equal the same model drawn whole on one device from the same seed; a
replicated DTensor must come out equal on both ranks and a sharded one differ.
Then the model trains a few steps with dropout.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from torchneuron.models import GPT, GPTConfig


def main() -> None:
    rank = int(os.environ["RANK"])
    device = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(device_id=device)
    world = dist.get_world_size()
    config = GPTConfig(vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=64, dropout=0.1)

    torch.manual_seed(0)
    with torch.device("meta"):
        model = GPT(config)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    model.to_empty(device=device)
    model.init_weights()

    with torch.device(device):
        whole = GPT(config)
    torch.manual_seed(0)
    whole.init_weights()               # drawn on this device alone, no DTensor
    for (name, p), q in zip(model.named_parameters(), whole.parameters()):
        assert p.to_local().device == device, name
        torch.testing.assert_close(p.full_tensor(), q.detach(), rtol=0, atol=0,
                                   msg=lambda m, name=name: f"{name}: {m}")

    # Replicated parameters come out equal on every rank; shards differ.
    mesh = init_device_mesh("neuron", (world,))
    replicated = distribute_tensor(torch.empty(16, 64, device=device), mesh, [Replicate()]).normal_()
    gathered = [torch.empty(16, 64, device=device) for _ in range(world)]
    dist.all_gather(gathered, replicated.to_local())
    assert all(torch.equal(g, gathered[0]) for g in gathered), "replicated draws differ across ranks"
    sharded = distribute_tensor(torch.empty(8 * world, 64, device=device), mesh, [Shard(0)]).uniform_()
    dist.all_gather(gathered[:world], sharded.to_local().reshape(8, 64).repeat(2, 1))
    assert not torch.equal(gathered[0], gathered[1]), "the shards drew the same numbers"

    # Training with dropout (DTensor's tracker and plain dropout share the one generator state).
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    losses = []
    for _ in range(3):
        idx = torch.randint(0, config.vocab_size, (4, config.block_size), generator=gen).to(device)
        _, loss = model(idx, idx)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))), losses
    dist.destroy_process_group()
    print(f"rank {rank}: FSDP META INIT OK, losses {losses}", flush=True)
    # A rank once aborted after this line, at interpreter exit ("terminate called without an active
    # exception": CPython ends a thread of PyTorch's that takes the GIL while the interpreter
    # finalizes, inside a noexcept frame; see tests/test_device.py). What this script checks is done,
    # so it leaves without finalizing, as the other worker scripts of the suite do.
    os._exit(0)  # the line above is flushed


if __name__ == "__main__":
    main()
