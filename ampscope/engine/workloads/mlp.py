"""A wide MLP classifying random vectors labelled by a fixed random teacher network."""

from __future__ import annotations

import torch
from torch import nn

from ampscope.engine.workloads.base import BatchPool, TrainingWorkload, linear_params

POOL_BATCHES = 32


def mlp(width: int, layers: int, classes: int) -> nn.Sequential:
    mods: list[nn.Module] = []
    for _ in range(layers - 1):
        mods += [nn.Linear(width, width), nn.GELU()]
    mods.append(nn.Linear(width, classes))
    return nn.Sequential(*mods)


class MlpWorkload(TrainingWorkload):
    def __init__(
        self,
        dims: dict[str, int],
        batch_size: int,
        device: torch.device,
        generator: torch.Generator,
    ) -> None:
        width, classes = dims["width"], dims["classes"]
        model = self.build_model(dims).to(device)
        teacher = torch.randn(width, classes, generator=generator)
        x = torch.randn(POOL_BATCHES * batch_size, width, generator=generator)
        y = (x @ teacher).argmax(dim=1)
        super().__init__(
            model,
            BatchPool(x.to(device), y.to(device), batch_size, generator),
            tokens_per_step=None,
            flops_per_step=self.train_flops(model, dims, batch_size),
        )

    @staticmethod
    def build_model(dims: dict[str, int]) -> nn.Module:
        return mlp(dims["width"], dims["layers"], dims["classes"])

    @staticmethod
    def train_flops(model: nn.Module, dims: dict[str, int], batch_size: int) -> float:
        """2 FLOPs per weight and sample forward, 2 for the weight gradient, 2 for the input
        gradient: 6 per weight, except in the first layer, whose input is the data. Autograd
        computes no gradient for the data, so that layer's backward is one matmul, not two."""
        first = next(m for m in model.modules() if isinstance(m, nn.Linear))
        return float((6 * linear_params(model) - 2 * first.weight.numel()) * batch_size)
