"""What a run has seen so far: enough to write ``done`` at any moment, also after a fault."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from ampscope.core import events as ev


@dataclass
class RunStats:
    warmup_steps: int
    step_ms: list[float] = field(default_factory=list)
    steps_done: int = 0
    loss_first: float | None = None
    loss_final: float | None = None
    skipped: int = 0
    nonfinite_run: int = 0  # consecutive non-finite losses, the current streak
    compile_s: float | None = None
    mem_peak: int | None = None
    started: float = field(default_factory=time.monotonic)

    def timed(self) -> list[float]:
        """Step times after warm-up; a short run without warm-up still drops its first step."""
        return self.step_ms[self.warmup_steps :] or self.step_ms[1:] or self.step_ms

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
            loss_final=self.loss_final,
            skipped_steps=self.skipped,
            compile_s=self.compile_s,
            wall_s=round(time.monotonic() - self.started, 3),
            error=error,
        )


def _quantile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]
