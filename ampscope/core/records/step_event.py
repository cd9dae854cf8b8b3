"""A step's figures as the ``step`` event: one builder for engine runs and watched loops.

Rates are the step's amounts over its time; a figure the step did not give (None, NaN: the
device's way of saying none) is null, and so is a rate of nothing (no tokens, no FLOP count,
no peak to measure MFU against). A figure JSON cannot hold (inf, NaN) never reaches a field
that must be a number: a null there would make the whole line unreadable. Torch-free.
"""

from __future__ import annotations

import math

from ampscope.core import events as ev
from ampscope.core.machine.mfu import share


def step_event(
    step: int,
    step_ms: float,
    loss: float | None,
    skipped: bool,
    *,
    loss_scale: float | None,
    grad_norm: float | None,
    samples: float,
    tokens: float | None,
    flops: float | None,
    peak_tflops: float | None,
    memory: tuple[int | None, int | None, int | None],
    zeros: float | None,
    lr: float,
    cpu_ms: float | None = None,
    data_ms: float | None = None,
    ranks: list[ev.RankStep] | None = None,
    profiled: bool = False,
) -> ev.StepEvent:
    """``samples``, ``tokens`` and ``flops`` are the step's (the job's, on several processes),
    ``peak_tflops`` the job's peak; ``memory`` the allocated, reserved and peak bytes;
    ``zeros`` the share of zeros in the output's gradient, where the step counted them.

    Called for every step: it keeps to 14 keyword arguments, past which a call of a Python
    function costs four times as much (some 1.5 us more, measured on CPython 3.11)."""
    seconds = max(step_ms / 1000.0, 1e-9)
    tflops = flops / seconds / 1e12 if flops else 0.0
    samples_per_s = samples / seconds
    if not tflops < math.inf:  # JSON has no inf: no figure (0, as for a rate of nothing)
        tflops = 0.0
    if not samples_per_s < math.inf:
        samples_per_s = 0.0
    allocated, reserved, peak = memory
    event = ev.StepEvent(
        step=step,
        step_ms=round(step_ms, 4),
        loss=loss if loss is not None and math.isfinite(loss) else None,
        loss_scale=None if loss_scale is None or math.isnan(loss_scale) else loss_scale,
        skipped=skipped,
        grad_norm=grad_norm if grad_norm is not None and 0 <= grad_norm < math.inf else None,
        samples_per_s=samples_per_s,
        tokens_per_s=tokens / seconds if tokens and 0 < tokens < math.inf else None,
        tflops=tflops,
        mfu=share(tflops, peak_tflops) if flops else None,
        mem_allocated=allocated,
        mem_reserved=reserved,
        mem_peak=peak,
        grad_zero_frac=None if zeros is None or math.isnan(zeros) else zeros,
        lr=lr if math.isfinite(lr) else None,
    )
    # set apart: a struct built with more than 15 keywords costs four times as much
    if cpu_ms is not None:
        event.cpu_ms = round(cpu_ms, 4)
    if data_ms is not None:
        event.data_ms = round(data_ms, 4)
    if ranks is not None:
        event.ranks = ranks
    if profiled:
        event.profiled = True
    return event
