"""Bug: predictions are copied to the host on a side stream, and the host synchronizes the default stream."""
import torch

model = torch.nn.Linear(16, 3).to("neuron")
copy_stream = torch.neuron.Stream()
x = torch.randn(10, 16, device="neuron")
preds = model(x).argmax(dim=1)
copy_stream.wait_stream(torch.neuron.current_stream())
with torch.neuron.stream(copy_stream):
    preds_host = preds.to("cpu", non_blocking=True)
torch.neuron.current_stream().synchronize()
print(preds_host.tolist(), preds_host.bincount(minlength=3))  # BUG: the copy ran on copy_stream, not synchronized
