"""A watched run's running figures, enough to write ``done`` at any moment.

Per-step figures are kept in flat arrays (8 bytes a step), since a watched job may run for
millions of steps. Torch-free.
"""

from __future__ import annotations

import math
import statistics
import time
from array import array

from ampscope.core import events as ev


class RunFigures:
    def __init__(self, warmup_steps: int) -> None:
        self.warmup_steps = warmup_steps
        self.step_ms = array("d")
        self.samples = array("d")
        self.tokens = array("d")  # NaN where a step gave no token count
        self.steps_done = 0
        self.loss_first: float | None = None
        self.loss_final: float | None = None
        self.skipped = 0
        self.mem_peak: int | None = None
        self.compile_s: float | None = None
        self.started = time.monotonic()

    def add(
        self,
        step: int,
        step_ms: float,
        loss: float,
        skipped: bool,
        samples: float,
        tokens: float | None,
        memory: int | None,
    ) -> None:
        self.steps_done = step + 1
        self.step_ms.append(step_ms)
        self.samples.append(samples)
        self.tokens.append(math.nan if tokens is None else tokens)
        self.skipped += skipped
        if math.isfinite(loss):
            self.loss_final = loss
            if self.loss_first is None:
                self.loss_first = loss
        if memory is not None and (self.mem_peak is None or memory > self.mem_peak):
            self.mem_peak = memory

    def _timed(self) -> slice:
        """The steps the summary times: after warm-up, or all but the first when few."""
        n = len(self.step_ms)
        if n > self.warmup_steps:
            return slice(self.warmup_steps, n)
        return slice(1, n) if n > 1 else slice(0, n)

    def done(
        self,
        status: str,
        flops_per_step: float | None,
        peak_tflops: float | None,
        error: str | None = None,
    ) -> ev.DoneEvent:
        part = self._timed()
        times = sorted(self.step_ms[part])
        median = statistics.median(times) if times else None
        total_s = sum(times) / 1000.0
        samples = sum(self.samples[part])
        counted = [
            (t, ms)
            for t, ms in zip(self.tokens[part], self.step_ms[part], strict=True)
            if not math.isnan(t)
        ]
        token_s = sum(ms for _, ms in counted) / 1000.0
        tflops = flops_per_step / median * 1000.0 / 1e12 if median and flops_per_step else None
        return ev.DoneEvent(
            status=status,  # type: ignore[arg-type]
            steps_done=self.steps_done,
            step_ms_median=median,
            step_ms_p10=_quantile(times, 0.1),
            step_ms_p90=_quantile(times, 0.9),
            samples_per_s=samples / total_s if total_s > 0 and samples else None,
            tokens_per_s=sum(t for t, _ in counted) / token_s if token_s > 0 else None,
            tflops=tflops,
            mfu=tflops / peak_tflops if tflops is not None and peak_tflops else None,
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
