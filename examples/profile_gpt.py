"""Where a training step's time and memory go: the demo's GPT profiled on the neuron device.

    python examples/profile_gpt.py --out profile/

Trains the demo's GPT (4 layers, 128 wide, 16x64 tokens, AdamW) for a few steps under
torch.profiler with a schedule (one step skipped, one of warm-up, two recorded), the way one
profiles on CUDA: only ``device="neuron"`` and ``ProfilerActivity.PrivateUse1`` differ. It writes

- ``trace.json``: the Chrome trace of the recorded steps (open it in Perfetto or TensorBoard:
  the host thread's ops, a ``neuron 0`` process with a lane per stream, arrows from each launch
  to its kernel);
- ``key_averages.txt``: the table of ops by device time (Self NEURON, NEURON total);
- ``memory.pickle``: a memory snapshot of one step in PyTorch's format (segments, blocks, the
  allocator's actions with their stack traces): ``torchneuron memviz memory.pickle -o memory.html``
  draws it, as do PyTorch's own renderers (``torch.cuda._memory_viz``).
"""

from __future__ import annotations

import argparse
import pickle
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function, schedule

import torchneuron  # noqa: F401  (registers the neuron device)
from torchneuron.models import GPT, GPTConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("profile"), help="directory for the outputs")
    parser.add_argument("--device", default="neuron", help="device to run on (default neuron)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)

    torch.manual_seed(0)
    config = GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.0)
    model = GPT(config).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    x = torch.randint(0, config.vocab_size, (16, config.block_size), device=device)
    y = torch.roll(x, -1, dims=1)

    def step() -> float:
        with record_function("forward"):
            logits = model(x)
            logits = logits[0] if isinstance(logits, tuple) else logits
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        return loss.item()

    activities = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
    with profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=2), record_shapes=True,
                 profile_memory=True, with_stack=True) as prof:
        for _ in range(4):
            step()
            prof.step()
    prof.export_chrome_trace(str(args.out / "trace.json"))
    table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=20)
    (args.out / "key_averages.txt").write_text(table + "\n")
    print(table)

    # One more step with the allocator's history on: a snapshot in PyTorch's format.
    torch.neuron.memory._record_memory_history(max_entries=100000)
    step()
    snapshot = torch.neuron.memory._snapshot()
    torch.neuron.memory._record_memory_history(enabled=None)
    with open(args.out / "memory.pickle", "wb") as f:
        pickle.dump(snapshot, f)
    print(f"wrote {args.out / 'trace.json'}, {args.out / 'key_averages.txt'} and {args.out / 'memory.pickle'}")


if __name__ == "__main__":
    main()
