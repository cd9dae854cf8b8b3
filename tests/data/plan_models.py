"""Models for ``ampscope plan`` (tests/test_plan_*.py), each a ``--model`` factory.

- ``make_llama``: a Llama-shaped stack (RMSNorm, grouped-query attention with q/k/v/o
  projections, a SwiGLU MLP, an untied head) whose layers differ in width: planned for 65536
  tokens a step on an H200, the wide MLP projections pay in fp8 and the narrow k/v
  projections and the head do not, so the plan mixes fp8 and bf16.
- ``make_small``, ``make_small_outlier``: the same at a quarter of the width, for training on a
  CPU (``--verify``), planned for an RTX 4090 D.
- ``make_outlier``: the same stack with one planted outlier token: position 0's activations
  are 1e7 times the others' (as a model's first token often is, far less) where they enter
  ``blocks.0.mlp.up``. Scaled per tensor, that one token sets the scale and the rest of the
  input flushes to zero; scaled per token (rowwise's forward cast) it holds; scaled per
  feature across tokens (rowwise's grad-weight cast) it flushes again; rowwise_with_gw_hp keeps
  that GEMM in bf16 and holds it.
- ``make_late_outlier``, ``make_late_overflow``: one MLP projection whose batches are ordinary until
  step ``LATE_STEP``, then carry the trouble: one outlier token 1e7 times the others (fp8's
  tensorwise scale flushes the rest), or values beyond fp16's 65504 entering ``up``. Only a
  plan that watches that step sees it.

One fixed batch is served every step (a few AdamW steps make the loss fall), seeded; the late
ones change theirs at ``LATE_STEP``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

WIDTH = 512
HIDDEN = 2048  # the MLP's: 512 -> 2048 and back pays in fp8 at 65536 tokens on an H200
KV = 128  # grouped-query k/v: 512 -> 128 does not
VOCAB = 256
SEQ = 32
BATCH = 4
OUTLIER = 1e7  # position 0's scale where it enters blocks.0.mlp.up


class RMSNorm(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Attention(nn.Module):
    def __init__(self, width: int, kv: int, heads: int = 8) -> None:
        super().__init__()
        self.heads, self.kv_heads = heads, heads * kv // width
        self.q = nn.Linear(width, width, bias=False)
        self.k = nn.Linear(width, kv, bias=False)
        self.v = nn.Linear(width, kv, bias=False)
        self.o = nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        hd = d // self.heads
        q = self.q(x).view(b, t, self.heads, hd).transpose(1, 2)
        k = self.k(x).view(b, t, self.kv_heads, hd).transpose(1, 2)
        v = self.v(x).view(b, t, self.kv_heads, hd).transpose(1, 2)
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, width: int, hidden: int, spike: torch.Tensor | None = None) -> None:
        super().__init__()
        self.gate = nn.Linear(width, hidden, bias=False)
        self.up = nn.Linear(width, hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)
        self.register_buffer("spike", spike if spike is not None else torch.ones(SEQ))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spiked = x * self.spike[: x.shape[1], None]  # a position's planted scale (1 elsewhere)
        up = self.up(spiked)
        up = up * torch.rsqrt(up.pow(2).mean(-1, keepdim=True) + 1e-6)  # back to order 1
        return self.down(F.silu(self.gate(x)) * up)


class Block(nn.Module):
    def __init__(self, width: int, hidden: int, kv: int, spike: torch.Tensor | None) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(width)
        self.attn = Attention(width, kv)
        self.mlp_norm = RMSNorm(width)
        self.mlp = MLP(width, hidden, spike)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    def __init__(
        self,
        spike: torch.Tensor | None = None,
        width: int = WIDTH,
        hidden: int = HIDDEN,
        kv: int = KV,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.blocks = nn.ModuleList([Block(width, hidden, kv, spike)])
        self.norm = RMSNorm(width)
        self.head = nn.Linear(width, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def _answer(model: nn.Module, seed: int, batch: int, name: str) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch, SEQ + 1), generator=g)
    fixed = (ids[:, :-1], ids[:, 1:])
    return {"model": model, "batches": lambda step: fixed, "loss": lm_loss, "name": name}


def make_llama(ctx):
    torch.manual_seed(ctx.seed)
    return _answer(Llama(), ctx.seed, BATCH, "plan-llama")


def outlier_spike() -> torch.Tensor:
    spike = torch.full((SEQ,), 1e-3)
    spike[0] = 1e-3 * OUTLIER
    return spike


def make_outlier(ctx):
    """One sequence: position 0 is the single outlier token among 32."""
    torch.manual_seed(ctx.seed)
    return _answer(Llama(outlier_spike()), ctx.seed, 1, "plan-outlier")


# A quarter of the width, for training runs on a CPU (--verify): planned for an RTX 4090 D,
# the 256 -> 1024 MLP pays in fp8 at 65536 tokens, the 256-wide attention and head do not.
SMALL = {"width": 256, "hidden": 1024, "kv": 64}


def make_small(ctx):
    torch.manual_seed(ctx.seed)
    return _answer(Llama(None, **SMALL), ctx.seed, 2, "plan-small")


def make_small_outlier(ctx):
    torch.manual_seed(ctx.seed)
    return _answer(Llama(outlier_spike(), **SMALL), ctx.seed, 1, "plan-small-outlier")


# Trouble from a later step on: the first LATE_STEP batches are ordinary.
LATE_STEP = 3
LATE_ROWS = 32


class LateUp(nn.Module):
    """One 512 -> 2048 projection: planned for 65536 tokens on an H200, it pays in tensorwise
    fp8 while its input holds no outlier."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(x)


def _late(seed: int, late_scale: torch.Tensor, name: str) -> dict:
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(LATE_ROWS, WIDTH, generator=g)
    target = torch.randn(LATE_ROWS, HIDDEN, generator=g)
    ordinary, late = (x, target), (x * late_scale, target)
    return {
        "model": LateUp(),
        "batches": lambda step: ordinary if step < LATE_STEP else late,
        "loss": lambda out, y: F.mse_loss(out.float(), y),
        "name": name,
    }


def make_late_outlier(ctx):
    """From step LATE_STEP on, token 0 of the batch is 1e7 times the others."""
    scale = torch.ones(LATE_ROWS, 1)
    scale[0] = OUTLIER
    return _late(ctx.seed, scale, "plan-late-outlier")


def make_late_overflow(ctx):
    """From step LATE_STEP on, the batch is 1e5 times larger: beyond fp16's 65504."""
    return _late(ctx.seed, torch.full((LATE_ROWS, 1), 1e5), "plan-late-overflow")
