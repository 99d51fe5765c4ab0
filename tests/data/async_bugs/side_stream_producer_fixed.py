"""Fixed: the default stream waits for the side stream before using what it produced."""
import torch

encoder = torch.nn.Linear(64, 64).to("neuron")
head = torch.nn.Linear(64, 8).to("neuron")
side = torch.neuron.Stream()
x = torch.randn(8, 64, device="neuron")
side.wait_stream(torch.neuron.current_stream())
with torch.neuron.stream(side):
    features = encoder(x).relu()
torch.neuron.current_stream().wait_stream(side)
logits = head(features)
print(logits.sum().item())
