"""The run's folder while it runs: config, the events file, ``live.json``, and the summary.

``live.json`` is refreshed every HEARTBEAT_S so that ``ampscope runs`` can tell a live run from
one whose process died without cleaning up.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from ampscope.core import config as cfg
from ampscope.core import events as ev
from ampscope.core import records

HEARTBEAT_S = 1.0


class RunRecord:
    """Opened before the first event (the heartbeat starts at once); closed after the last."""

    def __init__(self, run_dir: Path, preset: cfg.Preset) -> None:
        self.run_dir = run_dir
        self._end_heartbeat = start_heartbeat(run_dir)
        self.events: BinaryIO = (run_dir / records.EVENTS_FILE).open("ab")
        records.write_json(run_dir / records.CONFIG_FILE, cfg.to_dict(preset))

    def close(self, hello: ev.HelloEvent | None) -> None:
        """Close the events file, summarise it (when the run got as far as hello), go quiet."""
        self.events.close()
        if hello is not None:
            write_summary(self.run_dir, hello)
        self._end_heartbeat()


def open_run_dir(
    preset: cfg.Preset, record: bool, runs_dir: Path | None, run_dir: Path | None
) -> Path | None:
    """The run's folder: none when not recording, the launcher's when it made one, else new."""
    if not record:
        return None
    if run_dir is not None:  # made by the launcher of a detached run
        run_dir.mkdir(parents=True, exist_ok=True)
        return run_dir
    return records.new_run_dir(runs_dir or records.default_runs_dir(), preset.name)


def write_summary(run_dir: Path, hello: ev.HelloEvent) -> None:
    recs, _ = records.read_events(run_dir / records.EVENTS_FILE)
    done = next((e for e in reversed(recs) if isinstance(e, ev.DoneEvent)), None)
    records.write_json(
        run_dir / records.SUMMARY_FILE,
        {"hello": ev.to_dict(hello), "done": ev.to_dict(done) if done else None},
    )


def start_heartbeat(run_dir: Path) -> Callable[[], None]:
    """Write ``live.json`` now and refresh it every HEARTBEAT_S; the returned call removes it."""
    started = time.time()
    records.write_live(run_dir, os.getpid(), started)
    ended = threading.Event()

    def beat() -> None:
        while not ended.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                records.write_live(run_dir, os.getpid(), started)

    thread = threading.Thread(target=beat, name="ampscope-heartbeat", daemon=True)
    thread.start()

    def end() -> None:
        ended.set()
        thread.join(2.0)
        records.clear_live(run_dir)

    return end
