"""A small MLP regression written for CUDA, with a `.item()` in the training loop.

The loss is read back to the host every step (`running += loss.item()`), which is
what `torchneuron doctor` should point at. Prints one `step N loss=<float>` line per step.
"""

import sys

import torch
import torch.nn as nn

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
torch.manual_seed(0)
torch.cuda.manual_seed_all(0)

model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Dropout(0.2), nn.Linear(64, 1)).cuda()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
x = torch.randn(64, 16).cuda()
y = x[:, :1] * 2 - x[:, 1:2]

running = 0.0
for step in range(steps):
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    running += loss.item()  # a host-device sync every step
    print(f"step {step} loss={loss.detach().cpu().item():.6f}")
print(f"mean loss {running / steps:.6f}")
