"""Bug: one pinned staging buffer is refilled for the next batch while the last copy from it may still run."""
import torch

batches = [torch.randn(16, 32) for _ in range(3)]
staging = torch.empty(16, 32, pin_memory=True)
model = torch.nn.Linear(32, 4).to("neuron")
total = torch.zeros((), device="neuron")
for batch in batches:
    staging.copy_(batch)  # BUG: from the second batch on, the previous copy may still be reading staging
    x = staging.to("neuron", non_blocking=True)
    total += model(x).sum()
print(total.item())
