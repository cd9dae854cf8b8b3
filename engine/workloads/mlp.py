"""A wide MLP classifying random vectors labelled by a fixed random teacher network."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ampscope.engine.workloads import BatchPool, linear_params

POOL_BATCHES = 32


def mlp(width: int, layers: int, classes: int) -> nn.Sequential:
    mods: list[nn.Module] = []
    for _ in range(layers - 1):
        mods += [nn.Linear(width, width), nn.GELU()]
    mods.append(nn.Linear(width, classes))
    return nn.Sequential(*mods)


class MlpWorkload:
    def __init__(
        self,
        dims: dict[str, int],
        batch_size: int,
        device: torch.device,
        generator: torch.Generator,
    ) -> None:
        width, layers, classes = dims["width"], dims["layers"], dims["classes"]
        self.model = mlp(width, layers, classes).to(device)
        teacher = torch.randn(width, classes, generator=generator)
        x = torch.randn(POOL_BATCHES * batch_size, width, generator=generator)
        y = (x @ teacher).argmax(dim=1)
        self.pool = BatchPool(x.to(device), y.to(device), batch_size, generator)
        self.samples_per_step = batch_size
        self.tokens_per_step = None
        self.flops_per_step = float(6 * linear_params(self.model) * batch_size)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pool.get(step)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.float(), target)
