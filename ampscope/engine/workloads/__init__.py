"""The workloads: synthetic and learnable ones built in, or the user's own model.

Each built-in workload builds a model, serves batches from a fixed pool made once on the
device (no data loader, nothing per step but an index), computes the loss, and knows its
model FLOPs per step so the engine can report achieved TFLOP/s and MFU. A user's model
(``workload.model``) comes from their factory and is adapted to the same interface
(``user``). The shared parts live in ``base``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ampscope.engine.workloads.base import BatchPool, TrainingWorkload, linear_params
from ampscope.engine.workloads.cnn import CnnWorkload
from ampscope.engine.workloads.gpt import GptWorkload
from ampscope.engine.workloads.gpt2 import Gpt2Workload
from ampscope.engine.workloads.llama import LlamaWorkload
from ampscope.engine.workloads.mlp import MlpWorkload

__all__ = ["BatchPool", "TrainingWorkload", "build_workload", "linear_params"]

BUILDERS: dict[
    str, Callable[[dict[str, int], int, torch.device, torch.Generator], TrainingWorkload]
] = {
    "gpt": GptWorkload,
    "mlp": MlpWorkload,
    "cnn": CnnWorkload,
    "gpt2-124m": Gpt2Workload,
    "llama": LlamaWorkload,
}


def build_workload(
    kind: str, dims: dict[str, int], batch_size: int, device: torch.device, seed: int
) -> TrainingWorkload:
    generator = torch.Generator(device="cpu").manual_seed(seed)
    torch.manual_seed(seed)
    workload = BUILDERS[kind](dims, batch_size, device, generator)
    workload.name = kind
    return workload
