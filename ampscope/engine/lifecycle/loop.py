"""The training loop: one optimizer step per iteration, every step timed and reported.

``train_step`` is the whole of a step, in the order torch's AMP recipe prescribes. ``train``
times it with the step timer (CUDA events on a GPU) from the end of the step before to its own
end, so that the host's work between steps (reading back, emitting) is in the figure. It
reports each step once its metrics have landed on the host, normally a step later, so the
loop never waits for the GPU. Before each step the ranks exchange what has landed and whether
to stop (``link``; nothing to exchange on one process), so that every rank stops at the same
step.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch.nn.utils import clip_grad_norm_

from ampscope.core import events as ev
from ampscope.core.presets import Debug
from ampscope.core.records.tally import StepTally
from ampscope.engine.emitter import EventWriter
from ampscope.engine.numerics import LoopNumerics, LossOf, loop_numerics
from ampscope.engine.profiling import ProfileControl, no_phase
from ampscope.engine.step.compile_stats import CompileWatch
from ampscope.engine.step.metrics import (
    METRICS_WIDTH,
    MemoryReader,
    StepReporter,
    ZeroGradCounter,
    scaler_scale,
)
from ampscope.engine.step.parallelize import plain
from ampscope.engine.step.setup import Setup
from ampscope.engine.step.timer import CpuStepTimer, make_step_timer


def train_step(
    s: Setup,
    step: int,
    measure_zeros: bool,
    phase: Callable[[str], AbstractContextManager[object]] = no_phase,
    numerics: LoopNumerics | None = None,
) -> tuple[torch.Tensor, float]:
    """One optimizer step. Returns its figures as one device tensor in ``StepMetrics`` order,
    not yet read back (no sync), and the milliseconds the host waited for the batch. ``phase`` marks the step's parts for a
    profile; it does nothing otherwise. ``numerics`` keeps the batch, so that a step that
    goes wrong can be run again."""
    t0 = time.perf_counter()
    with phase("data"):
        x, y = s.workload.batch(step)
    data_ms = (time.perf_counter() - t0) * 1000.0 + s.workload.read_ahead_ms(step)
    if numerics is not None:
        numerics.keep(step, x, y)
    with phase("forward"), s.policy.autocast(s.info.device.type):  # the forward pass and loss
        output = s.workload.forward(s.model, x)
        loss = s.workload.loss(output, y)
    graded = s.workload.graded_output(output) if measure_zeros else None
    zeros = ZeroGradCounter(graded, s.nan) if graded is not None else None
    if s.preset.debug.configured:  # [debug] faults, for demonstrations and tests
        loss = inject_faults(s.preset.debug, step, loss, s.link.rank)
    divisor = s.preset.loss_divisor  # 1 but in the underflow demonstration
    with phase("backward"):
        s.scaler.scale(loss if divisor == 1 else loss / divisor).backward()
    scaling = "scaler" if s.policy.use_scaler else "optimizer"  # a disabled one: no scaling
    with phase(scaling):
        s.scaler.unscale_(s.optimizer)  # clip true gradients, not scaled ones
    with phase("optimizer"):
        grad_norm = plain(clip_grad_norm_(s.model.parameters(), s.preset.grad_clip or math.inf))
        scale_before = scaler_scale(s.scaler, s.nan)
        if numerics is None or not numerics.holds_update(step, loss, grad_norm):
            s.scaler.step(s.optimizer)  # skipped inside when the gradients hold inf/NaN
    with phase(scaling):
        s.scaler.update()  # halves the scale after a skip, grows it after growth_interval steps
    with phase("optimizer"):
        s.optimizer.zero_grad(set_to_none=True)
    scale_after = scaler_scale(s.scaler, s.nan)
    zero_frac = zeros.fraction if zeros else s.nan
    metrics = torch.stack(
        [loss.detach().float(), grad_norm.float(), scale_before, scale_after, zero_frac]
    )
    return metrics, data_ms


def step_loss(s: Setup) -> LossOf:
    """A step's loss from its batch, as ``train_step`` computes it (for a rerun)."""

    def loss_of(step: int, x: Any, y: Any) -> torch.Tensor:
        with s.policy.autocast(s.info.device.type):
            loss = s.workload.loss(s.workload.forward(s.model, x), y)
        if s.preset.debug.configured:
            loss = inject_faults(s.preset.debug, step, loss, s.link.rank)
        return loss

    return loss_of


def inject_faults(debug: Debug, step: int, loss: torch.Tensor, rank: int = 0) -> torch.Tensor:
    """The preset's ``[debug]`` faults, for demonstrations and tests: on every rank, or on
    ``debug.rank`` alone."""
    if debug.rank is not None and debug.rank != rank:
        return loss
    if step == debug.inf_loss_at_step > 0:
        loss = loss * math.inf
    if step == debug.raise_at_step > 0:
        raise RuntimeError(f"failure injected at step {step} (debug.raise_at_step)")
    return loss


