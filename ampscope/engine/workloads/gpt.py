"""A small decoder-only transformer on a synthetic next-token task.

The data is a fixed random Markov chain: each token is followed by a fixed successor most of
the time and by a uniformly random token otherwise, with occasional repeats of an earlier
span. A model that learns the successor table (and to copy) cuts the loss from ln(vocab)
towards the chain's entropy, so numerical damage shows as a worse curve, not as noise.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ampscope.engine.workloads.base import BatchPool, TrainingWorkload, linear_params

POOL_BATCHES = 32
FOLLOW_PROB = 0.97


class GPTBlock(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width, bias=False)
        self.out = nn.Linear(4 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Gpt(nn.Module):
    def __init__(self, vocab: int, seq_len: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(seq_len, width)
        self.blocks = nn.ModuleList(GPTBlock(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = (
                    0.02 / math.sqrt(2 * layers)
                    if name.endswith(("proj.weight", "out.weight"))
                    else 0.02
                )
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def markov_sequences(
    count: int, length: int, vocab: int, generator: torch.Generator
) -> torch.Tensor:
    successor = torch.randperm(vocab, generator=generator)
    seqs = torch.empty(count, length, dtype=torch.long)
    seqs[:, 0] = torch.randint(vocab, (count,), generator=generator)
    follow = torch.rand(count, length, generator=generator) < FOLLOW_PROB
    noise = torch.randint(vocab, (count, length), generator=generator)
    for i in range(1, length):
        seqs[:, i] = torch.where(follow[:, i], successor[seqs[:, i - 1]], noise[:, i])
    return seqs


def token_pool(
    dims: dict[str, int], batch_size: int, device: torch.device, generator: torch.Generator
) -> BatchPool:
    """Next-token batches from the Markov chain, for any of the language models."""
    vocab, seq_len = dims["vocab"], dims["seq_len"]
    seqs = markov_sequences(POOL_BATCHES * batch_size, seq_len + 1, vocab, generator).to(device)
    return BatchPool(seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous(), batch_size, generator)


def lm_flops(model: nn.Module, dims: dict[str, int], tokens: int) -> float:
    """Model FLOPs of a decoder per step: 6N per token for the matmul weights (the head
    included), plus attention's scores and values, 12 x layers x width x context per token
    (PaLM, appendix B): the full T x T products, as the math kernel computes them, with no
    recompute. The first matmul's input (the embeddings) is trained, so it needs its
    gradient: no layer is exempt here."""
    attention = 12 * dims["layers"] * dims["width"] * dims["seq_len"]
    return float((6 * linear_params(model) + attention) * tokens)


class LanguageModelWorkload(TrainingWorkload):
    """A decoder LM on the synthetic token pool: the GPT, nanoGPT's GPT-2 and the Llama share
    the data, the token count and the FLOP formula; each builds its own model."""

    def __init__(
        self,
        dims: dict[str, int],
        batch_size: int,
        device: torch.device,
        generator: torch.Generator,
    ) -> None:
        model = self.build_model(dims).to(device)
        super().__init__(
            model,
            token_pool(dims, batch_size, device, generator),
            tokens_per_step=batch_size * dims["seq_len"],
            flops_per_step=self.train_flops(model, dims, batch_size),
        )

    @staticmethod
    def train_flops(model: nn.Module, dims: dict[str, int], batch_size: int) -> float:
        return lm_flops(model, dims, batch_size * dims["seq_len"])


class GptWorkload(LanguageModelWorkload):
    @staticmethod
    def build_model(dims: dict[str, int]) -> nn.Module:
        return Gpt(dims["vocab"], dims["seq_len"], dims["width"], dims["layers"], dims["heads"])
