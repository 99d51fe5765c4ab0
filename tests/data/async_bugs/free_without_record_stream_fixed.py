"""Fixed: record_stream tells the allocator that the side stream uses the batch."""
import torch

model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()).to("neuron")
main = torch.neuron.current_stream()
side = torch.neuron.Stream()
outputs = []
with torch.inference_mode():
    for step in range(2):
        batch = torch.randn(32, 64, device="neuron")
        side.wait_stream(main)
        with torch.neuron.stream(side):
            outputs.append(model(batch))
        batch.record_stream(side)
        del batch
main.wait_stream(side)
print(sum(o.sum().item() for o in outputs))