def train(
    s: Setup,
    writer: EventWriter,
    stats: StepTally,
    peak: float | None,
    stop: threading.Event,
    sample: Callable[[], ev.RankSys | None] = lambda: None,
    profiler: ProfileControl | None = None,
    *,
    step_with: Callable[..., tuple[torch.Tensor, float]] = train_step,
    memory_of: Callable[..., MemoryReader] = MemoryReader,
    reporter_of: Callable[..., StepReporter] = StepReporter,
) -> ev.DoneStatus:
    """Run the steps. Returns 'ok' or 'stopped'; faults propagate as exceptions.

    A record that cannot be written any more stops the run on every rank alike (the caller
    then raises its fault). ``sample`` gives this rank's latest telemetry for the exchange
    (none on one process). ``profiler`` takes profiles when asked (none: never). A step is
    ``train_step``, its memory read by ``memory_of`` and reported by ``reporter_of``, unless
    given others."""
    preset, link = s.preset, s.link
    reporter = reporter_of(s, writer, stats, peak, profiler.profiled if profiler else ())
    memory = memory_of(s.info.device)
    memory.reset_peak()  # setup's peak (weights cast, FLOPs counted) is not training's
    timer = make_step_timer(s.info.device, width=METRICS_WIDTH)
    compiled = preset.compile != "off"
    compile_watch = CompileWatch(writer) if compiled else None
    # None when off: nothing added to a step. A step that went wrong is run again, hooks on.
    # Its time is no step's: the next step is timed from the rerun's end (timer.begin).
    # A rerun inside a step (a CPU's, before its update) is left out of the step's time.
    numerics = loop_numerics(
        s,
        writer,
        step_loss(s),
        reporter,
        timer.begin,
        timer.leave_out if isinstance(timer, CpuStepTimer) else None,
    )
    first_phase: ev.Phase = "compile" if compiled else "train"
    writer.emit(ev.PhaseEvent(phase=first_phase, state="start", step=0), urgent=True)
    status: ev.DoneStatus = "ok"
    timer.begin()  # step 0 is timed from here, every later step from the end of the one before
    link.watch_progress(lambda w: writer.emit(w, urgent=True), compiled)  # several ranks
    for step in range(preset.steps):
        landed = [memory.figures(link.rank, item) for item in timer.poll()]
        halt = stop.is_set() or writer.broken or writer.fault is not None
        ready, stop_all = link.exchange(landed, halt, sample())
        for ranks in ready:  # the steps whose metrics have landed, on every rank
            reporter.report(ranks)
        if stop_all:
            status = "stopped"
            break
        measure_zeros = (
            preset.grad_zero_every > 0
            and step % preset.grad_zero_every == 0
            and not reporter.zeros_unreached  # no gradient reached the output: stop asking
        )
        if profiler is not None and profiler.before_step(step):
            timer.begin()  # starting the profiler is not the step's work
        t0 = time.perf_counter()
        stats.step_running = step
        try:
            if numerics:
                numerics.before(step)
            phase = link.marking(step, profiler.phase if profiler is not None else no_phase)
            metrics, data_ms = step_with(s, step, measure_zeros, phase, numerics)
            if numerics:
                numerics.after(step)
        except Exception as exc:
            # A user's model refusing its first batch is a user error, not a crash.
            told = s.workload.first_step_failure(exc) if step == 0 else exc
            if told is exc:
                raise
            raise told from None
        timer.end(step, metrics)  # CUDA events on a GPU, the host clock on a CPU
        if profiler is not None:
            profiler.after_step(step)  # a profile's analysis is not the next step's work
        timer.begin()  # the host work up to the next step (polling, reporting) counts in it
        reporter.data_ms[step] = data_ms
        if s.workload.warnings:  # found while serving batches (an iterable that restarted)
            reporter.warn_from(s.workload.warnings)
        if compiled and step == 0:  # the first call compiled the model
            stats.compile_s = round(time.perf_counter() - t0, 3)
            stats.mem_peak_compile = memory.reset_peak()  # compile and autotuning, apart
            end_compile_phase(writer, stats.compile_s)
        if compile_watch is not None:
            compile_watch.after_step(step, stats.compile_s)
    link.stop_watching()
    if profiler is not None:
        profiler.end_run()  # a run that stopped mid-profile: the steps profiled so far
    landed = [memory.figures(link.rank, item) for item in timer.drain()]
    for ranks in link.exchange(landed, False, sample())[0]:
        reporter.report(ranks)
    if numerics:
        numerics.finish()
    last_step = stats.steps_done - 1 if stats.steps_done else None
    writer.emit(ev.PhaseEvent(phase="train", state="end", step=last_step), urgent=True)
    return reporter.finished(status)  # raises when every step was skipped


def end_compile_phase(writer: EventWriter, seconds: float) -> None:
    for event in ev.compile_ended(seconds):
        writer.emit(event, urgent=True)
