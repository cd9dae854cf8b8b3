"""Gradient figures taken from inside the user's step, on request, through hooks.

Both leave their result on the device (no sync) and never raise into the user's step: a hook
that fails is reported once and stays quiet.

- ``GradNormHook``: the total gradient norm, taken by an optimizer step pre-hook, that is after
  any ``scaler.unscale_`` and before the update. A step the scaler skips never calls
  ``optimizer.step()``, so it has no norm (null, like an inf norm). The hook comes after any
  clipping too, so it is for loops that do not clip: one that clips passes the norm
  ``clip_grad_norm_`` returns (the norm before clipping, as engine runs record it).
- ``ZeroGradHook``: the fraction of exactly-zero values in the gradient reaching the model's
  output, where fp16 underflow strikes first (the engine's ``grad_zero_frac``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from ampscope.watching.troubles import Troubles


class GradNormHook:
    def __init__(self, optimizer: torch.optim.Optimizer, troubles: Troubles) -> None:
        self.troubles = troubles
        self.norm: torch.Tensor | None = None
        self._handle = optimizer.register_step_pre_hook(self._take)

    def _take(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        try:
            self.norm = total_norm(p for g in optimizer.param_groups for p in g["params"])
        except Exception as exc:  # noqa: BLE001 - never into the user's optimizer step
            self.norm = None
            self.troubles.report("measuring the gradient norm failed", exc)

    def take(self) -> torch.Tensor | None:
        norm, self.norm = self.norm, None
        return norm

    def remove(self) -> None:
        self._handle.remove()


class ZeroGradHook:
    def __init__(self, model: torch.nn.Module, every: int, troubles: Troubles) -> None:
        self.every = every
        self.troubles = troubles
        self.step = 0
        self.fraction: torch.Tensor | None = None
        self._handle = model.register_forward_hook(self._on_forward)

    def _on_forward(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if not module.training or self.step % self.every:
            return
        try:
            tensor = output_tensor(output)
            if tensor is not None:
                tensor.register_hook(self._count)
        except Exception as exc:  # noqa: BLE001 - never into the user's forward
            self.troubles.report("measuring zero gradients failed", exc)

    def _count(self, grad: torch.Tensor | None) -> None:
        if grad is not None:  # None: a compiled model's loss kept the gradient inside its graph
            self.fraction = (grad == 0).float().mean()

    def take(self, next_step: int) -> torch.Tensor | None:
        fraction, self.fraction = self.fraction, None
        self.step = next_step
        return fraction

    def remove(self) -> None:
        self._handle.remove()


def total_norm(params: Iterable[torch.Tensor]) -> torch.Tensor | None:
    """The 2-norm of all gradients together, on their device (a fused kernel, no sync)."""
    grads = [p.grad for p in params if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads) if grads else None


def output_tensor(output: Any) -> torch.Tensor | None:
    """The model's output activations: ``logits`` in a mapping, else the first tensor that has
    a batch dimension and takes gradients (a 0-d loss in the output is skipped)."""
    if isinstance(output, torch.Tensor):
        return output if _usable(output) else None
    if isinstance(output, Mapping):
        logits = output.get("logits")
        if isinstance(logits, torch.Tensor) and _usable(logits):
            return logits
        items: Any = output.values()
    elif isinstance(output, (tuple, list)):
        items = output
    else:
        return None
    return next((t for t in items if isinstance(t, torch.Tensor) and _usable(t)), None)


def _usable(t: torch.Tensor) -> bool:
    return t.requires_grad and t.is_floating_point() and t.dim() >= 1
