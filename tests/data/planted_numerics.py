"""Models for ``--model`` with a planted range problem, for the numerics tests.

``make_overflow``: ``trunk.boost`` lifts its input to about 1e5, beyond fp16's 65504 (bf16
holds it). ``make_underflow``: ``head.tiny`` scales its input to about 1e-9, below fp16's
smallest subnormal (6e-8), and far below e4m3's (2e-3); amax scaling would rescue e4m3.
"""

import torch
from torch import nn

import ampscope


class Scale(nn.Module):
    """Multiplies by a constant: the planted layer, its own leaf module."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return x * self.factor


class Pair(nn.Module):
    """A leaf whose output is a tuple and a None, as some layers return."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Parameter(torch.eye(width))

    def forward(self, x):
        y = x @ self.proj
        return y, {"skip": y * 0.5, "none": None}


class Planted(nn.Module):
    def __init__(self, boost: float, tiny: float, width: int = 16) -> None:
        super().__init__()
        self.trunk = nn.Sequential()
        self.trunk.add_module("embed", nn.Linear(width, width))
        self.trunk.add_module("boost", Scale(boost))
        self.trunk.add_module("act", nn.Tanh())
        self.pair = Pair(width)
        self.head = nn.Sequential()
        self.head.add_module("tiny", Scale(tiny))
        self.head.add_module("out", nn.Linear(width, 4))

    def forward(self, x):
        h = self.trunk.embed(x)
        h = self.trunk.act(self.trunk.boost(h) / self.trunk.boost.factor)
        y, extra = self.pair(h)
        z = y + extra["skip"]
        return self.head.out(z + self.head.tiny(z))


def _workload(model: nn.Module, seed: int, batch_size: int | None, name: str):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(128, 16, generator=g) * 4
    y = torch.randint(0, 4, (128,), generator=g)
    bs = batch_size or 32
    batches = [(x[i : i + bs], y[i : i + bs]) for i in range(0, len(x), bs)]
    return ampscope.Workload(
        model=model, batches=batches, loss=nn.functional.cross_entropy, name=name
    )


def make_overflow(ctx):
    return _workload(Planted(1e5, 1.0), ctx.seed, ctx.batch_size, "planted-overflow")


def make_underflow(ctx):
    return _workload(Planted(1.0, 1e-9), ctx.seed, ctx.batch_size, "planted-underflow")
