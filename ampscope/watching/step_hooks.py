"""What a watched step measures beyond its reading, on request: the gradient norm, the zeros
at the model's output, per-layer numerics, and the FLOP count of the first step.

Each is a hook the monitor takes the figure from after the step; none raises into the user's
loop (each reports its own troubles once).
"""

from __future__ import annotations

from typing import Any

import torch

from ampscope.watching.gradients import GradNormHook, ZeroGradHook
from ampscope.watching.options import Options
from ampscope.watching.troubles import Troubles


class StepHooks:
    """The hooks ``options`` ask for on ``model`` and ``optimizer``."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        options: Options,
        troubles: Troubles,
        numerics: Any = None,
    ) -> None:
        """``numerics``: a ``watching.numerics.WatchNumerics`` when ``numerics_every`` asks."""
        self.norm = GradNormHook(optimizer, troubles) if options.grad_norm and optimizer else None
        every = options.grad_zero_every
        self.zeros = ZeroGradHook(model, every, troubles) if every > 0 else None
        self.numerics = numerics
        self.flops: WatchedFlops | None = None  # counting the first step's FLOPs (count_flops)

    @property
    def any(self) -> bool:
        return any(h is not None for h in (self.norm, self.zeros, self.numerics, self.flops))

    def count_flops(self) -> None:
        """Count FLOPs from now until ``end_flop_count``."""
        self.flops = WatchedFlops()

    def end_flop_count(self) -> Any:
        """The count since ``count_flops`` (an ``engine.step.flops.FlopCount``; None: none, or not
        counting)."""
        counting, self.flops = self.flops, None
        return counting.end() if counting is not None else None

    def take(self, step: int, grad_norm: Any) -> tuple[Any, Any]:
        """After ``step``: its gradient norm (the loop's own, when it gave one) and zeros."""
        if self.norm is not None:
            hooked = self.norm.take()
            grad_norm = hooked if grad_norm is None else grad_norm
        zeros = self.zeros.take(step + 1) if self.zeros is not None else None
        if self.numerics is not None:
            self.numerics.after(step)
        return grad_norm, zeros

    def bad_step(self) -> None:
        """A step was skipped or not finite: numerics sample the next one."""
        if self.numerics is not None:
            self.numerics.bad_step()

    def remove(self) -> None:
        self.end_flop_count()
        for hook in (self.norm, self.zeros, self.numerics):
            if hook is not None:
                hook.remove()
        self.norm = self.zeros = self.numerics = None


class WatchedFlops:
    """Counts the first step's FLOPs (``count_flops=True``), with the engine's counter."""

    def __init__(self) -> None:
        from ampscope.engine.step.flops import Counting

        self._counting: Any = Counting()
        self._counting.__enter__()

    def end(self) -> Any:
        """Stop counting; the count (an ``engine.step.flops.FlopCount``: the FLOPs and the kernels
        torch has no formula for), or None: nothing counted, or already ended."""
        counting, self._counting = self._counting, None
        if counting is None:
            return None
        counting.__exit__(None, None, None)
        counted = counting.result("own")
        return counted if counted.flops > 0 else None
