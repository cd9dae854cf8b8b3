"""The fp32 training steps a plan watches: the user's batches in order, trained as a run trains.

Each step reads the workload's batch for that step (``UserWorkload.batches``: the first batch
at step 0, then ``batches(step)`` or the iterable's next), runs forward and backward in fp32,
and updates the weights with AdamW at the preset's default learning rate
(``ampscope.core.presets.Preset``), as ``ampscope run`` would: a later step sees the batches
and the weights a real run reaches. ``fp32_steps`` yields after each backward, before the
update, so what the caller measures then (``capture``, ``fp16``) is the weights the step ran
with. The hooks that watch a step are the caller's. A step after the first that fails in the
user's code is said as that step's failure (the first's is ``UserWorkload.first_step_failure``'s).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import torch

from ampscope.core.presets import ConfigError, Preset
from ampscope.engine.workloads.user import UserWorkload
from ampscope.engine.workloads.user_code import (
    UserCodeError,
    exception_clause,
    raised_by_ampscope,
    user_traceback,
)

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
            try:
                batch = workload.batches.get(number)
                inputs, targets = batch
                loss = workload.loss(workload.forward(model, inputs), targets)
                loss.backward()
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # noqa: BLE001 - their batches or model, at a later
                # step: an asyncio.CancelledError too
                raise _failed_at(workload, number, exc) from None
            value = float(loss.detach())
            if not math.isfinite(value):
                raise _nonfinite_at(workload, number, value)
            yield Fp32Step(number, batch, value)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    finally:
        model.zero_grad(set_to_none=True)


def _nonfinite_at(workload: UserWorkload, number: int, loss: float) -> UserCodeError:
    """An fp32 loss that is inf/NaN: the model or its data gives it, not a format, so the
    fp16 or fp8 ranges read from that step would blame the format for it."""
    ran = (
        f"steps 0 to {number - 1} were finite; --steps {number} plans from them"
        if number
        else "before any update"
    )
    return UserCodeError(
        f"workload.model = '{workload.spec_text}': the loss of fp32 step {number} is {loss} "
        f"({ran}): in fp32 the model or its data gives it, not a number format, so no "
        "precision plan can be read from it. Accepted: a model and batches whose fp32 loss "
        "is finite at every step watched."
    )


def _failed_at(workload: UserWorkload, number: int, exc: BaseException) -> BaseException:
    """Step ``number``'s failure, where it is the user's code's at a step after the first."""
    ours = isinstance(exc, (ConfigError, torch.OutOfMemoryError)) or raised_by_ampscope(exc)
    if number == 0 or ours:
        return exc
    return UserCodeError(
        f"workload.model = '{workload.spec_text}': fp32 step {number} failed (steps 0 to "
        f"{number - 1} ran; a plan watches its steps on the batches in order): "
        f"{exception_clause(exc)}. Accepted: a model and batches that train every step "
        f"watched, or --steps {number} to plan from the steps that ran.",
        user_traceback(exc),
    )
