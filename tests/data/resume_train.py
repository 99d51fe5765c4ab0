"""A training script that checkpoints every step with torch.distributed.checkpoint and resumes.

    torchrun --nproc-per-node 2 --max-restarts 1 resume_train.py BACKEND ddp|fsdp2 CKPT_DIR [--crash]

With --crash, rank 1 exits abruptly after step 3 of the first attempt; torchrun restarts both ranks,
which resume from the last checkpoint. Rank 0 saves the final weights to CKPT_DIR/final.pt.
"""
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import torchneuron  # noqa: F401

STEPS = 6
backend, wrap, ckpt = sys.argv[1:4]
crash = "--crash" in sys.argv
dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
device = torch.device("neuron", int(os.environ["LOCAL_RANK"])) if backend == "neuron" else torch.device("cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(device)
if wrap == "ddp":
    from torch.nn.parallel import DistributedDataParallel

    net = DistributedDataParallel(model)
else:
    from torch.distributed.fsdp import fully_shard

    net = fully_shard(model)
opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
marker = os.path.join(ckpt, "step")
start = 0
if os.path.exists(marker):
    model_state, opt_state = get_state_dict(net, opt)  # the optimizer's state made, to be loaded into
    state = {"model": model_state, "opt": opt_state}
    dcp.load(state, checkpoint_id=os.path.join(ckpt, "dcp"))
    set_state_dict(net, opt, model_state_dict=state["model"], optim_state_dict=state["opt"])
    with open(marker) as f:
        start = int(f.read())
print(f"rank {rank} attempt {attempt} starts at step {start}", flush=True)
for step in range(start, STEPS):
    g = torch.Generator().manual_seed(step * 10 + rank)
    x = torch.randn(8, 16, generator=g).to(device)
    net(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
    model_state, opt_state = get_state_dict(net, opt)
    dcp.save({"model": model_state, "opt": opt_state}, checkpoint_id=os.path.join(ckpt, "dcp"))
    dist.barrier()
    if rank == 0:  # the step is done once every rank's shard is saved
        with open(marker + ".tmp", "w") as f:
            f.write(str(step + 1))
        os.replace(marker + ".tmp", marker)
    dist.barrier()
    if crash and attempt == 0 and rank == 1 and step == 2:
        os._exit(7)
full = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu() for k, v in model.state_dict().items()}
if rank == 0:
    torch.save(full, os.path.join(ckpt, "final.pt"))
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
