"""Fixed: wait for the end event before reading the time."""
import torch

model = torch.nn.Linear(256, 256).to("neuron")
x = torch.randn(64, 256, device="neuron")
start = torch.neuron.Event(enable_timing=True)
end = torch.neuron.Event(enable_timing=True)
start.record()
model(x).relu().sum().backward()
end.record()
end.synchronize()
ms = start.elapsed_time(end)
print(f"step: {ms:.3f} ms")
