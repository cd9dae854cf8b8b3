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
    rank_ms: list[list[float]] = field(default_factory=list)  # several processes: by rank
    rank_mem_peak: list[int | None] = field(default_factory=list)

    def add_rank_steps(self, figures: list[tuple[float, int | None]]) -> None:
        """Each rank's (step time, memory) for one step, by rank."""
        if not self.rank_ms:
            self.rank_ms = [[] for _ in figures]
            self.rank_mem_peak = [None for _ in figures]
        for rank, (ms, mem) in enumerate(figures):
            self.rank_ms[rank].append(ms)
            if mem is not None:
                self.rank_mem_peak[rank] = max(self.rank_mem_peak[rank] or 0, mem)

    def rank_done(self, checksums: list[str | None] | None = None) -> list[ev.RankDone] | None:
        """Each rank's median step (after warm-up, as for the job's) and memory peak."""
        if not self.rank_ms:
            return None
        out = []
        kept = self.timed_steps()
        for rank, times in enumerate(self.rank_ms):
            timed = [times[i] for i in kept if i < len(times)]
            out.append(
                ev.RankDone(
                    rank=rank,
                    step_ms_median=statistics.median(timed) if timed else None,
                    mem_peak=self.rank_mem_peak[rank],
                    skipped_steps=self.skipped,  # the same on every rank, or the run failed
                    param_checksum=checksums[rank] if checksums else None,
                )
            )
        return out

    def timed(self) -> list[float]:
        """The step times that say how fast training runs (``timed_steps``)."""
        return [self.step_ms[i] for i in self.timed_steps()]

    def timed_steps(self) -> list[int]:
        """The steps that say how fast training runs: after warm-up, never the compile step,
        and without the steps that also counted grad_zero_frac (work of ours, not the model's)
        unless no others are left. A run shorter than its warm-up drops its first step."""
        steps = range(len(self.step_ms))
        kept = steps[max(self.warmup_steps, int(self.compiled)) :] or steps[1:]
        if not kept and not self.compiled:
            kept = steps
        return [i for i in kept if i not in self.instrumented] or list(kept)

    def done(
        self,
        status: str,
        samples: int,
        tokens: int | None,
        flops: float,
        peak: float | None,
        error: str | None = None,
        world_size: int = 1,
        ranks: list[ev.RankDone] | None = None,
    ) -> ev.DoneEvent:
        """``samples``, ``tokens`` and ``flops`` are one rank's per step; the rates are the
        job's (times ``world_size``), MFU against ``world_size`` times the peak."""
        samples, flops = samples * world_size, flops * world_size
        tokens = tokens * world_size if tokens else tokens
        peak = peak * world_size if peak else peak
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
            world_size=world_size,
            ranks=ranks,
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
