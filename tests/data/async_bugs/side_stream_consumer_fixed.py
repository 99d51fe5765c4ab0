"""Fixed: the side stream waits for the default stream before reading what it wrote."""
import torch

x = torch.randn(128, 128, device="neuron")
weights = torch.softmax(x, dim=-1)
side = torch.neuron.Stream()
side.wait_stream(torch.neuron.current_stream())
with torch.neuron.stream(side):
    stats = weights.mean(dim=0)
torch.neuron.current_stream().wait_stream(side)
print(stats.sum().item())
