"""A run inside the engine process: set up, say hello, train, and always end with ``done``.

On several processes every rank runs this; rank 0's writer is the only one with outputs.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from ampscope.core import events as ev
from ampscope.core import presets
from ampscope.core.machine.mfu import above_peak_warnings, of_measured
from ampscope.core.records.tally import StepTally
from ampscope.engine.device import DeviceInfo
from ampscope.engine.emitter import EventWriter
from ampscope.engine.lifecycle.children import end_users_children
from ampscope.engine.lifecycle.exits import EXIT_FAILED, EXIT_OK, EXIT_STOPPED
from ampscope.engine.lifecycle.faults import failure, left_early
from ampscope.engine.lifecycle.hello import make_hello, measured_warning
from ampscope.engine.lifecycle.parts import Parts
from ampscope.engine.lifecycle.replicas import compare_weights, rank_devices, start_sampler
from ampscope.engine.lifecycle.stopping import SoFar
from ampscope.engine.profiling import ProfileControl
from ampscope.engine.ranks import RankEnv
from ampscope.engine.ranks.link import Link, SoloLink, connect
from ampscope.engine.step.metrics import EveryStepSkipped, NonFiniteLoss, ReplicasDiverged
from ampscope.engine.step.setup import memory_estimate
from ampscope.engine.step.validation import require_runnable
from ampscope.engine.telemetry import TelemetrySampler

SHARED_FAULTS = (presets.ConfigError, NonFiniteLoss, ReplicasDiverged, EveryStepSkipped)
"""Faults every rank reaches together (same preset, same exchanged figures): no rank to blame."""


def train_preset(
    preset: presets.Preset,
    run_dir: Path | None,
    writer: EventWriter,
    stop: threading.Event,
    in_loop: threading.Event,
    ranks: RankEnv | None = None,
    profile: tuple[int, int] | None = None,
    so_far: SoFar | None = None,
    parts: Parts | None = None,
) -> tuple[int, ev.HelloEvent | None, ev.DoneEvent]:
    """The exit code, hello when the run got that far, and done. Faults end as events.

    ``profile`` is ``(step, K)``: profile K steps from that step on (``ampscope profile``);
    without it, only when a viewer asks (rank 0, which has the run folder, profiles).
    ``parts``: what the run is made of (``lifecycle.parts``), the engine's own unless given."""
    ranks = ranks or RankEnv()
    parts = parts or Parts()
    tally = StepTally(warmup_steps=preset.warmup_steps, compiled=preset.compile != "off")
    if so_far is not None:
        so_far.step = lambda: tally.step_running
    info: DeviceInfo | None = None
    hello: ev.HelloEvent | None = None
    sampler: TelemetrySampler | None = None
    link: Link = SoloLink()
    error: str | None = None
    checksums: list[str | None] | None = None
    profiler: ProfileControl | None = None
    try:
        info = parts.resolve_device(preset.device, ranks)
        verdict = require_runnable(preset, parts.facts(info, ranks.distributed))
        link = connect(ranks, info.device)
        setup = parts.build(
            preset, info, link, verdict.sizes, parts.make_workload, parts.compile_model
        )
        link.hold(setup)
        setup_warnings = verdict.warnings + [
            w for w in [memory_estimate(setup), measured_warning(setup)] if w
        ]
        hello = make_hello(setup, run_dir, rank_devices(setup))
        writer.emit(hello, urgent=True)
        offer_summary(so_far, tally, hello)
        sampler, sample = start_sampler(writer, info, preset.telemetry_hz, link)
        for code, message in setup_warnings:
            writer.emit(ev.WarningEvent(code=code, message=message), urgent=True)
        writer.emit(ev.PhaseEvent(phase="setup", state="end"), urgent=True)
        in_loop.set()
        profiler = parts.profiler(writer, info.device, run_dir if ranks.lead else None, profile)
        status = parts.train(
            setup,
            writer,
            tally,
            hello.peak_tflops,
            stop,
            sample,
            profiler,
            step_with=parts.train_step,
            memory_of=parts.memory,
            reporter_of=parts.reporter,
        )
        checksums = compare_weights(setup, tally.steps_done - 1 if tally.steps_done else None)
        writer.flush()
        writer.check_record()  # every step on disk before the run is called a success
        exit_code = EXIT_STOPPED if status == "stopped" else EXIT_OK
    except KeyboardInterrupt:
        status, exit_code = "stopped", EXIT_STOPPED
        elsewhere = link.reported_failure()  # torchrun stops every rank when one fails
        if elsewhere is not None:
            writer.emit(elsewhere, urgent=True)
            status, exit_code, error = "failed", EXIT_FAILED, elsewhere.message
    except SystemExit as exc:  # the user's code: ampscope's own never exits inside a run
        event = link.blame(left_early(exc, tally), exc, shared=False)
        writer.emit(event, urgent=True)
        if writer.on_event is None and ranks.lead:
            print(f"ampscope: {event.message}", file=sys.stderr)
        status, exit_code, error = "failed", EXIT_FAILED, event.message
    except BaseException as exc:  # noqa: BLE001 - every fault must reach the watcher as an event,
        # a user's BaseException too (asyncio.CancelledError, GeneratorExit): else a traceback
        # and a record without its done
        status, exit_code, error = fault_ending(exc, stop, preset, info, tally, link, writer, ranks)
    wind_down(writer, profiler, sampler)
    done = done_event(tally, status, hello, error, checksums)
    for code, message in above_peak_warnings(done, hello):
        writer.emit(ev.WarningEvent(code=code, message=message), urgent=True)
    writer.emit(done, urgent=True)
    return exit_code, hello, writer.done or done


