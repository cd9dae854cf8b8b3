"""Synthetic, learnable workloads generated on the device.

Each workload builds a model, serves batches from a fixed pool made once on the device (no
data loader, nothing per step but an index), computes the loss, and knows its model FLOPs per
step so the engine can report achieved TFLOP/s and MFU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn


class Workload(Protocol):
    model: nn.Module
    samples_per_step: int
    tokens_per_step: int | None
    flops_per_step: float

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor: ...


@dataclass
class BatchPool:
    """A fixed pool of examples on the device, served in a per-seed shuffled order."""

    inputs: torch.Tensor
    targets: torch.Tensor
    batch_size: int
    generator: torch.Generator

    def __post_init__(self) -> None:
        self.batches = self.inputs.shape[0] // self.batch_size
        self.order = torch.randperm(self.batches, generator=self.generator).tolist()

    def get(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        i = self.order[step % self.batches]
        lo, hi = i * self.batch_size, (i + 1) * self.batch_size
        return self.inputs[lo:hi], self.targets[lo:hi]


def linear_params(model: nn.Module) -> int:
    """Parameters that take part in matmuls (embedding lookups do no FLOPs)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


def build_workload(
    kind: str, dims: dict[str, int], batch_size: int, device: torch.device, seed: int
) -> Workload:
    from ampscope.engine.workloads import cnn, gpt, mlp

    builders = {"gpt": gpt.GptWorkload, "mlp": mlp.MlpWorkload, "cnn": cnn.CnnWorkload}
    generator = torch.Generator(device="cpu").manual_seed(seed)
    torch.manual_seed(seed)
    return builders[kind](dims, batch_size, device, generator)
