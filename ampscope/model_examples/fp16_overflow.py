"""A model with one layer whose outputs leave fp16's range: the lecture's planted overflow.

    ampscope run amp-fp16 --model examples/fp16_overflow.py:make --steps 20   # every step skipped
    ampscope plan fp16 --model examples/fp16_overflow.py:make --verify 30     # which layers stay fp32

``amplify`` is a linear layer with a large gain (its outputs reach about 2e5, as a layer with a
runaway scale does), and a LayerNorm brings them back to order 1. In fp32 and bf16 (whose
range is fp32's) it trains. Under amp-fp16 ``amplify`` computes in fp16, its outputs overflow
to inf, the LayerNorm turns them into NaN, and the GradScaler skips every step: lowering the
loss scale cannot help an overflow in the forward pass. ``ampscope plan fp16`` keeps
``amplify`` and the LayerNorm that takes its output in fp32 (the preset field
``fp32_modules``): amp-fp16 then trains, everything else still in fp16.
"""

from __future__ import annotations

import torch
from torch import nn

import ampscope

GAIN = 2e5  # amplify's weights this much larger than their initialisation: outputs to ~2e5


class Amplified(nn.Module):
    def __init__(self, features: int = 32, width: int = 64, classes: int = 10) -> None:
        super().__init__()
        self.inp = nn.Linear(features, width)
        self.amplify = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)
        self.hidden = nn.Linear(width, width)
        self.head = nn.Linear(width, classes)
        with torch.no_grad():
            self.amplify.weight.mul_(GAIN)
            self.amplify.bias.mul_(GAIN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        h = self.norm(self.amplify(h))
        return self.head(torch.relu(self.hidden(h)))


def make(ctx: ampscope.ModelContext) -> ampscope.Workload:
    g = torch.Generator().manual_seed(ctx.seed)
    batch = ctx.batch_size or 64
    x = torch.randn(16 * batch, 32, generator=g)
    teacher = torch.randn(32, 10, generator=g)
    y = (x @ teacher).argmax(dim=1)  # labels from a fixed random teacher: learnable
    batches = [(x[i : i + batch], y[i : i + batch]) for i in range(0, len(x), batch)]
    return ampscope.Workload(
        model=Amplified().to(ctx.device),
        batches=batches,
        loss=nn.functional.cross_entropy,
        name="fp16-overflow",
    )
