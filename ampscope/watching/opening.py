"""The start of a watched run's record: its facts (device, precision, model), the run folder,
the event writer, and the ``hello`` every reader starts from."""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ampscope.core import events as ev
from ampscope.core import records
from ampscope.core.records.writer import RecordWriter
from ampscope.engine.emitter import EventWriter
from ampscope.watching.describe import RunFacts, hello_event, rss_without_model, watched_facts
from ampscope.watching.messages import default_name, setup_warnings
from ampscope.watching.options import Options
from ampscope.watching.troubles import Troubles

FLUSH_S = 1.0
"""The event writer's own flush thread: the monitor's tick flushes it well before that."""


class Opened(NamedTuple):
    facts: RunFacts
    record: RecordWriter
    writer: EventWriter
    hello: ev.HelloEvent


def stop_signal() -> str:
    """How a viewer stops this process: SIGINT, as Ctrl+C would; SIGTERM where SIGINT is
    ignored (a script started in the background of a shell, or under nohup, ignores it)."""
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    return "SIGTERM" if ignored else "SIGINT"


TICK_S = 0.1
"""How often landed steps become events and lines go to disk (off the training thread)."""


@dataclass(frozen=True)
class Surroundings:
    """What a watched run reaches outside itself: how its record's folder is made, what
    starts its device and host figures, and how often its landed steps are written. The
    process's own unless a caller (a test: a full disk, no NVML) hands in others."""

    new_run_dir: Callable[[Path, str], Path] = records.new_run_dir
    start_for_run: Callable[..., Any] | None = None  # None: the engine's telemetry sampler
    tick_s: float = TICK_S


def open_record(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scaler: Any,
    options: Options,
    troubles: Troubles,
    world: Surroundings | None = None,
) -> Opened | None:
    """Describe the run, make its folder and write its ``hello`` (and the setup's warnings);
    None when no folder could be made (``troubles`` said why)."""
    world = world or Surroundings()
    name = options.name or default_name()
    facts = watched_facts(model, optimizer, scaler, options, name)
    live = {"source": "watch", "allow_stop": options.allow_stop, "stop_signal": stop_signal()}
    root = Path(options.runs_dir) if options.runs_dir is not None else records.default_runs_dir()
    record = create_record(root, name, facts.config, live, troubles, world.new_run_dir)
    if record is None:
        return None
    writer = EventWriter(record, flush_interval=FLUSH_S)
    writer.emit(ev.PhaseEvent(phase="setup", state="start"), urgent=True)
    rss_before = None if facts.info.is_cuda else rss_without_model(model)
    hello = hello_event(
        facts,
        record.run_dir.name,
        str(record.run_dir.resolve()),
        options.flops_per_step,
        options.allow_stop,
        rss_before,
    )
    writer.emit(hello, urgent=True)
    for warning in setup_warnings(options.count_flops, facts):
        writer.emit(warning, urgent=True)
    return Opened(facts, record, writer, hello)


def create_record(
    root: Path,
    name: str,
    config: dict[str, Any],
    live: dict[str, Any],
    troubles: Troubles,
    new_run_dir: Callable[[Path, str], Path] = records.new_run_dir,
) -> RecordWriter | None:
    """The run's record as a watched loop needs it: nothing written on the training thread
    (the monitor's thread calls ``tick``), and the loop goes on when the record cannot. None
    (and one warning) when the runs folder cannot hold one."""
    try:
        run_dir = new_run_dir(root, name)
        return RecordWriter(
            run_dir, config, live=live, queued=True, goes_on=True, on_trouble=troubles.report
        )
    except (OSError, RuntimeError) as exc:
        troubles.report(f"cannot create a run record under {root}", exc)
        return None


def start_telemetry(
    writer: EventWriter,
    facts: RunFacts,
    hz: float,
    troubles: Troubles,
    start_for_run: Callable[..., Any] | None = None,
) -> Any:
    """The ``sys`` sampler (GPU utilisation, power, memory, CPU), or None where it cannot
    start (``troubles`` says why; the rest of the record goes on). ``start_for_run``: the
    engine's telemetry unless given."""
    if start_for_run is None:
        from ampscope.engine import telemetry

        start_for_run = telemetry.start_for_run
    try:
        return start_for_run(writer, facts.info, hz=hz)
    except Exception as exc:  # noqa: BLE001 - no sys figures, the rest goes on
        troubles.report("device and host figures are unavailable", exc)
        return None
