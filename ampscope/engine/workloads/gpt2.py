"""GPT-2 small as nanoGPT builds it, on the synthetic next-token task.

nanoGPT's configuration: 12 layers, width 768, 12 heads, context 1024, vocabulary 50304 (50257
padded to a multiple of 64), biases in every Linear and LayerNorm, and the token embedding
tied to the output head: 124M parameters. Its tokens/s and MFU can be held against nanoGPT's
own figures (whose ``estimate_mfu`` uses the same 6N + 12 x layers x width x context).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ampscope.engine.workloads.gpt import LanguageModelWorkload, lm_flops


class GPT2Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width)
        self.c_attn = nn.Linear(width, 3 * width)
        self.attn_proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.c_fc = nn.Linear(width, 4 * width)
        self.mlp_proj = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class Gpt2(nn.Module):
    def __init__(self, vocab: int, seq_len: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(seq_len, width)
        self.blocks = nn.ModuleList(GPT2Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as in GPT-2
        for name, p in self.named_parameters():  # nanoGPT's initialisation
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                residual = name.endswith("proj.weight")
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers) if residual else 0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class Gpt2Workload(LanguageModelWorkload):
    @staticmethod
    def build_model(dims: dict[str, int]) -> nn.Module:
        return Gpt2(dims["vocab"], dims["seq_len"], dims["width"], dims["layers"], dims["heads"])

    @staticmethod
    def train_flops(model: nn.Module, dims: dict[str, int], batch_size: int) -> float:
        """As nanoGPT's estimate: 6N per token (the tied head counted as a matmul, not the
        embedding lookup), plus attention."""
        return lm_flops(model, dims, batch_size * dims["seq_len"])
