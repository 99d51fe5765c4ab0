"""Bug: features are computed on a side stream and used on the default stream without waiting for it."""
import torch

encoder = torch.nn.Linear(64, 64).to("neuron")
head = torch.nn.Linear(64, 8).to("neuron")
side = torch.neuron.Stream()
x = torch.randn(8, 64, device="neuron")
side.wait_stream(torch.neuron.current_stream())
with torch.neuron.stream(side):
    features = encoder(x).relu()
logits = head(features)  # BUG: the default stream reads features before the side stream has written them
print(logits.sum().item())
