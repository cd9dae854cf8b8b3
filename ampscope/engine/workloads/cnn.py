"""A small convolutional net on synthetic images: each class is a random template plus noise."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ampscope.engine.workloads.base import BatchPool, TrainingWorkload

POOL_BATCHES = 16
NOISE = 1.0


class Cnn(nn.Module):
    def __init__(self, width: int, layers: int, classes: int, image_size: int) -> None:
        super().__init__()
        self.convs = nn.ModuleList()
        self.layer_flops: list[int] = []  # forward FLOPs per image, convolutions then the head
        channels, size = 3, image_size
        for i in range(layers):
            out = width * 2 ** min(i, 3)
            self.convs.append(nn.Conv2d(channels, out, 3, padding=1))
            self.layer_flops.append(2 * channels * out * 9 * size * size)
            channels, size = out, max(size // 2, 1)
        self.head = nn.Linear(channels, classes)
        self.layer_flops.append(2 * channels * classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = F.max_pool2d(F.relu(conv(x)), 2) if x.shape[-1] > 1 else F.relu(conv(x))
        return self.head(x.mean(dim=(2, 3)))


class CnnWorkload(TrainingWorkload):
    def __init__(
        self,
        dims: dict[str, int],
        batch_size: int,
        device: torch.device,
        generator: torch.Generator,
    ) -> None:
        size, classes = dims["image_size"], dims["classes"]
        model = self.build_model(dims).to(device)
        templates = torch.randn(classes, 3, size, size, generator=generator)
        y = torch.randint(classes, (POOL_BATCHES * batch_size,), generator=generator)
        x = templates[y] + NOISE * torch.randn(y.shape[0], 3, size, size, generator=generator)
        super().__init__(
            model,
            BatchPool(x.to(device), y.to(device), batch_size, generator),
            tokens_per_step=None,
            flops_per_step=self.train_flops(model, dims, batch_size),
        )

    @staticmethod
    def build_model(dims: dict[str, int]) -> nn.Module:
        return Cnn(dims["width"], dims["layers"], dims["classes"], dims["image_size"])

    @staticmethod
    def train_flops(model: nn.Module, dims: dict[str, int], batch_size: int) -> float:
        """Each layer's backward costs twice its forward (input and weight gradients), except
        the first convolution's: its input is the image, which needs no gradient."""
        assert isinstance(model, Cnn)
        forward = sum(model.layer_flops)
        return float((3 * forward - model.layer_flops[0]) * batch_size)
