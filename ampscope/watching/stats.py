"""A watched run's running figures, enough to write ``done`` at any moment.

Per-step figures are kept in flat arrays (8 bytes a step), since a watched job may run for
millions of steps. The summary follows the engine's rule (``core.records.summary``), so Compare sets
watched and engine runs side by side on the same statistics. Torch-free.
"""

from __future__ import annotations

import math
import time
from array import array

from ampscope.core import events as ev
from ampscope.core.records import summary


class RunFigures:
    def __init__(self, warmup_steps: int) -> None:
        self.warmup_steps = warmup_steps
        self.step_ms = array("d")
        self.samples = array("d")
        self.tokens = array("d")  # NaN where a step gave no token count
        self.instrumented: set[int] = set()  # steps that also counted gradient zeros
        self.steps_done = 0
        self.loss_first: float | None = None
        self.loss_final: float | None = None  # the last loss given, finite or not
        self.loss_final_step: int | None = None
        self.skipped = 0
        self.mem_peak: int | None = None
        self.compile_s: float | None = None  # set when the first step compiled the model
        self.started = time.monotonic()

    def add(
        self,
        step: int,
        step_ms: float,
        loss: float | None,
        skipped: bool,
        samples: float,
        tokens: float | None,
        memory: int | None,
        instrumented: bool = False,
    ) -> None:
        """One step; ``loss`` None: the loop gave none."""
        self.steps_done = step + 1
        self.step_ms.append(step_ms)
        self.samples.append(samples)
        self.tokens.append(math.nan if tokens is None else tokens)
        if instrumented:
            self.instrumented.add(len(self.step_ms) - 1)
        self.skipped += skipped
        if loss is not None:
            self.loss_final, self.loss_final_step = loss, step
            if self.loss_first is None and math.isfinite(loss):
                self.loss_first = loss
        if memory is not None and (self.mem_peak is None or memory > self.mem_peak):
            self.mem_peak = memory

    def done(
        self,
        status: str,
        flops_per_step: float | None,
        peak_tflops: float | None,
        error: str | None = None,
    ) -> ev.DoneEvent:
        kept = summary.timed_steps(
            len(self.step_ms), self.warmup_steps, self.compile_s is not None, self.instrumented
        )
        speed = summary.rates(
            self.step_ms, kept, self.samples, self.tokens, flops_per_step, peak_tflops
        )
        return summary.done_event(status, self, speed, error)  # type: ignore[arg-type]
