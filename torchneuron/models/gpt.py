"""A small GPT-style decoder-only transformer, a character tokenizer and a batch sampler."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    """Hyper-parameters of a :class:`GPT` model.

    Args:
        vocab_size: number of distinct tokens.
        block_size: maximum context length in tokens.
        n_layer: number of transformer blocks.
        n_head: number of attention heads per block.
        n_embd: width of the residual stream; must be divisible by ``n_head``.
        dropout: dropout probability used in training mode (0.0 disables it).
        bias: whether linear and LayerNorm layers carry a bias.
        tie_weights: share the token embedding matrix with the LM head.
    """

    vocab_size: int = 256
    block_size: int = 64
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True
    tie_weights: bool = True

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention built on ``scaled_dot_product_attention``.

    Args:
        config: model hyper-parameters.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attend over earlier positions only.

        Args:
            x: activations of shape ``(batch, time, n_embd)``.
        """
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(self.n_embd, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        drop = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    """Position-wise feed-forward network with a GELU non-linearity.

    Args:
        config: model hyper-parameters.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the MLP.

        Args:
            x: activations of shape ``(batch, time, n_embd)``.
        """
        return self.drop(self.proj(self.act(self.fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: attention then MLP, each with a residual.

    Args:
        config: model hyper-parameters.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block.

        Args:
            x: activations of shape ``(batch, time, n_embd)``.
        """
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Decoder-only language model with learned token and position embeddings.

    Args:
        config: model hyper-parameters.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        # With tied weights the head reuses ``wte.weight`` in forward(), so there is a
        # single parameter and the tie survives any device move.
        self.lm_head = None if config.tie_weights else nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Draw every parameter anew: what the constructor does, and what a model built on the meta
        device runs after ``to_empty(device=...)`` (and ``fully_shard``)."""
        self.apply(self._init_weights)
        scaled_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=scaled_std)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        """Initialise linear and embedding weights from N(0, 0.02) and biases to zero.

        Args:
            module: the sub-module to initialise.
        """
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.LayerNorm):
            module.reset_parameters()

    def num_parameters(self) -> int:
        """Return the number of trainable parameters."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def forward(
        self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Compute next-token logits and, when targets are given, the mean cross-entropy loss.

        Args:
            idx: token ids of shape ``(batch, time)`` with ``time <= block_size``.
            targets: optional next-token ids with the same shape as ``idx``.
        """
        t = idx.size(1)
        if t > self.config.block_size:
            raise ValueError(f"sequence length {t} exceeds block_size {self.config.block_size}")
        pos = torch.arange(t, dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        logits = F.linear(x, self.wte.weight) if self.lm_head is None else self.lm_head(x)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: Optional[int] = None,
        generator: Optional[torch.Generator] = None,
    ) -> torch.Tensor:
        """Extend ``idx`` by sampling ``max_new_tokens`` tokens one at a time.

        Sampling itself happens on the CPU with ``generator`` so the result only
        depends on the model's logits, not on the device's random number generator.

        Args:
            idx: prompt token ids of shape ``(batch, time)``.
            max_new_tokens: number of tokens to append.
            temperature: divides the logits; lower values are more conservative.
            top_k: if set, sample only among the ``top_k`` most likely tokens.
            generator: CPU random generator used for sampling.
        """
        for _ in range(max_new_tokens):
            context = idx[:, -self.config.block_size :]
            logits, _ = self(context)
            logits = logits[:, -1, :].float().cpu() / max(temperature, 1e-8)
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = F.softmax(logits, dim=-1)
            nxt = torch.multinomial(probs, num_samples=1, generator=generator)
            idx = torch.cat([idx, nxt.to(idx.device)], dim=1)
        return idx


class CharTokenizer:
    """Character-level tokenizer whose vocabulary is the sorted set of characters of a text.

    Args:
        text: the text that defines the vocabulary.
    """

    def __init__(self, text: str) -> None:
        if not text:
            raise ValueError("cannot build a tokenizer from an empty text")
        self.chars = sorted(set(text))
        self.stoi = {ch: i for i, ch in enumerate(self.chars)}
        self.itos = dict(enumerate(self.chars))

    @property
    def vocab_size(self) -> int:
        """Return the number of distinct characters."""
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        """Map a string to a list of token ids.

        Args:
            text: a string made only of characters in the vocabulary.
        """
        try:
            return [self.stoi[ch] for ch in text]
        except KeyError as exc:
            raise ValueError(f"character {exc.args[0]!r} is not in the vocabulary") from None

    def decode(self, ids: Iterable[int] | torch.Tensor) -> str:
        """Map token ids back to a string.

        Args:
            ids: a sequence of ids or a 1-D tensor of ids.
        """
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return "".join(self.itos[int(i)] for i in ids)


def get_batch(
    data: torch.Tensor,
    block_size: int,
    batch_size: int,
    generator: Optional[torch.Generator],
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample random input windows and their next-token targets, then move them to ``device``.

    Args:
        data: 1-D CPU tensor of token ids.
        block_size: length of each window.
        batch_size: number of windows.
        generator: CPU random generator that picks the window offsets.
        device: where the returned tensors live.
    """
    if data.numel() <= block_size:
        raise ValueError(f"data has {data.numel()} tokens, need more than block_size={block_size}")
    ix = torch.randint(data.numel() - block_size, (batch_size,), generator=generator)
    x = torch.stack([data[i : i + block_size] for i in ix.tolist()])
    y = torch.stack([data[i + 1 : i + 1 + block_size] for i in ix.tolist()])
    return x.to(device), y.to(device)
