"""What a run has seen so far: enough to write ``done`` at any moment, also after a fault."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Literal

from ampscope.core import events as ev


@dataclass
class RunStats:
    warmup_steps: int
    compiled: bool = False  # the first step compiled the model: it is never a timed step
    step_ms: list[float] = field(default_factory=list)  # by step, from step 0
    instrumented: set[int] = field(default_factory=set)  # steps that also counted grad zeros
    steps_done: int = 0
    loss_first: float | None = None
    loss_final: float | None = None  # the last step's, finite or not
    loss_final_step: int | None = None
    skipped: int = 0
    nonfinite_run: int = 0  # consecutive non-finite losses, the current streak
    compile_s: float | None = None
    mem_peak: int | None = None
    started: float = field(default_factory=time.monotonic)

    def timed(self) -> list[float]:
        """The step times that say how fast training runs: after warm-up, never the compile
        step, and without the steps that also counted grad_zero_frac (work of ours, not the
        model's) unless no others are left. A run shorter than its warm-up drops its first step."""
        steps = range(len(self.step_ms))
        kept = steps[max(self.warmup_steps, int(self.compiled)) :] or steps[1:]
        if not kept and not self.compiled:
            kept = steps
        plain = [i for i in kept if i not in self.instrumented] or kept
        return [self.step_ms[i] for i in plain]

    def done(
        self,
        status: str,
        samples: int,
        tokens: int | None,
        flops: float,
        peak: float | None,
        error: str | None = None,
    ) -> ev.DoneEvent:
        times = sorted(self.timed())
        median = statistics.median(times) if times else None
        per_s = 1000.0 / median if median else None
        return ev.DoneEvent(
            status=status,
            steps_done=self.steps_done,
            step_ms_median=median,
            step_ms_p10=_quantile(times, 0.1),
            step_ms_p90=_quantile(times, 0.9),
            samples_per_s=samples * per_s if per_s else None,
            tokens_per_s=tokens * per_s if per_s and tokens else None,
            tflops=flops * per_s / 1e12 if per_s else None,
            mfu=flops * per_s / 1e12 / peak if per_s and peak else None,
            mem_peak=self.mem_peak,
            loss_first=self.loss_first,
            loss_final=self.loss_final if finite(self.loss_final) else None,
            loss_final_step=self.loss_final_step,
            loss_nonfinite=nonfinite_name(self.loss_final),
            skipped_steps=self.skipped,
            compile_s=self.compile_s,
            wall_s=round(time.monotonic() - self.started, 3),
            error=error,
        )


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def nonfinite_name(x: float | None) -> Literal["nan", "inf", "-inf"] | None:
    """How a non-finite loss is named in ``done`` (JSON has no inf or NaN)."""
    if x is None or math.isfinite(x):
        return None
    if math.isnan(x):
        return "nan"
    return "inf" if x > 0 else "-inf"


def _quantile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]
