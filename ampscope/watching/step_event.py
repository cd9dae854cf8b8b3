"""A landed step's figures as the ``step`` event an engine run writes."""

from __future__ import annotations

import math

from ampscope.core import events as ev
from ampscope.core.machine.mfu import share
from ampscope.watching.readout import StepValues


def step_event(
    v: StepValues,
    skipped: bool,
    finite: bool,
    memory: tuple[int | None, int | None, int | None],
    flops: float | None,
    peak: float | None,
) -> ev.StepEvent:
    """``memory``: allocated, reserved and peak bytes; ``flops``: a step's, where known;
    ``peak``: the device's peak TFLOP/s, where known."""
    allocated, reserved, peak_mem = memory
    seconds = max(v.step_ms / 1000.0, 1e-9)
    tflops = flops / seconds / 1e12 if flops else 0.0
    tokens = v.tokens if v.tokens is not None and math.isfinite(v.tokens) else None
    scaled = not math.isnan(v.scale)
    return ev.StepEvent(
        step=v.step,
        step_ms=round(v.step_ms, 4),
        loss=v.loss if finite else None,
        loss_scale=v.scale if scaled else None,
        skipped=skipped,
        grad_norm=v.grad_norm if math.isfinite(v.grad_norm) else None,
        samples_per_s=v.samples / seconds,
        tokens_per_s=tokens / seconds if tokens is not None else None,
        tflops=tflops,
        mfu=share(tflops, peak) if flops else None,
        mem_allocated=allocated,
        mem_reserved=reserved,
        mem_peak=peak_mem,
        grad_zero_frac=None if math.isnan(v.zeros) else v.zeros,
        lr=v.lr,
    )
