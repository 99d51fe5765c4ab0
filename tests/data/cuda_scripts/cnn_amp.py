"""Train a small CNN on synthetic images, the CUDA way: .cuda(), torch.cuda.amp, cudnn.benchmark.

Written for a CUDA machine as many training scripts are; the torchneuron tests run
it unchanged through the CUDA compatibility layer and through `torchneuron migrate`.
Prints one `step N loss=<float>` line per step.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 4 * 4, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)   # 16 -> 8
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)             # 8 -> 4
        return self.fc(torch.flatten(x, 1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    if not torch.cuda.is_available():
        print("warning: no GPU, this will be slow")
    torch.manual_seed(args.seed)
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True

    images = torch.randn(args.steps * args.batch_size, 3, 16, 16)
    labels = torch.randint(0, 10, (args.steps * args.batch_size,))
    loader = DataLoader(TensorDataset(images, labels), batch_size=args.batch_size, shuffle=True,
                        pin_memory=True, generator=torch.Generator().manual_seed(args.seed))

    model = Net().cuda().to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.cuda.amp.GradScaler()

    model.train()
    for step, (x, y) in enumerate(loader):
        x = x.cuda(non_blocking=True).to(memory_format=torch.channels_last)
        y = y.cuda(non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        with torch.cuda.amp.autocast():
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        print(f"step {step} loss={loss.item():.6f}")

    torch.cuda.synchronize()
    print(f"peak memory {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB on {torch.cuda.get_device_name(0)}")


if __name__ == "__main__":
    main()
