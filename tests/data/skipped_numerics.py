"""Models for ``--model`` whose inf appears at one step only, on a step numerics do not sample.

``make_skip`` (amp-fp16): at step 3 the loss weight rises from 0.5 to 0.9, so the gradient at
``lin``'s fp16 output is 0.9 x 1.5 x 65536, beyond fp16's 65504: the GradScaler skips the
step and halves its scale, after which the same batch stays finite. ``boost``'s own output
gradient (0.9 x 65536) stays finite: the inf first appears at ``lin``, backward. A dropout
on the input uses the RNG at every step.

``make_weight_inf`` (amp-fp16): from step 2 the input is 1.0 instead of 0.01, so ``lin``'s
weight gradient (a sum over 64 rows of 32768 x 1.0) overflows fp16, while every module's
output and output gradient stays finite.

``make_grad_inf`` (amp-fp16-noscale, no GradScaler): step 3's input is 1000 instead of 0.01,
so ``wlin``'s weight gradient (a sum over 64 rows of 2 x 1000) overflows fp16 while the loss
stays finite; the update then puts NaN into the weight, and step 4's loss is NaN.

``make_nan_loss`` (fp32, no GradScaler): step 2's batch is 1e30, which ``square`` squares
beyond fp32: the loss is inf and the run ends on it.
"""

import torch
from torch import nn

import ampscope


class Scale(nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return x * self.factor


class Square(nn.Module):
    def forward(self, x):
        return x * x


class Skips(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.5)
        self.lin = nn.Linear(16, 16)
        self.boost = Scale(1.5)

    def forward(self, x):
        return self.boost(self.lin(self.drop(x)))


def weighted(out, weight):
    return (out.float() * weight).sum()


def make_skip(ctx):
    torch.manual_seed(0)
    x = torch.full((1, 16), 0.01)
    weights = [0.5, 0.5, 0.5] + [0.9] * 5
    batches = [(x, torch.full((1, 1), w)) for w in weights]
    return ampscope.Workload(model=Skips(), batches=batches, loss=weighted, name="skip")


def make_weight_inf(ctx):
    torch.manual_seed(0)
    small, large = torch.full((64, 16), 0.01), torch.ones(64, 16)
    batches = [(small, torch.full((1, 1), 0.5))] * 2 + [(large, torch.full((1, 1), 0.5))] * 4
    model = nn.Sequential()
    model.add_module("lin", nn.Linear(16, 16, bias=False))  # a bias's gradient: 64 x 32768
    return ampscope.Workload(model=model, batches=batches, loss=weighted, name="weight-inf")


def make_grad_inf(ctx):
    torch.manual_seed(0)
    small, large = torch.full((64, 16), 0.01), torch.full((64, 16), 1000.0)
    batches = [(small, torch.full((1, 1), 2.0))] * 3 + [(large, torch.full((1, 1), 2.0))]
    batches += [(small, torch.full((1, 1), 2.0))] * 4
    model = nn.Sequential()
    model.add_module("wlin", nn.Linear(16, 16, bias=False))
    return ampscope.Workload(model=model, batches=batches, loss=weighted, name="grad-inf")


def make_nan_loss(ctx):
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("lin", nn.Linear(16, 16))
    model.add_module("square", Square())
    x = torch.randn(8, 16)
    batches = [(x, torch.zeros(8))] * 2 + [(torch.full((8, 16), 1e30), torch.zeros(8))] * 3
    return ampscope.Workload(
        model=model, batches=batches, loss=lambda out, y: out.mean(), name="nan-loss"
    )


def make_every_skip(ctx):
    """amp-fp16: the loss weighs the output by 1e4, so the gradient at boost's fp16 output is
    1e4 x the loss scale, beyond fp16's 65504 down to a scale of 4: the GradScaler skips
    every step of a run up to 14 steps long, while the loss stays finite."""
    torch.manual_seed(0)
    x = torch.full((1, 16), 0.01)
    batches = [(x, torch.full((1, 1), 1e4))] * 4
    model = nn.Sequential()
    model.add_module("lin", nn.Linear(16, 16))
    model.add_module("boost", Scale(1.5))
    return ampscope.Workload(model=model, batches=batches, loss=weighted, name="every-skip")
