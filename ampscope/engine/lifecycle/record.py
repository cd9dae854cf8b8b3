"""The engine's run folder: made for a preset, opened with its record writer
(``core.records.writer.RecordWriter``), and removed again when the record could not even begin.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from ampscope.core import presets, records
from ampscope.core.presets.workload_spec import record_name
from ampscope.core.processes.ownership import OWNER_FILE
from ampscope.core.records.writer import SPARE_FILE, RecordWriter

IO_HINT = (
    "Free space on that disk or make the folder writable, or record elsewhere with "
    "--runs-dir DIR (--no-record runs without a record)."
)


def open_record(run_dir: Path, preset: presets.Preset) -> RecordWriter:
    """The record of an engine run: its preset as ``config.json``, lines written at once, and
    the run stops when they cannot be. Raises OSError when the folder cannot be written."""
    return RecordWriter(run_dir, presets.to_dict(preset))


def open_run_dir(
    preset: presets.Preset, record: bool, runs_dir: Path | None, run_dir: Path | None
) -> Path | None:
    """The run's folder: none when not recording, the launcher's when it made one, else new.

    Raises OSError when it cannot be made.
    """
    if not record:
        return None
    if run_dir is not None:  # made by the launcher of a detached run
        run_dir.mkdir(parents=True, exist_ok=True)
        return run_dir
    name = record_name(preset.name, preset.workload.model)
    return records.new_run_dir(runs_dir or records.default_runs_dir(), name)


def discard_unstarted(run_dir: Path) -> None:
    """Remove a run folder whose record could not even begin (a disk already full): what the
    engine put there, then the folder if nothing else is in it. ``runs`` would list it as a
    crashed run otherwise."""
    made = (records.EVENTS_FILE, records.CONFIG_FILE, records.LIVE_FILE, OWNER_FILE, SPARE_FILE)
    for name in made:
        with contextlib.suppress(OSError):
            (run_dir / name).unlink()
    with contextlib.suppress(OSError):
        run_dir.rmdir()
