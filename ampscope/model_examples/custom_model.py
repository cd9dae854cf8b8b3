"""A plain PyTorch model and DataLoader, ready for ampscope: copy this file and make it yours.

    ampscope run amp-bf16 --model examples/custom_model.py:make
    ampscope bench --model examples/custom_model.py:make

``make(ctx)`` is all ampscope needs: it builds the model on ``ctx.device`` and says where the
batches come from. ampscope applies the preset's precision, compile mode, optimizer (AdamW),
clipping and telemetry, exactly as for its own workloads.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ampscope  # only for the type: ampscope.Workload needs no torch import of its own


class ResidualMlp(nn.Module):
    """A stack of pre-norm residual MLP blocks and a classifier head."""

    def __init__(self, features: int, width: int, blocks: int, classes: int) -> None:
        super().__init__()
        self.inp = nn.Linear(features, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(
                nn.LayerNorm(width),
                nn.Linear(width, 4 * width),
                nn.GELU(),
                nn.Linear(4 * width, width),
            )
            for _ in range(blocks)
        )
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def synthetic_data(samples: int, features: int, classes: int, seed: int) -> TensorDataset:
    """Labels from a fixed random teacher: learnable, so a damaging precision shows."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=g)
    teacher = torch.randn(features, classes, generator=g)
    return TensorDataset(x, (x @ teacher).argmax(dim=1))


def make(ctx: ampscope.ModelContext) -> ampscope.Workload:
    on_gpu = ctx.device.type == "cuda"
    width, blocks = (2048, 8) if on_gpu else (128, 2)
    batch_size = ctx.batch_size or (512 if on_gpu else 64)
    data = synthetic_data(64 * batch_size, 256, 10, ctx.seed)
    loader = DataLoader(
        data, batch_size=batch_size, shuffle=True, drop_last=True, pin_memory=on_gpu
    )
    model = ResidualMlp(256, width, blocks, 10).to(ctx.device)
    return ampscope.Workload(
        model=model,
        batches=loader,  # read in order; ampscope starts it again when it runs out
        loss=nn.functional.cross_entropy,
        name="residual-mlp",
    )
