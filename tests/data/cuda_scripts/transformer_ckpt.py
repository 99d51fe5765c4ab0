"""Train a tiny transformer language model, checkpoint it, reload it with map_location="cuda", go on.

Written for a CUDA machine: torch.device("cuda"), torch.cuda.manual_seed, a CUDA
checkpoint loaded back with map_location="cuda". The torchneuron tests run it
unchanged through the CUDA compatibility layer and through `torchneuron migrate`.
Prints one `step N loss=<float>` line per step.
"""

import argparse
import math
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int = 32, heads: int = 4, layers: int = 2, context: int = 16,
                 dropout: float = 0.1):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(1, context, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)
        mask = torch.triu(torch.full((context, context), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        h = self.tok(idx) * math.sqrt(self.tok.embedding_dim) + self.pos[:, :t]
        h = self.blocks(h, mask=self.mask[:t, :t], is_causal=True)
        return self.head(h)


def batches(data, batch_size, context, device):
    while True:
        ix = torch.randint(0, data.numel() - context - 1, (batch_size,))
        x = torch.stack([data[i:i + context] for i in ix.tolist()])
        y = torch.stack([data[i + 1:i + 1 + context] for i in ix.tolist()])
        yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def train(model, optimizer, stream, steps, first_step):
    model.train()
    for step in range(first_step, first_step + steps):
        x, y = next(stream)
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        print(f"step {step} loss={loss.item():.6f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--checkpoint-dir", default=None)
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    torch.cuda.manual_seed(args.seed)

    text = "the quick brown fox jumps over the lazy dog. " * 20
    vocab = sorted(set(text))
    data = torch.tensor([vocab.index(c) for c in text], dtype=torch.long)
    stream = batches(data, batch_size=8, context=16, device=device)

    model = TinyLM(len(vocab)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    train(model, optimizer, stream, args.steps, 0)

    ckpt_dir = args.checkpoint_dir or tempfile.mkdtemp()
    path = os.path.join(ckpt_dir, "ckpt.pt")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "cpu_rng": torch.get_rng_state(), "cuda_rng": torch.cuda.get_rng_state()}, path)

    # Resume as a new process would: fresh objects, weights from the checkpoint.
    model = TinyLM(len(vocab)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    state = torch.load(path, map_location="cuda")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["cpu_rng"].cpu())
    torch.cuda.set_rng_state(state["cuda_rng"].cpu())
    assert next(model.parameters()).is_cuda
    model.eval()
    with torch.no_grad():
        x, y = next(stream)
        eval_loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    print(f"eval loss={eval_loss.item():.6f}")
    train(model, optimizer, stream, args.steps, args.steps)


if __name__ == "__main__":
    main()
