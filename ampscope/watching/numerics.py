"""``watch(numerics_every=N)``: the engine's per-layer numerics probe in a user's own loop.

The hooks go on right after the ``step()`` before a sampled step and come off at that step's
``step()``, so the user's forward and backward of that one step are measured; on the others
only a pre-hook on each module that has not run yet, removed as it first runs (which modules
never ran is the whole loop's answer). Any failure is the probe's one warning; the loop goes on.

A skipped or non-finite step cannot be run again here, as the engine does: the user's loop
owns the batch, the forward and the loss. Instead, once such a step has landed, the next step
armed is sampled too, which names the first inf/NaN module when the inf comes back (it
usually does; a halved loss scale may keep the next step finite).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ampscope.core import events as ev
from ampscope.engine.numerics.hooks import NumericsProbe
from ampscope.engine.step.metrics import scaler_scale


class WatchNumerics:
    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device,
        emit: Callable[[ev.Event], None],
        every: int,
        scaler: Any,
    ) -> None:
        self.probe = NumericsProbe(model, device, emit, every)
        self.scaler = scaler if scaler is not None and scaler.is_enabled() else None
        self.nan = torch.full((), math.nan, device=device)
        self.armed = False
        self.bad_seen = False  # set by the reporting thread when a bad step lands
        self._arm(0)

    def bad_step(self) -> None:
        """A skipped or non-finite step has landed: sample the next step armed."""
        self.bad_seen = True

    def _arm(self, step: int) -> None:
        if self.probe.wants(step):
            scale = scaler_scale(self.scaler, self.nan) if self.scaler is not None else self.nan
            self.probe.begin(step, scale)
            self.armed = True

    def after(self, step: int) -> None:
        """At ``step()``: the measured step's rows on their way, the next one armed if sampled."""
        if self.armed:
            self.probe.end(step)
            self.armed = False
        self.probe.poll()
        if self.bad_seen:
            self.bad_seen = False
            self.probe.sample_next(step + 1)
        self._arm(step + 1)

    def remove(self) -> None:
        self.probe.close()
        self.probe.poll(wait=True)
