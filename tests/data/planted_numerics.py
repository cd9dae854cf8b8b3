"""Models for ``--model`` with a planted range problem, for the numerics tests.

``make_overflow``: ``trunk.boost`` lifts its input to about 1e5, beyond fp16's 65504 (bf16
holds it). ``make_underflow``: ``head.tiny`` scales its input to about 1e-9, below fp16's
smallest subnormal (6e-8), and far below e4m3's (2e-3); amax scaling would rescue e4m3.
``make_bias_overflow``: only a bias's gradient overflows fp16. ``make_own_inf``,
``make_block_inf``, ``make_batch_inf``: the first inf is computed outside any layer (by the
model's own forward, by a block's), or is in the batch itself. ``make_late_expert``: as a
mixture of experts whose second expert gets no token until a later step.
"""

import math

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


class BiasOverflow(nn.Module):
    """Two convolutions; the loss pulls the output 2 away from its target, so under amp-fp16
    (loss scale 65536) ``out.bias``'s gradient, a sum over every pixel of the batch, reaches
    about 8.7e4 in fp16: inf. Every output, output gradient and weight gradient stays finite
    (the output gradient is about 43 a value, the input to ``out`` is small)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.act = nn.SiLU()
        self.out = nn.Conv2d(8, 3, 3, padding=1)

    def forward(self, x):
        return self.out(self.act(self.conv(x)) * 0.05)


def make_bias_overflow(ctx):
    g = torch.Generator().manual_seed(ctx.seed)
    x = torch.randn(8, 3, 16, 16, generator=g) * 0.1
    target = torch.full((8, 3, 16, 16), -2.0)

    def loss(out, y):
        return nn.functional.mse_loss(out.float(), y)

    torch.manual_seed(ctx.seed)
    return ampscope.Workload(
        model=BiasOverflow(), batches=[(x, target)], loss=loss, name="bias-overflow"
    )


class ExpBlock(nn.Module):
    """A norm and a head; with ``exp``, its own forward computes exp(h * 100) between them.
    It takes a causal mask of -inf too (as ``nn.Transformer`` blocks do), and uses it so
    that it changes nothing."""

    def __init__(self, width: int, exp: bool) -> None:
        super().__init__()
        self.exp = exp
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 4)

    def forward(self, h, mask):
        h = self.norm(h) + mask.exp().sum() * 0.0  # exp(-inf) = 0: the mask changes nothing
        if self.exp:
            h = torch.exp(h * 100.0)
        return self.head(h)


class OwnInf(nn.Module):
    """A model whose own forward computes exp(h * 100), beyond fp32 for h above 0.9, outside
    any layer: ``block.norm`` is the first layer to receive the inf. With ``inner``, the block's
    own forward does it instead, between its ``norm`` and its ``head``."""

    def __init__(self, inner: bool = False, width: int = 16) -> None:
        super().__init__()
        self.inner = inner
        self.embed = nn.Linear(width, width)
        self.block = ExpBlock(width, exp=inner)

    def forward(self, x):
        h = self.embed(x)
        if not self.inner:
            h = torch.exp(h * 100.0)
        mask = torch.full((4, 4), -math.inf).triu(1)
        return self.block(h, mask)


def make_own_inf(ctx, inner: bool = False, batch_inf: bool = False):
    torch.manual_seed(ctx.seed)
    g = torch.Generator().manual_seed(ctx.seed)
    x = torch.randn(32, 16, generator=g)
    if batch_inf:
        x[3, 5] = math.inf
    y = torch.randint(0, 4, (32,), generator=g)
    model = OwnInf(inner=inner)
    return ampscope.Workload(
        model=model, batches=[(x, y)], loss=nn.functional.cross_entropy, name="own-inf"
    )


def make_block_inf(ctx):
    return make_own_inf(ctx, inner=True)


def make_batch_inf(ctx):
    return make_own_inf(ctx, batch_inf=True)


class LateExpert(nn.Module):
    """``experts.1`` runs from the third forward on (an expert the router sends no token
    before): it first runs at a later step than ``head``, which follows it in the model."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Linear(width, width)
        self.experts = nn.ModuleList([nn.Linear(width, width), nn.Linear(width, width)])
        self.head = nn.Linear(width, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        h = self.embed(x)
        h = self.experts[0](h) + (self.experts[1](h) if self.calls >= 3 else 0.0)
        return self.head(h)


def make_late_expert(ctx):
    torch.manual_seed(ctx.seed)
    return _workload(LateExpert(), ctx.seed, ctx.batch_size, "late-expert")
