"""How a run is summarised in ``done``: one rule for engine runs and watched loops alike.

Compare sets an engine run beside a watched loop, so both summarise their steps the same way:

- the timed steps: after warm-up, never the compile step, and without the steps torch.profiler
  slowed (a profile), then without the steps that also measured something for ampscope
  (gradient zeros), each unless no others are left; a run shorter than its warm-up drops its
  first step only;
- step time: the median of the timed steps, with the 10th and 90th percentiles;
- rates: a typical step's amount (the median samples, tokens or FLOPs of the timed steps) over
  the median step time, so that one slow step moves neither; beside them the timed steps' mean
  (their summed time over their count), from which the throughput they delivered follows;
- the final loss: the last step's, finite or not; a non-finite one is named (``nan``, ``inf``)
  since JSON has neither.

Torch-free: the engine and ``ampscope.watch`` both call it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ampscope.core import events as ev
from ampscope.core.machine.mfu import share

if TYPE_CHECKING:  # numpy: the dashboard reads summaries and starts without it
    from ampscope.core.records.distribution import Figures


class RunTotals(Protocol):
    """What a run's tally (``core.records.tally.StepTally``) keeps of it besides its steps'
    figures."""

    steps_done: int
    loss_first: float | None
    loss_final: float | None
    loss_final_step: int | None
    skipped: int
    mem_peak: int | None
    compile_s: float | None
    started: float  # time.monotonic() at the start


def done_event(
    status: ev.DoneStatus, totals: RunTotals, speed: Rates, error: str | None, **more: Any
) -> ev.DoneEvent:
    """The ``done`` event of a run, the engine's or a watched loop's, by the one rule:
    ``speed`` from ``rates``, the final loss as a figure when finite and by name when not;
    ``more``: the fields one kind of run alone has (ranks, the compile step's peak)."""
    return ev.DoneEvent(
        status=status,
        steps_done=totals.steps_done,
        step_ms_median=speed.step_ms_median,
        step_ms_p10=speed.step_ms_p10,
        step_ms_p90=speed.step_ms_p90,
        samples_per_s=speed.samples_per_s,
        tokens_per_s=speed.tokens_per_s,
        tflops=speed.tflops,
        mfu=speed.mfu,
        mem_peak=totals.mem_peak,
        loss_first=totals.loss_first,
        loss_final=totals.loss_final if finite(totals.loss_final) else None,
        loss_final_step=totals.loss_final_step,
        loss_nonfinite=nonfinite_name(totals.loss_final),
        skipped_steps=totals.skipped,
        compile_s=totals.compile_s,
        wall_s=round(time.monotonic() - totals.started, 3),
        error=error,
        step_ms_mean=speed.step_ms_mean,
        **more,
    )


def timed_steps(
    count: int,
    warmup_steps: int,
    compiled: bool = False,
    instrumented: Collection[int] = (),
    profiled: Collection[int] = (),
) -> list[int]:
    """The steps (0-based) that say how fast training runs, of ``count`` steps."""
    steps = range(count)
    kept = steps[max(warmup_steps, int(compiled)) :] or steps[1:]
    if not kept and not compiled:
        kept = steps
    unprofiled = [i for i in kept if i not in profiled] or list(kept)
    return [i for i in unprofiled if i not in instrumented] or unprofiled


@dataclass(frozen=True)
class Rates:
    step_ms_median: float | None
    step_ms_p10: float | None
    step_ms_p90: float | None
    samples_per_s: float | None
    tokens_per_s: float | None
    tflops: float | None
    mfu: float | None
    step_ms_mean: float | None = None


def rates(
    times: Figures,
    samples: float | None,
    tokens: float | None,
    flops: float | None,
    peak_tflops: float | None,
) -> Rates:
    """The summary's speed figures: ``times`` are the timed steps' (``Figures`` of a
    ``core.records.tally.StepTally``); ``samples``, ``tokens`` and ``flops`` a typical
    step's; ``peak_tflops`` the device's peak, for MFU."""
    median = times.median()
    per_s = 1000.0 / median if median else None
    tflops = flops * per_s / 1e12 if per_s and flops else None
    return Rates(
        step_ms_median=median,
        step_ms_p10=times.quantile(0.1),
        step_ms_p90=times.quantile(0.9),
        samples_per_s=samples * per_s if per_s and samples else None,
        tokens_per_s=tokens * per_s if per_s and tokens else None,
        tflops=tflops,
        mfu=share(tflops, peak_tflops),
        step_ms_mean=times.mean(),
    )


DELIVERED_GAP = 0.1
"""Delivered throughput this much below (or above) the median step's is worth saying."""


def delivered_samples_per_s(done: ev.DoneEvent) -> float | None:
    """The samples a second the timed steps delivered (a typical step's samples over their
    mean step), where it differs from the median step's rate by more than DELIVERED_GAP: a
    run whose steps were now and then held up (other processes on the cores, waits) trains
    slower than its median step says. None where they agree, or in records before
    ``step_ms_mean``."""
    median, mean, rate = done.step_ms_median, done.step_ms_mean, done.samples_per_s
    if not median or not mean or not rate:
        return None
    if abs(mean / median - 1.0) <= DELIVERED_GAP:
        return None
    return rate * median / mean


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def nonfinite_name(x: float | None) -> Literal["nan", "inf", "-inf"] | None:
    """How a non-finite loss is named in ``done`` (JSON has no inf or NaN)."""
    if x is None or math.isfinite(x):
        return None
    if math.isnan(x):
        return "nan"
    return "inf" if x > 0 else "-inf"
