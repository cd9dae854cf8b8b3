"""What every workload shares: a batch pool on the device, the loss, and the dtype rules for both.

A workload's data never changes dtype on its own: the precision policy decides whether the
weights and inputs are cast (``TrainingWorkload.cast``), and the loss is always computed in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn
from torch.nn import functional as F

from ampscope.core import events as ev

# Cross-entropy always sees fp32 logits: a softmax over a large vocabulary in fp16 or bf16
# loses the low bits of the loss and of its gradient, whatever the compute dtype.
LOSS_DTYPE = torch.float32


class Batches(Protocol):
    """What a workload's steps are served from: the built-in pool, or a user's batches."""

    batch_size: int

    def shard(self, rank: int, world_size: int) -> None: ...

    def get(self, step: int) -> tuple[Any, Any]: ...

    def cast_inputs(self, dtype: torch.dtype) -> None: ...


@dataclass
class BatchPool:
    """A fixed pool of examples on the device, served in a per-seed shuffled order."""

    inputs: torch.Tensor
    targets: torch.Tensor
    batch_size: int
    generator: torch.Generator

    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        self.batches = self.inputs.shape[0] // self.batch_size
        self.order = torch.randperm(self.batches, generator=self.generator).tolist()

    def shard(self, rank: int, world_size: int) -> None:
        """Data parallelism: at each step, each rank takes a different batch of the pool."""
        self.rank, self.world_size = rank, world_size

    def get(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        i = self.order[(step * self.world_size + self.rank) % self.batches]
        lo, hi = i * self.batch_size, (i + 1) * self.batch_size
        return self.inputs[lo:hi], self.targets[lo:hi]

    def cast_inputs(self, dtype: torch.dtype) -> None:
        """Real-valued inputs follow the weights' dtype; token ids and labels stay integers."""
        if self.inputs.is_floating_point():
            self.inputs = self.inputs.to(dtype)


def linear_params(model: nn.Module) -> int:
    """Parameters that take part in matmuls (embedding lookups do no FLOPs)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


class TrainingWorkload:
    """A model, the batches it trains on, its loss, and its model FLOPs per optimizer step.

    Every built-in workload is a classifier (a next-token predictor is one per position), so
    the loss is one cross-entropy over the last dimension of the output. Each kind builds its
    model and states its FLOP formula apart from its data (``build_model``, ``train_flops``), so
    that the formula can be checked against a count on the meta device at any size, data-free.
    A user's workload (``workloads.user``) overrides how a batch is fed, what the loss is, and
    how a failure of its own code is told.
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
        pool: Batches,
        *,
        tokens_per_step: int | None,
        flops_per_step: float | None,
        name: str = "",
    ) -> None:
        self.model = model
        self.pool = pool
        self.name = name
        self.samples_per_step = pool.batch_size
        self.tokens_per_step = tokens_per_step
        self.flops_per_step = flops_per_step  # the formula; None: count them (a user's model)
        # What serving batches found (a new epoch of a user's batches), emitted by the loop.
        self.warnings: list[ev.WarningEvent | ev.NoteEvent] = []

    def prepare(self) -> None:
        """Before timing starts, once the precision's casts are done: nothing to do here."""

    def batch(self, step: int) -> tuple[Any, Any]:
        return self.pool.get(step)

    def step_sizes(self, step: int) -> tuple[int, int | None, float]:
        """What ``step``'s batch held: its samples, its tokens (None: tokens mean nothing
        here) and its FLOPs as a share of the first batch's. Every batch is alike here."""
        return self.samples_per_step, self.tokens_per_step, 1.0

    def first_batch(self) -> tuple[Any, Any]:
        """Step 0's batch, for counting FLOPs before timing starts; step 0 still gets it."""
        return self.batch(0)

    def read_ahead_ms(self, step: int) -> float:
        """How long this step's batch took when it was read ahead (step 0's, to count FLOPs
        and learn the batch size), so that its data wait is the real one, not ~0."""
        return 0.0

    def forward(self, model: nn.Module, inputs: Any) -> Any:
        return model(inputs)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = output.reshape(-1, output.shape[-1]).to(LOSS_DTYPE)
        return F.cross_entropy(logits, target.reshape(-1))

    def graded_output(self, output: Any) -> torch.Tensor | None:
        """The tensor whose gradient ``grad_zero_frac`` measures: the model's output."""
        return output

    def first_step_failure(self, exc: Exception) -> Exception:
        """What a fault in the first step is reported as: here, itself."""
        return exc

    def cast(self, dtype: torch.dtype) -> None:
        """Keep weights (hence gradients and optimizer state) and real-valued inputs in ``dtype``."""
        self.model.to(dtype)
        self.pool.cast_inputs(dtype)
