"""The fp32 training steps a plan watches: the user's batches in order, trained as a run trains.

Each step reads the workload's batch for that step (``UserWorkload.batches``: the first batch
at step 0, then ``batches(step)`` or the iterable's next), runs forward and backward in fp32,
and updates the weights with AdamW at the preset's default learning rate
(``ampscope.core.presets.Preset``), as ``ampscope run`` would: a later step sees the batches
and the weights a real run reaches. ``fp32_steps`` yields after each backward, before the
update, so what the caller measures then (``capture``, ``fp16``) is the weights the step ran
with. The hooks that watch a step are the caller's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import torch

from ampscope.core.presets import Preset
from ampscope.engine.workloads.user import UserWorkload

LR = next(f.default for f in msgspec.structs.fields(Preset) if f.name == "lr")


@dataclass(frozen=True)
class Fp32Step:
    """One watched step: its number (0 first), its batch and its loss."""

    number: int
    batch: tuple[Any, Any]
    loss: float


def fp32_steps(workload: UserWorkload, steps: int) -> Iterator[Fp32Step]:
    """Train ``steps`` fp32 steps of ``workload``, yielding after each backward."""
    model = workload.model
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    try:
        for number in range(steps):
            batch = workload.batches.get(number)
            inputs, targets = batch
            loss = workload.loss(workload.forward(model, inputs), targets)
            loss.backward()
            yield Fp32Step(number, batch, float(loss.detach()))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    finally:
        model.zero_grad(set_to_none=True)
