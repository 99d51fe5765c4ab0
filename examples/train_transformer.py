"""Train a small causal transformer language model on synthetic tokens, checkpoint, reload, continue.

    python examples/train_transformer.py --device neuron --steps 5

An ordinary PyTorch program: nothing in it depends on the device except the
``--device`` string.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB_SIZE = 48
SEQ_LEN = 32
BATCH_SIZE = 8
WARMUP_STEPS = 2
TOTAL_STEPS = 20
STEPS_AFTER_RELOAD = 2


class TinyTransformerLM(nn.Module):
    def __init__(self, vocab_size: int = VOCAB_SIZE, d_model: int = 64, nhead: int = 4,
                 num_layers: int = 2, max_len: int = SEQ_LEN) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(max_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=4 * d_model, dropout=0.1,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers, norm=nn.LayerNorm(d_model),
                                             enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq_len = tokens.size(1)
        positions = torch.arange(seq_len, device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        mask = nn.Transformer.generate_square_subsequent_mask(seq_len, device=tokens.device)
        x = self.encoder(x, mask=mask, is_causal=True)
        return self.head(x)


def make_data(num_batches: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Sequences where each token is the sum of the two before it (mod vocab), from random starts."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(num_batches):
        seq = torch.empty(BATCH_SIZE, SEQ_LEN + 1, dtype=torch.long)
        seq[:, :2] = torch.randint(0, VOCAB_SIZE, (BATCH_SIZE, 2), generator=g)
        for t in range(2, SEQ_LEN + 1):
            seq[:, t] = (seq[:, t - 1] + seq[:, t - 2]) % VOCAB_SIZE
        batches.append((seq[:, :-1], seq[:, 1:]))
    return batches


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def lr_lambda(step: int) -> float:
    """Linear warm-up, then cosine decay."""
    if step < WARMUP_STEPS:
        return (step + 1) / WARMUP_STEPS
    progress = min(1.0, (step - WARMUP_STEPS) / max(1, TOTAL_STEPS - WARMUP_STEPS))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model):
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=1e-3, betas=(0.9, 0.95))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    return optimizer, scheduler


def train_steps(model, optimizer, scheduler, batches, device) -> list[float]:
    model.train()
    losses = []
    for inputs, targets in batches:
        inputs, targets = inputs.to(device), targets.to(device)
        loss = loss_fn(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    return losses


@torch.no_grad()
def evaluate(model, batches, device) -> float:
    model.eval()
    total = 0.0
    for inputs, targets in batches:
        total += loss_fn(model(inputs.to(device)), targets.to(device)).item()
    return total / len(batches)


def main(device: str = "neuron", steps: int = 5, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    train_data = make_data(steps + STEPS_AFTER_RELOAD, seed)
    eval_data = make_data(2, seed + 1)

    model = TinyTransformerLM().to(device)
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

    model = TinyTransformerLM().to(device)
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
