"""Train a 2-layer LSTM language model on synthetic token sequences, checkpoint, reload, continue.

    python examples/train_lstm.py --device neuron --steps 5

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

VOCAB_SIZE = 32
SEQ_LEN = 24
BATCH_SIZE = 8
STEPS_AFTER_RELOAD = 2


class LSTMLanguageModel(nn.Module):
    def __init__(self, vocab_size: int = VOCAB_SIZE, embed_dim: int = 32, hidden_size: int = 64) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden_size, num_layers=2, dropout=0.2, batch_first=True)
        self.dropout = nn.Dropout(0.2)
        self.head = nn.Linear(hidden_size, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embedding(tokens))
        return self.head(self.dropout(out))


def make_data(num_batches: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Sequences that mostly count up by a per-sequence stride (mod vocab), with some noise tokens."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(num_batches):
        start = torch.randint(0, VOCAB_SIZE, (BATCH_SIZE, 1), generator=g)
        stride = torch.randint(1, 4, (BATCH_SIZE, 1), generator=g)
        seq = (start + stride * torch.arange(SEQ_LEN + 1)) % VOCAB_SIZE
        noise = torch.rand(seq.shape, generator=g) < 0.1
        seq = torch.where(noise, torch.randint(0, VOCAB_SIZE, seq.shape, generator=g), seq)
        batches.append((seq[:, :-1], seq[:, 1:]))
    return batches


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def train_steps(model, optimizer, scheduler, batches, device) -> list[float]:
    model.train()
    losses = []
    for inputs, targets in batches:
        inputs, targets = inputs.to(device), targets.to(device)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    return losses


@torch.no_grad()
def evaluate(model, batches, device) -> float:
    model.eval()
    losses = [loss_fn(model(x.to(device)), y.to(device)) for x, y in batches]
    return torch.stack(losses).mean().item()


def make_optimizer(model):
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return optimizer, scheduler


def main(device: str = "neuron", steps: int = 5, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    train_data = make_data(steps + STEPS_AFTER_RELOAD, seed)
    eval_data = make_data(2, seed + 1)

    model = LSTMLanguageModel().to(device)
    optimizer, scheduler = make_optimizer(model)
    # Initialization drew from the CPU generator, dropout draws from the
    # device's: reseed so the training loop's random numbers do not depend on it.
    torch.manual_seed(seed + 1)
    losses = train_steps(model, optimizer, scheduler, train_data[:steps], device)

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "checkpoint.pt")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict()}, path)
        checkpoint = torch.load(path, map_location=device)

    model = LSTMLanguageModel().to(device)
    model.load_state_dict(checkpoint["model"])
    optimizer, scheduler = make_optimizer(model)
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])

    eval_loss = evaluate(model, eval_data, device)
    torch.manual_seed(seed + 2)
    losses_after_reload = train_steps(model, optimizer, scheduler, train_data[steps:], device)
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
