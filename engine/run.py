"""One run from preset to record: load the preset, open the record, run it, close the record.

The process-level steps live here and import no torch, so that a refused preset answers at
once and the first event (setup started) is out before torch's import; the run itself (setup,
hello, the loop, done) is ``session.train_preset``. Started by torchrun, every rank runs this,
but only rank 0 writes the event stream and the record (the others have no outputs).
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

from ampscope.core import config as cfg
from ampscope.core import events as ev
from ampscope.engine.emitter import EventWriter
from ampscope.engine.exits import EXIT_FAILED, EXIT_OK, EXIT_STOPPED, EXIT_USAGE, refuse
from ampscope.engine.process import install_signal_handlers, watch_parent
from ampscope.engine.ranks import RankEnv
from ampscope.engine.record import RunRecord, open_run_dir

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_STOPPED", "EXIT_USAGE", "run"]


def run(
    preset_name: str,
    overrides: Sequence[str] = (),
    *,
    json_out: bool = False,
    runs_dir: Path | None = None,
    record: bool = True,
    on_event: Callable[[ev.Event], None] | None = None,
    exit_with_parent: bool = False,
    run_dir: Path | None = None,
) -> int:
    try:
        ranks = RankEnv.from_environ()
        preset = cfg.load_preset(preset_name, overrides)
    except cfg.ConfigError as exc:
        if RankEnv.lead_by_environ():
            return refuse(str(exc), json_out, on_event)
        return EXIT_USAGE
    if not ranks.lead:  # rank 0 speaks for the run
        json_out, record, on_event, run_dir = False, False, None, None

    run_dir = open_run_dir(preset, record, runs_dir, run_dir)
    saved = RunRecord(run_dir, preset) if run_dir else None
    streams: list[BinaryIO] = [sys.stdout.buffer] if json_out else []
    if saved:
        streams.append(saved.events)
    writer = EventWriter(streams, on_event)
    stop, in_loop = threading.Event(), threading.Event()
    install_signal_handlers(stop, in_loop)
    if exit_with_parent:
        watch_parent(stop, writer)

    writer.emit(ev.PhaseEvent(phase="setup", state="start"), urgent=True)  # before torch's import
    hello: ev.HelloEvent | None = None
    try:
        warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
        from ampscope.engine.session import train_preset  # imports torch: seconds

        code, hello = train_preset(preset, run_dir, writer, stop, in_loop, ranks)
    except KeyboardInterrupt:  # stopped while torch was still importing
        writer.emit(ev.empty_done("stopped"), urgent=True)
        code = EXIT_STOPPED
    finally:
        writer.close()
        if saved:
            saved.close(hello)
    if ranks.distributed:  # no teardown of the process group: see engine.link.RankLink.close
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
