"""Llama-style decoders and Whisper-style encoder-decoders built from a config, for projecting
models larger than this machine.

Self-contained (no Hugging Face): RMSNorm, rotary embeddings, grouped-query attention through
``F.scaled_dot_product_attention``, SwiGLU feed-forward, untied output head. Build it under
:func:`torchneuron.projection.counting.fake_mode` or on the meta device and nothing is allocated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class LlamaConfig:
    """Shape of a Llama-style model.

    Args:
        dim: hidden size.
        n_layers: transformer blocks.
        n_heads: query heads.
        n_kv_heads: key/value heads (grouped-query attention when fewer than ``n_heads``).
        ffn_dim: inner size of the SwiGLU feed-forward.
        vocab: vocabulary size.
        causal: decoder (True) or encoder-style full attention (False).
    """

    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab: int
    causal: bool = True

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def num_params(self) -> int:
        """Parameters of the model, embeddings and head included."""
        kv = self.n_kv_heads * self.head_dim
        attn = self.dim * self.dim * 2 + self.dim * kv * 2
        ffn = 3 * self.dim * self.ffn_dim
        return self.n_layers * (attn + ffn + 2 * self.dim) + 2 * self.vocab * self.dim + self.dim

    def forward_flops(self, tokens: int, seq: int) -> float:
        """Analytical forward FLOPs: 2 per weight per token (embedding lookup excluded) plus attention.

        Attention adds ``4·seq·dim`` per token per layer (scores and weighted sum); causal masking
        is not subtracted, as PyTorch's formulas count it.
        """
        weights = self.num_params() - self.vocab * self.dim - self.dim * (2 * self.n_layers + 1)
        return 2.0 * weights * tokens + 4.0 * self.n_layers * tokens * seq * self.dim


LLAMA_CONFIGS = {
    # Meta Llama 3 model cards / config.json: 8B and 70B.
    "llama3-8b": LlamaConfig(4096, 32, 32, 8, 14336, 128256),
    "llama3-70b": LlamaConfig(8192, 80, 64, 8, 28672, 128256),
    # Llama 2 (Touvron et al., 2023, Table 1 / config.json).
    "llama2-7b": LlamaConfig(4096, 32, 32, 32, 11008, 32000),
    "llama2-13b": LlamaConfig(5120, 40, 40, 40, 13824, 32000),
    "llama2-70b": LlamaConfig(8192, 80, 64, 8, 28672, 32000),
    # Mistral 7B (Jiang et al., 2023, Table 1; v0.2 config.json: no sliding window, 32k context).
    "mistral-7b": LlamaConfig(4096, 32, 32, 8, 14336, 32000),
    # GPT-3 175B (Brown et al., 2020, Table 2.1): 96 layers, d=12288, 96 heads; its 4·d GELU MLP has
    # the weights of a SwiGLU with ffn = 8·d/3, so the matmul FLOPs are the same.
    "gpt3-175b": LlamaConfig(12288, 96, 96, 96, 32768, 50257),
    # BERT-Large (Devlin et al., 2019): 24 layers, d=1024, 16 heads, 4096 MLP, 30522 vocab; encoder.
    "bert-large": LlamaConfig(1024, 24, 16, 16, 2731, 30522, causal=False),
    # ViT-Base/16 (Dosovitskiy et al., 2021): 12 layers, d=768, 12 heads, 3072 MLP; 197 tokens;
    # the patch embedding is a 768x768 matmul modelled as the "vocab" head of size 1000 classes.
    "vit-base": LlamaConfig(768, 12, 12, 12, 2048, 1000, causal=False),
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """Scaled dot-product attention, fused on fake and meta tensors.

    Counting without data runs PyTorch's flash-attention op, whose FLOPs PyTorch's formulas know and
    whose memory traffic is q, k, v and the output, as on accelerators with fused attention kernels.
    On real tensors it is ``F.scaled_dot_product_attention``.
    """
    if q.device.type == "meta" or _is_fake(q):
        return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)[0]
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        kv = cfg.n_kv_heads * cfg.head_dim
        self.attn_norm = RMSNorm(cfg.dim)
        self.wq = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wk = nn.Linear(cfg.dim, kv, bias=False)
        self.wv = nn.Linear(cfg.dim, kv, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.ffn_norm = RMSNorm(cfg.dim)
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache_len: int = 0) -> torch.Tensor:
        cfg = self.cfg
        b, s, _ = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(b, s, cfg.n_heads, cfg.head_dim).transpose(1, 2)
        k = self.wk(h).view(b, s, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        v = self.wv(h).view(b, s, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        q, k = _rotary(q, cos, sin), _rotary(k, cos, sin)
        a = self._attend(q, k, v, cache_len)
        x = x + self.wo(a.transpose(1, 2).reshape(b, s, cfg.dim))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache_len: int) -> torch.Tensor:
        """Attention of ``q`` (batch x heads x s x head_dim, after rotary) to its own keys and values
        and, with ``cache_len``, to that many cached ones before them."""
        cfg = self.cfg
        b, _, s, _ = q.shape
        if cache_len:
            # Decoding against a KV cache of cache_len earlier tokens (values irrelevant to counting):
            # each query head group reads its key/value head once, as grouped-query kernels do.
            n = cache_len + s
            kc = k.new_zeros(()).expand(b, cfg.n_kv_heads, n, cfg.head_dim)
            vc = v.new_zeros(()).expand(b, cfg.n_kv_heads, n, cfg.head_dim)
            rep = cfg.n_heads // cfg.n_kv_heads
            qg = q.reshape(b, cfg.n_kv_heads, rep * s, cfg.head_dim)
            return attention(qg, kc, vc, False).reshape(b, cfg.n_heads, s, cfg.head_dim)
        if cfg.n_kv_heads != cfg.n_heads:
            rep = cfg.n_heads // cfg.n_kv_heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        return attention(q, k, v, cfg.causal)

    def forward_groups(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                       groups: Sequence[Tuple[int, int, int]]) -> torch.Tensor:
        """The block on one flat batch of tokens (1 x tokens x dim) made of ``groups`` of requests:
        ``(requests, new tokens each, cached tokens each)``, laid out group after group.

        The projections and the feed-forward run once on every token, as a serving engine's
        flattened batch does; attention runs per group against its own cache."""
        cfg = self.cfg
        h = self.attn_norm(x)
        q, k, v = self.wq(h), self.wk(h), self.wv(h)
        kv = cfg.n_kv_heads
        outs = []
        start = 0
        for b, s, cached in groups:
            end = start + b * s
            qg = q[:, start:end].reshape(b, s, cfg.n_heads, cfg.head_dim).transpose(1, 2)
            kg = k[:, start:end].reshape(b, s, kv, cfg.head_dim).transpose(1, 2)
            vg = v[:, start:end].reshape(b, s, kv, cfg.head_dim).transpose(1, 2)
            qg, kg = _rotary(qg, cos[:s], sin[:s]), _rotary(kg, cos[:s], sin[:s])
            outs.append(self._attend(qg, kg, vg, cached).transpose(1, 2).reshape(1, b * s, cfg.dim))
            start = end
        a = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
        x = x + self.wo(a)
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    """Llama-style model: ``forward(tokens) -> logits``.

    Args:
        cfg: the model's shape.
    """

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, tokens: torch.Tensor, cache_len: int = 0) -> torch.Tensor:
        """Logits for ``tokens``; with ``cache_len`` (fake or meta tensors only), a decode step that
        attends to ``cache_len`` cached tokens besides its own."""
        if cache_len and not (tokens.device.type == "meta" or _is_fake(tokens)):
            raise ValueError("cache_len is for counting on fake or meta tensors; this model keeps no KV cache")
        s = tokens.shape[1]
        half = self.cfg.head_dim // 2
        inv = 1.0 / (10000.0 ** (torch.arange(half, device=tokens.device, dtype=torch.float32) / half))
        ang = torch.outer(torch.arange(cache_len, cache_len + s, device=tokens.device, dtype=torch.float32), inv)
        cos, sin = ang.cos().to(self.embed.weight.dtype), ang.sin().to(self.embed.weight.dtype)
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin, cache_len)
        return self.head(self.norm(x))

    def forward_step(self, tokens: torch.Tensor, groups: Sequence[Tuple[int, int, int]], sampled: int) -> torch.Tensor:
        """One step of a serving engine (fake or meta tensors only): logits of ``sampled`` tokens.

        Args:
            tokens: ``1 x T``, every token the step computes, ``T = sum(requests * new)``.
            groups: ``(requests, new tokens each, cached tokens each)``: the engine's ragged batch in
                groups of equal shape (the decodes of a step at their mean cache length, each prompt
                chunk after the tokens of its prompt already in the cache).
            sampled: requests that sample a token this step; only their last positions reach the
                output head, as in vLLM.
        """
        if not (tokens.device.type == "meta" or _is_fake(tokens)):
            raise ValueError("forward_step is for counting on fake or meta tensors; this model keeps no KV cache")
        if tokens.shape[1] != sum(b * s for b, s, _ in groups):
            raise ValueError(f"forward_step: {tokens.shape[1]} tokens for groups totalling "
                             f"{sum(b * s for b, s, _ in groups)}")
        half = self.cfg.head_dim // 2
        longest = max(s for _, s, _ in groups)
        inv = 1.0 / (10000.0 ** (torch.arange(half, device=tokens.device, dtype=torch.float32) / half))
        ang = torch.outer(torch.arange(longest, device=tokens.device, dtype=torch.float32), inv)
        cos, sin = ang.cos().to(self.embed.weight.dtype), ang.sin().to(self.embed.weight.dtype)
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer.forward_groups(x, cos, sin, groups)
        return self.head(self.norm(x[:, :sampled]))


def build(name_or_cfg, dtype: torch.dtype = torch.bfloat16, device: str = "meta") -> Llama:
    """Build a model from a name in :data:`LLAMA_CONFIGS` or a :class:`LlamaConfig`, without initialising.

    Args:
        name_or_cfg: config name or config.
        dtype: parameter dtype.
        device: ``"meta"`` (default) allocates nothing.
    """
    cfg = LLAMA_CONFIGS[name_or_cfg] if isinstance(name_or_cfg, str) else name_or_cfg
    with torch.device(device):
        model = Llama(cfg)
    return model.to(dtype)


@dataclass(frozen=True)
class EncoderDecoderConfig:
    """Shape of a Whisper-style encoder-decoder (audio frames in, text tokens out).

    Args:
        dim: hidden size.
        encoder_layers, decoder_layers: blocks on each side.
        n_heads: attention heads.
        ffn_dim: inner size of the (GELU) feed-forward.
        vocab: text vocabulary.
        mel_bins: input channels of the convolutional front end.
        frames: encoder positions after the front end (1500 for 30 s of audio).
    """

    dim: int
    encoder_layers: int
    decoder_layers: int
    n_heads: int
    ffn_dim: int
    vocab: int
    mel_bins: int = 80
    frames: int = 1500


WHISPER_CONFIGS = {
    # Whisper model card / config.json (Radford et al., 2022, Table 1): medium and large-v3.
    "whisper-medium": EncoderDecoderConfig(1024, 24, 24, 16, 4096, 51865),
    "whisper-large-v3": EncoderDecoderConfig(1280, 32, 32, 20, 5120, 51866, mel_bins=128),
}


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, source: torch.Tensor, causal: bool) -> torch.Tensor:
        b, s, d = x.shape
        t = source.shape[1]
        h, hd = self.heads, d // self.heads
        q = self.q(x).view(b, s, h, hd).transpose(1, 2)
        k = self.k(source).view(b, t, h, hd).transpose(1, 2)
        v = self.v(source).view(b, t, h, hd).transpose(1, 2)
        return self.o(attention(q, k, v, causal).transpose(1, 2).reshape(b, s, d))


class _EncDecBlock(nn.Module):
    def __init__(self, cfg: EncoderDecoderConfig, cross: bool) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.dim)
        self.attn = _Attention(cfg.dim, cfg.n_heads)
        self.cross = _Attention(cfg.dim, cfg.n_heads) if cross else None
        self.norm_cross = nn.LayerNorm(cfg.dim) if cross else None
        self.norm2 = nn.LayerNorm(cfg.dim)
        self.fc1 = nn.Linear(cfg.dim, cfg.ffn_dim)
        self.fc2 = nn.Linear(cfg.ffn_dim, cfg.dim)

    def forward(self, x: torch.Tensor, memory: Optional[torch.Tensor] = None) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, causal=memory is not None)
        if self.cross is not None:
            x = x + self.cross(self.norm_cross(x), memory, causal=False)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class EncoderDecoder(nn.Module):
    """Whisper-style model: ``forward(mel, tokens) -> logits`` (mel: batch x mel_bins x 2·frames)."""

    def __init__(self, cfg: EncoderDecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.conv1 = nn.Conv1d(cfg.mel_bins, cfg.dim, 3, padding=1)
        self.conv2 = nn.Conv1d(cfg.dim, cfg.dim, 3, stride=2, padding=1)
        self.enc_pos = nn.Parameter(torch.zeros(cfg.frames, cfg.dim))
        self.encoder = nn.ModuleList(_EncDecBlock(cfg, cross=False) for _ in range(cfg.encoder_layers))
        self.enc_norm = nn.LayerNorm(cfg.dim)
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.dec_pos = nn.Parameter(torch.zeros(448, cfg.dim))
        self.decoder = nn.ModuleList(_EncDecBlock(cfg, cross=True) for _ in range(cfg.decoder_layers))
        self.dec_norm = nn.LayerNorm(cfg.dim)

    def forward(self, mel: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.conv2(F.gelu(self.conv1(mel)))).transpose(1, 2)
        x = x + self.enc_pos[: x.shape[1]]
        for block in self.encoder:
            x = block(x)
        memory = self.enc_norm(x)
        y = self.embed(tokens) + self.dec_pos[: tokens.shape[1]]
        for block in self.decoder:
            y = block(y, memory)
        return self.dec_norm(y) @ self.embed.weight.t()

    def encode(self, mel: torch.Tensor) -> torch.Tensor:
        """The encoder's output for ``mel``, and what transcription computes once per clip besides:
        every decoder layer's cross-attention keys and values of that output."""
        x = F.gelu(self.conv2(F.gelu(self.conv1(mel)))).transpose(1, 2)
        x = x + self.enc_pos[: x.shape[1]]
        for block in self.encoder:
            x = block(x)
        memory = self.enc_norm(x)
        for block in self.decoder:
            block.cross.k(memory), block.cross.v(memory)
        return memory

    def decode(self, tokens: torch.Tensor, cache_len: int = 0) -> torch.Tensor:
        """One decoder step of ``tokens`` after ``cache_len`` cached ones (fake or meta tensors only):
        self-attention reads the cached keys and values, cross-attention the clip's cached ones."""
        if not (tokens.device.type == "meta" or _is_fake(tokens)):
            raise ValueError("decode is for counting on fake or meta tensors; this model keeps no KV cache")
        cfg = self.cfg
        b, s = tokens.shape
        hd = cfg.dim // cfg.n_heads
        y = self.embed(tokens) + self.dec_pos[min(cache_len, 448 - s): min(cache_len, 448 - s) + s]
        for block in self.decoder:
            h = block.norm1(y)
            q = block.attn.q(h).view(b, s, cfg.n_heads, hd).transpose(1, 2)
            k, v = block.attn.k(h), block.attn.v(h)  # this step's key and value join the cache
            kc = k.new_zeros(()).expand(b, cfg.n_heads, cache_len + s, hd)
            vc = v.new_zeros(()).expand(b, cfg.n_heads, cache_len + s, hd)
            y = y + block.attn.o(attention(q, kc, vc, False).transpose(1, 2).reshape(b, s, cfg.dim))
            q = block.cross.q(block.norm_cross(y)).view(b, s, cfg.n_heads, hd).transpose(1, 2)
            mc = q.new_zeros(()).expand(b, cfg.n_heads, cfg.frames, hd)
            y = y + block.cross.o(attention(q, mc, mc, False).transpose(1, 2).reshape(b, s, cfg.dim))
            y = y + block.fc2(F.gelu(block.fc1(block.norm2(y))))
        return self.dec_norm(y) @ self.embed.weight.t()


def build_encoder_decoder(name_or_cfg, dtype: torch.dtype = torch.bfloat16, device: str = "meta") -> EncoderDecoder:
    """Build a Whisper-style model from a name in :data:`WHISPER_CONFIGS` or a config, without initialising."""
    cfg = WHISPER_CONFIGS[name_or_cfg] if isinstance(name_or_cfg, str) else name_or_cfg
    with torch.device(device):
        model = EncoderDecoder(cfg)
    return model.to(dtype)