def fault_ending(
    exc: BaseException,
    stop: threading.Event,
    preset: presets.Preset,
    info: DeviceInfo | None,
    tally: StepTally,
    link: Link,
    writer: EventWriter,
    ranks: RankEnv,
) -> tuple[ev.DoneStatus, int, str | None]:
    """The status, exit code and error of a run that a fault ended, its error event written.

    A fault after a stop came is the stop's: the dashboard signals the engine's process group,
    so the step's own processes (a compile's g++, a DataLoader's workers, a subprocess of the
    user's) end with it, and the step fails because they ended. The run was stopped, unless
    another rank failed first (torchrun stops every rank when one fails)."""
    if stop.is_set() and isinstance(exc, Exception):
        elsewhere = link.reported_failure()
        if elsewhere is None:
            return "stopped", EXIT_STOPPED, None
        writer.emit(elsewhere, urgent=True)
        return "failed", EXIT_FAILED, elsewhere.message
    event, exit_code = failure(exc, preset, info, tally)
    event = link.blame(event, exc, shared=isinstance(exc, SHARED_FAULTS))
    writer.emit(event, urgent=True)
    if isinstance(exc, presets.ConfigError) and writer.on_event is None and ranks.lead:
        print(f"ampscope: {exc}", file=sys.stderr)
        if event.traceback:  # the user's own code failed: their frames, to stderr too
            print(event.traceback, file=sys.stderr)
    return "failed", exit_code, event.message


def wind_down(
    writer: EventWriter, profiler: ProfileControl | None, sampler: TelemetrySampler | None
) -> None:
    """What ends before ``done``: the profiler, telemetry, and the processes the user's code
    left (their warning is part of the run: before done, the record's last line)."""
    if profiler is not None:
        profiler.close()
    if sampler is not None:
        sampler.stop()
    end_users_children(writer)


def offer_summary(so_far: SoFar | None, tally: StepTally, hello: ev.HelloEvent) -> None:
    """Let a run ended from another thread write the summary of the steps so far."""
    if so_far is not None:
        so_far.summary = lambda status, error: (hello, done_event(tally, status, hello, error))


def done_event(
    tally: StepTally,
    status: ev.DoneStatus,
    hello: ev.HelloEvent | None,
    error: str | None,
    checksums: list[str | None] | None = None,
) -> ev.DoneEvent:
    """Rates need the workload's figures from hello; a run that never got there has none.
    The steps' batches, which may change from step to step, give the typical step's."""
    if hello is None:
        return tally.done(status, None, None, error)
    done = tally.done(  # a typical step's samples, tokens and FLOPs: each step's own
        status,
        None,
        hello.peak_tflops,
        error,
        world_size=hello.world_size,
        ranks=tally.rank_done(checksums),
    )
    done.mfu_measured = of_measured(done.tflops, hello.measured_tflops, hello.world_size)
    return done
