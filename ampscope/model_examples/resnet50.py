"""torchvision's ResNet-50 on synthetic images: the precision sweep on a real vision model.

    pip install 'torchvision==0.N.*'   # N = your torch's minor + 15: 0.29 for torch 2.14
    ampscope bench --model examples/resnet50.py:make

Random weights (no download). The images are a fixed pool made once on the device, so the
data pipeline costs nothing and the step time is the model's; to measure your own pipeline,
return your DataLoader instead and watch ``data`` beside the step time.
"""

from __future__ import annotations

import torch
from torch import nn

try:
    from torchvision.models import resnet50
except ImportError as exc:  # each torchvision release is built for one torch release
    minor = int(torch.__version__.split(".")[1])
    raise ImportError(
        f"this example needs torchvision, the release built for your torch "
        f"{torch.__version__}: pip install 'torchvision==0.{minor + 15}.*' (a newer "
        "torchvision would replace your torch)"
    ) from exc


def make(ctx):
    on_gpu = ctx.device.type == "cuda"
    size, batch = (224, ctx.batch_size or 128) if on_gpu else (64, ctx.batch_size or 4)
    g = torch.Generator().manual_seed(ctx.seed)
    classes = 1000
    pool = 8
    images = torch.randn(pool * batch, 3, size, size, generator=g).to(ctx.device)
    labels = torch.randint(classes, (pool * batch,), generator=g).to(ctx.device)
    model = resnet50(weights=None, num_classes=classes).to(ctx.device)
    if on_gpu:
        model = model.to(memory_format=torch.channels_last)
        images = images.contiguous(memory_format=torch.channels_last)

    def batch_at(step: int):
        i = step % pool
        return images[i * batch : (i + 1) * batch], labels[i * batch : (i + 1) * batch]

    return {
        "model": model,
        "batches": batch_at,
        "loss": nn.functional.cross_entropy,
        "name": "resnet50",
    }
