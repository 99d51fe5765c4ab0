"""Bug: a batch used on a side stream is freed on the default stream without record_stream."""
import torch

model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()).to("neuron")
main = torch.neuron.current_stream()
side = torch.neuron.Stream()
outputs = []
with torch.inference_mode():
    for step in range(2):
        batch = torch.randn(32, 64, device="neuron")  # allocated on the default stream
        side.wait_stream(main)
        with torch.neuron.stream(side):
            outputs.append(model(batch))
        del batch  # BUG: the allocator may hand this memory out again while the side stream still reads it
main.wait_stream(side)
print(sum(o.sum().item() for o in outputs))
