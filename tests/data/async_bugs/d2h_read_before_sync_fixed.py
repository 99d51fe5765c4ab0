"""Fixed: synchronize before reading the result of a non_blocking copy to the host."""
import torch

model = torch.nn.Linear(32, 1).to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
history = []
for step in range(3):
    x = torch.randn(16, 32, device="neuron")
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    loss_host = loss.detach().to("cpu", non_blocking=True)
    torch.neuron.synchronize()
    history.append(loss_host.item())
print(history)
