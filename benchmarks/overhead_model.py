"""The custom model ``overhead.py --model`` measures by default: a user's module and batches.

A wide MLP whose CPU step takes tens of milliseconds, fed by a callable over a fixed pool, so
that the bare loop (which calls the callable, the model and the loss itself) and the engine's
loop (which reaches them through ``--model``) train the very same thing.
"""

from __future__ import annotations

import torch
from torch import nn

WIDTH, DEPTH, BATCH, CLASSES, POOL = 1024, 4, 256, 10, 8


def make(ctx):
    g = torch.Generator().manual_seed(ctx.seed)
    batch = ctx.batch_size or BATCH
    x = torch.randn(POOL * batch, WIDTH, generator=g).to(ctx.device)
    y = torch.randint(CLASSES, (POOL * batch,), generator=g).to(ctx.device)
    layers: list[nn.Module] = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(WIDTH, CLASSES)).to(ctx.device)

    def batches(step: int):
        i = step % POOL
        return x[i * batch : (i + 1) * batch], y[i * batch : (i + 1) * batch]

    return {"model": model, "batches": batches, "loss": nn.functional.cross_entropy}
