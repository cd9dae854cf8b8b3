"""A small convolutional net on synthetic images: each class is a random template plus noise."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ampscope.engine.workloads.base import BatchPool, Workload

POOL_BATCHES = 16
NOISE = 1.0


class Cnn(nn.Module):
    def __init__(self, width: int, layers: int, classes: int, image_size: int) -> None:
        super().__init__()
        self.convs = nn.ModuleList()
        self.conv_flops = 0
        channels, size = 3, image_size
        for i in range(layers):
            out = width * 2 ** min(i, 3)
            self.convs.append(nn.Conv2d(channels, out, 3, padding=1))
            self.conv_flops += 2 * channels * out * 9 * size * size
            channels, size = out, max(size // 2, 1)
        self.head = nn.Linear(channels, classes)
        self.conv_flops += 2 * channels * classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = F.max_pool2d(F.relu(conv(x)), 2) if x.shape[-1] > 1 else F.relu(conv(x))
        return self.head(x.mean(dim=(2, 3)))


class CnnWorkload(Workload):
    def __init__(
        self,
        dims: dict[str, int],
        batch_size: int,
        device: torch.device,
        generator: torch.Generator,
    ) -> None:
        size, classes = dims["image_size"], dims["classes"]
        model = Cnn(dims["width"], dims["layers"], classes, size).to(device)
        templates = torch.randn(classes, 3, size, size, generator=generator)
        y = torch.randint(classes, (POOL_BATCHES * batch_size,), generator=generator)
        x = templates[y] + NOISE * torch.randn(y.shape[0], 3, size, size, generator=generator)
        super().__init__(
            model,
            BatchPool(x.to(device), y.to(device), batch_size, generator),
            tokens_per_step=None,
            # Forward FLOPs counted per layer; backward costs twice the forward.
            flops_per_step=float(3 * model.conv_flops * batch_size),
        )
