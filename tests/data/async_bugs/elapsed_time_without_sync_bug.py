"""Bug: a training step is timed with events, and the time is read before the end event completed."""
import torch

model = torch.nn.Linear(256, 256).to("neuron")
x = torch.randn(64, 256, device="neuron")
start = torch.neuron.Event(enable_timing=True)
end = torch.neuron.Event(enable_timing=True)
start.record()
model(x).relu().sum().backward()
end.record()
ms = start.elapsed_time(end)  # BUG: end has not completed; the time does not cover the step
print(f"step: {ms:.3f} ms")
