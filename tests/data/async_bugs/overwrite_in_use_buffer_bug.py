"""Bug: a side stream refills a device buffer that the default stream is still reading."""
import torch

buffer = torch.randn(64, 64, device="neuron")
side = torch.neuron.Stream()
results = []
for step in range(2):
    results.append((buffer @ buffer).trace())  # the default stream reads buffer
    with torch.neuron.stream(side):
        buffer.normal_()  # BUG: overwrites buffer while the matmul on the default stream may still read it
    torch.neuron.current_stream().wait_stream(side)
print(torch.stack(results).sum().item())
