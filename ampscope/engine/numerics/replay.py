"""A skipped or non-finite step, run again with the hooks on, to name its first inf/NaN tensor.

Steps that are not sampled are not measured, so when one goes wrong (the GradScaler skips it,
or its loss is not finite) nothing has seen where the inf came from. A skipped step leaves the
weights as they were, so its batch, run again with the RNG as it was and the same loss scale,
computes the same values. For the last few steps the loop keeps a reference to the batch (no
copy) and the CPU and CUDA RNG states (host-side copies, no sync); when a step's figures land
and say it went wrong, ``rerun`` runs its forward and backward again under the probe's hooks.
The rerun leaves the weights, the buffers (a BatchNorm's running statistics), every
parameter's ``.grad`` and the RNG as it found them, so training goes on unchanged.

On a GPU the figures land a step or two late; if a later step has already updated the weights,
the rerun computes on weights one update newer (the inf usually comes back all the same).
"""

from __future__ import annotations

import collections
import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

KEEP = 3  # steps whose batch and RNG state are kept: the CUDA read-back lags a step or two


@dataclass
class Kept:
    step: int
    inputs: Any  # the batch as the step got it: a reference, not a copy
    targets: Any
    cpu_rng: torch.Tensor
    cuda_rng: torch.Tensor | None


class StepKeeper:
    """The last ``KEEP`` steps' batches and RNG states, taken right before their forward."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.kept: collections.deque[Kept] = collections.deque(maxlen=KEEP)

    def keep(self, step: int, inputs: Any, targets: Any) -> None:
        self.kept.append(Kept(step, inputs, targets, *rng_state(self.device)))

    def find(self, step: int) -> Kept | None:
        return next((k for k in self.kept if k.step == step), None)


def rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The CPU generator's state, and the device's on CUDA (its seed and offset live on the
    host: reading them does not wait for the GPU)."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def set_rng_state(device: torch.device, cpu: torch.Tensor, cuda: torch.Tensor | None) -> None:
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, device)


@contextlib.contextmanager
def untouched(model: torch.nn.Module, device: torch.device) -> Iterator[None]:
    """Whatever runs inside leaves the parameters' gradients, the buffers and the RNG as they
    were (the gradients by reference, the buffers by a copy: they are small)."""
    params = [p for p in model.parameters() if p.requires_grad]
    grads = [p.grad for p in params]
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    rng = rng_state(device)
    for p in params:
        p.grad = None
    try:
        yield
    finally:
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
        set_rng_state(device, *rng)


def rerun(
    model: torch.nn.Module,
    device: torch.device,
    kept: Kept,
    scale: float,
    loss_of: Callable[[int, Any, Any], torch.Tensor],
) -> None:
    """Forward and backward of ``kept``'s step again, as it ran: its batch, its RNG state, the
    loss scaled by ``scale`` (NaN: no GradScaler). Nothing it computes stays behind."""
    with untouched(model, device):
        set_rng_state(device, kept.cpu_rng, kept.cuda_rng)
        loss = loss_of(kept.step, kept.inputs, kept.targets)
        if math.isfinite(scale):  # what GradScaler.scale does: times its fp32 scale
            loss = loss * torch.full((), scale, dtype=torch.float32, device=loss.device)
        loss.backward()
