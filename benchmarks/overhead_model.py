"""The custom model ``overhead.py --model`` measures by default: a user's module and batches.

A wide MLP whose CPU step takes tens of milliseconds, fed by a callable over a fixed pool, so
that the bare loop (which calls the callable, the model and the loss itself) and the engine's
loop (which reaches them through ``--model``) train the very same thing.

``make_tiny`` is the same with a step of about a millisecond: the difference between the two
loops is then the engine's cost per step in absolute terms, which a busy machine blurs less
than a ratio of long steps.
"""

from __future__ import annotations

import torch
from torch import nn

WIDTH, DEPTH, BATCH, CLASSES, POOL = 1024, 4, 256, 10, 8


def make(ctx, width: int = WIDTH, batch: int = BATCH):
    g = torch.Generator().manual_seed(ctx.seed)
    batch = ctx.batch_size or batch
    x = torch.randn(POOL * batch, width, generator=g).to(ctx.device)
    y = torch.randint(CLASSES, (POOL * batch,), generator=g).to(ctx.device)
    layers: list[nn.Module] = []
    for _ in range(DEPTH):
        layers += [nn.Linear(width, width), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(width, CLASSES)).to(ctx.device)

    def batches(step: int):
        i = step % POOL
        return x[i * batch : (i + 1) * batch], y[i * batch : (i + 1) * batch]

    return {"model": model, "batches": batches, "loss": nn.functional.cross_entropy}


def make_tiny(ctx):
    return make(ctx, width=64, batch=32)
