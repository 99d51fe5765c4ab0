"""Train a small CNN classifier on synthetic images, checkpoint it, reload it and keep training.

    python examples/train_cnn.py --device neuron --steps 5

An ordinary PyTorch program: nothing in it depends on the device except the
``--device`` string.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

NUM_CLASSES = 10
BATCH_SIZE = 16
IMAGE_SIZE = 16
STEPS_AFTER_RELOAD = 2


class SmallCNN(nn.Module):
    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, kernel_size=3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, kernel_size=3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Dropout(0.25),
            nn.Linear(32 * (IMAGE_SIZE // 4) ** 2, 64),
            nn.ReLU(),
            nn.Dropout(0.25),
            nn.Linear(64, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def make_data(num_batches: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Synthetic images whose class is encoded in the mean of one colour channel, on the CPU."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(num_batches):
        labels = torch.randint(0, NUM_CLASSES, (BATCH_SIZE,), generator=g)
        images = torch.randn(BATCH_SIZE, 3, IMAGE_SIZE, IMAGE_SIZE, generator=g)
        images[:, labels % 3] += (labels.float() / NUM_CLASSES).view(-1, 1, 1, 1)
        batches.append((images, labels))
    return batches


def train_steps(model, optimizer, batches, device) -> list[float]:
    model.train()
    losses = []
    for images, labels in batches:
        images, labels = images.to(device), labels.to(device)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@torch.no_grad()
def evaluate(model, batches, device) -> float:
    model.eval()
    total, count = 0.0, 0
    for images, labels in batches:
        images, labels = images.to(device), labels.to(device)
        total += F.cross_entropy(model(images), labels, reduction="sum").item()
        count += labels.numel()
    return total / count


def main(device: str = "neuron", steps: int = 5, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    train_data = make_data(steps + STEPS_AFTER_RELOAD, seed)
    eval_data = make_data(2, seed + 1)

    model = SmallCNN().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    # Model initialization drew from the CPU generator; dropout draws from the
    # generator of the device the model runs on. Reseed so that the training
    # loop's random numbers do not depend on how many numbers the
    # initialization took from which generator.
    torch.manual_seed(seed + 1)
    losses = train_steps(model, optimizer, train_data[:steps], device)

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "checkpoint.pt")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
        checkpoint = torch.load(path, map_location=device)

    model = SmallCNN().to(device)
    model.load_state_dict(checkpoint["model"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    optimizer.load_state_dict(checkpoint["optimizer"])

    eval_loss = evaluate(model, eval_data, device)
    torch.manual_seed(seed + 2)
    losses_after_reload = train_steps(model, optimizer, train_data[steps:], device)
    return {"losses": losses, "eval_loss": eval_loss, "losses_after_reload": losses_after_reload}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="neuron")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    result = main(args.device, args.steps, args.seed)
    for i, loss in enumerate(result["losses"]):
        print(f"step {i}: loss {loss:.6f}")
    print(f"eval loss after reload: {result['eval_loss']:.6f}")
    for i, loss in enumerate(result["losses_after_reload"], start=len(result["losses"])):
        print(f"step {i} (after reload): loss {loss:.6f}")
