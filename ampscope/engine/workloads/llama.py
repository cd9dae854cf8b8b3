"""A Llama-style decoder on the synthetic next-token task.

RMSNorm before attention and feed-forward, rotary position embeddings on queries and keys, a
SwiGLU feed-forward (hidden width 4 x width, as Llama 3.2 1B), grouped-query attention
(``kv_heads`` key/value heads shared by ``heads`` query heads), no biases and an untied head.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ampscope.engine.workloads.gpt import LanguageModelWorkload, lm_flops

ROPE_BASE = 500_000.0  # Llama 3's rotary base


def rope_tables(seq_len: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for every position and frequency, each pair of halves sharing one angle."""
    inv_freq = ROPE_BASE ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)  # (seq_len, head_dim)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Turn each (x_i, x_{i + d/2}) pair by its position's angle; x is (b, heads, t, d)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, width: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, width // heads
        self.wq = nn.Linear(width, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(width, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(width, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, width, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        group = self.heads // self.kv_heads  # each key/value head serves `group` query heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class SwiGlu(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(width, hidden, bias=False)
        self.w3 = nn.Linear(width, hidden, bias=False)
        self.w2 = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Layer(nn.Module):
    def __init__(self, width: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(width, eps=1e-5)
        self.attn = Attention(width, heads, kv_heads)
        self.ffn_norm = nn.RMSNorm(width, eps=1e-5)
        self.ffn = SwiGlu(width, 4 * width)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.ffn(self.ffn_norm(x))


class Llama(nn.Module):
    cos: torch.Tensor  # rotary tables, buffers (register_buffer)
    sin: torch.Tensor

    def __init__(
        self, vocab: int, seq_len: int, width: int, layers: int, heads: int, kv_heads: int
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(Layer(width, heads, kv_heads) for _ in range(layers))
        self.norm = nn.RMSNorm(width, eps=1e-5)
        self.output = nn.Linear(width, vocab, bias=False)
        cos, sin = rope_tables(seq_len, width // heads)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                residual = name.endswith(("wo.weight", "w2.weight"))
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers) if residual else 0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        cos, sin = self.cos[:t], self.sin[:t]
        x = self.tok(idx)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.output(self.norm(x))


class LlamaWorkload(LanguageModelWorkload):
    @staticmethod
    def build_model(dims: dict[str, int]) -> nn.Module:
        names = ("vocab", "seq_len", "width", "layers", "heads", "kv_heads")
        return Llama(*(dims[name] for name in names))

    @staticmethod
    def train_flops(model: nn.Module, dims: dict[str, int], batch_size: int) -> float:
        """6N per token for the matmul weights (the smaller k and v projections of grouped
        queries included as built), plus attention over every query head."""
        return lm_flops(model, dims, batch_size * dims["seq_len"])
