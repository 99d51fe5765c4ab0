"""The demo's GPT trained with NKI kernels for its RMSNorm and its attention forward, against the same
model on PyTorch's own ops: the losses agree to float tolerance.

Both models are the demo's configuration with RMSNorm for LayerNorm. The NKI one replaces each
``torch.nn.RMSNorm`` forward with ``nki_examples::rms_norm`` and ``scaled_dot_product_attention`` with
``nki_examples::attention`` (nki_ops.py); weights, batches and optimizer are the same.

    python examples/kernels/train_gpt.py --steps 10
    torchneuron project examples/kernels/train_gpt.py --fake -- --steps 3 --nki-only
"""

import argparse
import copy
import time

import torch

import torchneuron  # noqa: F401
from torchneuron.data import load_text
from torchneuron.demo import BATCH_SIZE, LEARNING_RATE, demo_config
from torchneuron.models import GPT, CharTokenizer, get_batch
from torchneuron.models.gpt import CausalSelfAttention

import nki_ops


class NkiRMSNorm(torch.nn.RMSNorm):
    def forward(self, x):
        return nki_ops.rms_norm(x, self.weight, self.eps)


class NkiAttention(CausalSelfAttention):
    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(self.n_embd, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = nki_ops.attention(q, k, v, True)
        return self.resid_drop(self.proj(y.transpose(1, 2).contiguous().view(b, t, c)))


def build(vocab_size: int, seed: int = 0, n_layer: int = 4) -> GPT:
    """The demo's GPT with RMSNorm (eps 1e-6) where it has LayerNorm, on PyTorch's ops."""
    config = demo_config(vocab_size)
    config.n_layer = n_layer
    torch.manual_seed(seed)
    model = GPT(config)
    for block in model.blocks:
        block.ln1, block.ln2 = torch.nn.RMSNorm(config.n_embd, eps=1e-6), torch.nn.RMSNorm(config.n_embd, eps=1e-6)
    model.ln_f = torch.nn.RMSNorm(config.n_embd, eps=1e-6)
    return model


def with_nki(model: GPT) -> GPT:
    """A copy of ``model`` whose norms and attention run the NKI kernels (same parameters, same names)."""
    model = copy.deepcopy(model)
    for module in model.modules():
        if type(module) is torch.nn.RMSNorm:
            module.__class__ = NkiRMSNorm
        elif type(module) is CausalSelfAttention:
            module.__class__ = NkiAttention
    return model


def train(model: GPT, data: torch.Tensor, steps: int, device: str = "neuron", seed: int = 0):
    """AdamW steps on the demo's batches; returns the losses and the seconds per step."""
    model = model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, foreach=False)
    gen = torch.Generator().manual_seed(seed)
    losses, seconds = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        x, y = get_batch(data, model.config.block_size, BATCH_SIZE, gen, device)
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        seconds.append(time.perf_counter() - t0)
    return losses, seconds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--nki-only", action="store_true",
                        help="train the model with the NKI kernels alone, not compared (what a projection counts: "
                             "torchneuron project examples/kernels/train_gpt.py --fake -- --nki-only)")
    args = parser.parse_args(argv)
    text = load_text()
    tok = CharTokenizer(text)
    data = torch.tensor(tok.encode(text), dtype=torch.long)
    plain = build(tok.vocab_size, n_layer=args.layers)
    nki = with_nki(plain)
    if args.nki_only:
        got, _ = train(nki, data, args.steps)
        print(f"{args.steps} steps with the NKI kernels: loss {got[0]:.4f} -> {got[-1]:.4f}")
        return got, None
    want, t_plain = train(plain, data, args.steps)
    got, t_nki = train(nki, data, args.steps)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-5)
    print(f"{args.steps} steps: NKI losses {got[0]:.4f} -> {got[-1]:.4f}, PyTorch's {want[0]:.4f} -> {want[-1]:.4f}, "
          f"largest difference {max(abs(a - b) for a, b in zip(got, want)):.2e}")
    median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    print(f"median step: {median(t_nki) * 1e3:.0f} ms with the NKI kernels, {median(t_plain) * 1e3:.0f} ms without "
          f"(on the emulated device; see benchmarks/bench_kernels.py)")
    return got, want


if __name__ == "__main__":
    main()
