"""What every workload shares: a batch pool on the device, the loss, and the dtype rules for both.

A workload's data never changes dtype on its own: the precision policy decides whether the
weights and inputs are cast (``Workload.cast``), and the loss is always computed in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

# Cross-entropy always sees fp32 logits: a softmax over a large vocabulary in fp16 or bf16
# loses the low bits of the loss and of its gradient, whatever the compute dtype.
LOSS_DTYPE = torch.float32


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

    def cast_inputs(self, dtype: torch.dtype) -> None:
        """Real-valued inputs follow the weights' dtype; token ids and labels stay integers."""
        if self.inputs.is_floating_point():
            self.inputs = self.inputs.to(dtype)


def linear_params(model: nn.Module) -> int:
    """Parameters that take part in matmuls (embedding lookups do no FLOPs)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


class Workload:
    """A model, the batches it trains on, its loss, and its model FLOPs per optimizer step.

    Every workload is a classifier (a next-token predictor is one per position), so the loss
    is one cross-entropy over the last dimension of the output. Each kind builds its model and
    states its FLOP formula apart from its data (``build_model``, ``train_flops``), so that the
    formula can be checked against a count on the meta device at any size, data-free.
    """

    @staticmethod
    def build_model(dims: dict[str, int]) -> nn.Module:
        raise NotImplementedError

    @staticmethod
    def train_flops(model: nn.Module, dims: dict[str, int], batch_size: int) -> float:
        """Model FLOPs of one forward and backward pass over a batch: what autograd computes."""
        raise NotImplementedError

    def __init__(
        self,
        model: nn.Module,
        pool: BatchPool,
        *,
        tokens_per_step: int | None,
        flops_per_step: float,
    ) -> None:
        self.model = model
        self.pool = pool
        self.samples_per_step = pool.batch_size
        self.tokens_per_step = tokens_per_step
        self.flops_per_step = flops_per_step

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pool.get(step)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = output.reshape(-1, output.shape[-1]).to(LOSS_DTYPE)
        return F.cross_entropy(logits, target.reshape(-1))

    def cast(self, dtype: torch.dtype) -> None:
        """Keep weights (hence gradients and optimizer state) and real-valued inputs in ``dtype``."""
        self.model.to(dtype)
        self.pool.cast_inputs(dtype)
