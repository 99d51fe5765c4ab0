"""Bug: a side stream uses a tensor the default stream has just written, without waiting for it."""
import torch

x = torch.randn(128, 128, device="neuron")
weights = torch.softmax(x, dim=-1)  # written on the default stream
side = torch.neuron.Stream()
with torch.neuron.stream(side):
    stats = weights.mean(dim=0)  # BUG: the side stream may run before softmax has finished
torch.neuron.current_stream().wait_stream(side)
print(stats.sum().item())
