"""A run inside the engine process: set up, say hello, train, and always end with ``done``."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from ampscope.core import config as cfg
from ampscope.core import events as ev
from ampscope.engine.device import DeviceInfo, resolve_device
from ampscope.engine.emitter import EventWriter
from ampscope.engine.exits import EXIT_OK, EXIT_STOPPED
from ampscope.engine.faults import failure
from ampscope.engine.hello import make_hello
from ampscope.engine.loop import train
from ampscope.engine.precision import precision_policy
from ampscope.engine.setup import build, check_setup
from ampscope.engine.stats import RunStats
from ampscope.engine.telemetry import TelemetrySampler, start_for_run


def train_preset(
    preset: cfg.Preset,
    run_dir: Path | None,
    writer: EventWriter,
    stop: threading.Event,
    in_loop: threading.Event,
) -> tuple[int, ev.HelloEvent | None]:
    """The exit code, and hello when the run got that far. Faults end as events, not raises."""
    stats = RunStats(warmup_steps=preset.warmup_steps, compiled=preset.compile != "off")
    info: DeviceInfo | None = None
    hello: ev.HelloEvent | None = None
    sampler: TelemetrySampler | None = None
    error: str | None = None
    try:
        info = resolve_device(preset.device)
        policy = precision_policy(preset)
        setup_warnings = check_setup(preset, policy, info)
        setup = build(preset, info, policy)
        hello = make_hello(setup, run_dir)
        writer.emit(hello, urgent=True)
        sampler = start_for_run(writer, info, hz=preset.telemetry_hz)
        for code, message in setup_warnings:
            writer.emit(ev.WarningEvent(code=code, message=message), urgent=True)
        writer.emit(ev.PhaseEvent(phase="setup", state="end"), urgent=True)
        in_loop.set()
        status = train(setup, writer, stats, hello.peak_tflops, stop)
        exit_code = EXIT_STOPPED if status == "stopped" else EXIT_OK
    except KeyboardInterrupt:
        status, exit_code = "stopped", EXIT_STOPPED
    except Exception as exc:  # noqa: BLE001 - every fault must reach the watcher as an event
        event, exit_code = failure(exc, preset, info, stats)
        writer.emit(event, urgent=True)
        if isinstance(exc, cfg.ConfigError) and writer.on_event is None:
            print(f"ampscope: {exc}", file=sys.stderr)
        status, error = "failed", event.message
    if sampler is not None:
        sampler.stop()
    writer.emit(done_event(stats, status, hello, error), urgent=True)
    return exit_code, hello


def done_event(
    stats: RunStats, status: str, hello: ev.HelloEvent | None, error: str | None
) -> ev.DoneEvent:
    """Rates need the workload's figures from hello; a run that never got there has none."""
    if hello is None:
        return stats.done(status, 0, None, 0.0, None, error)
    return stats.done(
        status,
        hello.samples_per_step,
        hello.tokens_per_step,
        hello.flops_per_step,
        hello.peak_tflops,
        error,
    )
