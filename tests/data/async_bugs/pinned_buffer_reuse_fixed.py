"""Fixed: wait for the copy out of the staging buffer before refilling it."""
import torch

batches = [torch.randn(16, 32) for _ in range(3)]
staging = torch.empty(16, 32, pin_memory=True)
model = torch.nn.Linear(32, 4).to("neuron")
total = torch.zeros((), device="neuron")
copied = torch.neuron.Event()
for batch in batches:
    copied.synchronize()
    staging.copy_(batch)
    x = staging.to("neuron", non_blocking=True)
    copied.record()
    total += model(x).sum()
print(total.item())
