"""Fixed: the side stream waits for the default stream's reads before refilling the buffer."""
import torch

buffer = torch.randn(64, 64, device="neuron")
side = torch.neuron.Stream()
results = []
for step in range(2):
    results.append((buffer @ buffer).trace())
    side.wait_stream(torch.neuron.current_stream())
    with torch.neuron.stream(side):
        buffer.normal_()
    torch.neuron.current_stream().wait_stream(side)
print(torch.stack(results).sum().item())
