"""The run's ``hello``: what was resolved (sizes, batch, device, dtype) before the first step.

Watchers take MFU's peak, FLOPs per step and the resolved config from here, so it carries the
figures as built, not as the preset asked ("auto" sizes decided, the device named).
"""

from __future__ import annotations

import os
from pathlib import Path

from ampscope.core import events as ev
from ampscope.core import presets
from ampscope.core.machine import check
from ampscope.core.machine.hardware import peak_tflops
from ampscope.core.presets.workload_spec import model_label
from ampscope.engine.device import host_fields
from ampscope.engine.step.setup import Setup

CPU_PEAK_NOTE = "no peak TFLOP/s for CPUs; set peak_tflops in the preset to get MFU"


def choose_peak(s: Setup) -> tuple[float | None, str]:
    """The peak MFU is measured against, and a note saying where it came from."""
    if s.preset.peak_tflops is not None:
        return s.preset.peak_tflops, "peak_tflops set in the preset"
    if s.info.is_cuda:
        return peak_tflops(
            s.info.name, s.policy.compute_dtype, s.info.power_limit_w, s.info.multiprocessors
        )
    return None, CPU_PEAK_NOTE


def choose_measured(s: Setup) -> check.MeasuredPeak:
    """This machine's measured peak for the run's format, from ``ampscope doctor --bench``:
    MFU is then read against what the device can reach, on a CPU for the first time. A CPU
    has no TF32, so a tf32 run there is read against fp32."""
    fmt = s.policy.compute_dtype
    if not s.info.is_cuda and fmt == "tf32":
        fmt = "fp32"
    try:
        return check.measured_peak(s.info.name, fmt)
    except OSError:  # an unreadable config folder: no measured peak, the run goes on
        return check.MeasuredPeak(None, None)


def measured_warning(s: Setup) -> tuple[str, str] | None:
    """A kept machine check that cannot be read against (a figure that is no number, a busy
    machine's): said once, at the start of the run, with the command that measures again."""
    peak = choose_measured(s)
    return ("machine-check", peak.note) if peak.fault and peak.note else None


def make_hello(
    s: Setup, run_dir: Path | None, ranks: list[ev.RankDevice] | None = None
) -> ev.HelloEvent:
    """``ranks``: every rank's device, gathered beforehand (a collective) on several processes."""
    peak, note = choose_peak(s)
    measured = choose_measured(s)
    resolved = presets.to_dict(s.preset)
    resolved["batch_size"] = s.batch_size
    resolved["workload"].update(s.dims)
    wl, info = s.workload, s.info
    if s.preset.workload.model:  # a user's model: it is the workload, not the preset's kind
        resolved["workload"]["kind"] = model_label(s.preset.workload.model, wl.name)
    return ev.HelloEvent(
        run_id=run_dir.name if run_dir else f"{s.preset.name}-{os.getpid()}",
        run_dir=str(run_dir.resolve()) if run_dir else None,
        preset=s.preset.name,
        config=resolved,
        **host_fields(info),
        compute_dtype=s.policy.compute_dtype,
        peak_tflops=peak,
        peak_tflops_note=note,
        measured_tflops=measured.tflops,
        measured_tflops_note=measured.note,
        param_count=sum(p.numel() for p in s.model.parameters()),
        flops_per_step=s.flops.per_step,
        flops_source=s.flops.source,
        flops_analytic=s.flops.analytic,
        flops_counted=s.flops.counted,
        flops_counted_partial=s.flops.partial,
        flops_note=s.flops.note,
        samples_per_step=wl.samples_per_step,
        tokens_per_step=wl.tokens_per_step,
        fp8=s.fp8,
        rss_before_model=s.rss_before_model,
        workload=wl.name or None,
        world_size=s.link.world_size,
        backend=s.link.backend,
        strategy=s.preset.parallel.strategy if s.link.grouped else None,
        ranks=ranks,
    )
