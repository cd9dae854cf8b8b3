"""The run's folder while it runs: config, the events file, ``live.json``, and the summary.

``live.json`` is refreshed every HEARTBEAT_S so that ``ampscope runs`` can tell a live run from
one whose process died without cleaning up.

The record is the durable copy of the run, so a disk that fills up, a folder that is removed or
becomes unwritable must end the run with a word about it, not silently. Events are appended
as whole lines: after a failed write the file is cut back to the last complete line, so the
record keeps every line it could write and never a torn one. A spare file (SPARE_FILE) holds
room from the start: removed at the end, it leaves a full disk room for the ``done`` and the
summary, so such a run reads ``failed`` with its reason, not ``crashed``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ampscope.core import events as ev
from ampscope.core import presets as cfg
from ampscope.core import records
from ampscope.core.presets.workload_spec import record_name
from ampscope.core.processes.ownership import OWNER_FILE

HEARTBEAT_S = 1.0
SPARE_FILE = ".spare"
SPARE_BYTES = 64 << 10
"""Room held for the end of the record: a summary is a few kB, and so is a ``done``."""

IO_HINT = (
    "Free space on that disk or make the folder writable, or record elsewhere with "
    "--runs-dir DIR (--no-record runs without a record)."
)


class RecordLost(Exception):
    """The run record cannot be written any more: the run must end ``failed``."""

    def __init__(self, path: Path, error: OSError) -> None:
        super().__init__(path, error)
        self.path = path
        self.error = error

    @property
    def message(self) -> str:
        reason = self.error.strerror or str(self.error)
        return (
            f"cannot write the run record {self.path}: {reason}. The run stopped; the record "
            "keeps every event written before this."
        )

    def __str__(self) -> str:
        return self.message


class EventsFile:
    """``events.jsonl``, appended with whole lines through the file descriptor itself."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.size = os.fstat(self.fd).st_size

    def append(self, data: bytes) -> None:
        """Write ``data`` (whole lines); RecordLost after cutting a torn tail back off."""
        view = memoryview(data)
        written = 0
        try:
            while written < len(data):
                n = os.write(self.fd, view[written:])
                if n <= 0:
                    raise OSError(28, os.strerror(28))  # ENOSPC: nothing more would fit
                written += n
        except OSError as exc:
            kept = data.rfind(b"\n", 0, written) + 1
            if kept < written:  # a line was cut: take its start back off
                with contextlib.suppress(OSError):
                    os.ftruncate(self.fd, self.size + kept)
            self.size += kept
            raise RecordLost(self.path, exc) from None
        self.size += written

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def reserve(path: Path, size: int) -> None:
    """A file of ``size`` bytes whose blocks are really taken (OSError when they cannot be)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        try:
            os.posix_fallocate(fd, 0, size)
            return
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
        block = bytes(min(size, 1 << 16))
        for start in range(0, size, len(block)):
            if os.write(fd, block[: size - start]) <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    finally:
        os.close(fd)


class RecordWriter:
    """Opened before the first event (the heartbeat starts at once); closed after the last.

    ``append`` never raises: the first failure (of the events file or of the heartbeat)
    is kept in ``fault`` and the record takes no more lines, until ``close`` gives it the
    ``done`` in the room the spare file held. Opening raises OSError when the folder cannot
    be written at all.
    """

    def __init__(self, run_dir: Path, preset: cfg.Preset) -> None:
        self.run_dir = run_dir
        self.fault: RecordLost | None = None
        self.events = EventsFile(run_dir / records.EVENTS_FILE)
        try:
            reserve(run_dir / SPARE_FILE, SPARE_BYTES)
            records.write_json(run_dir / records.CONFIG_FILE, cfg.to_dict(preset))
            self._end_heartbeat = start_heartbeat(run_dir, self._lost)
        except OSError:
            self.events.close()
            with contextlib.suppress(OSError):
                (run_dir / SPARE_FILE).unlink()
            raise

    def append(self, data: bytes) -> None:
        if self.fault is not None:
            return
        try:
            self.events.append(data)
        except RecordLost as exc:
            self.fault = exc

    def _lost(self, path: Path, error: OSError) -> None:
        if self.fault is None:
            self.fault = RecordLost(path, error)

    def forget_after_fork(self) -> None:
        """In a forked child: the record is the parent's. The child writes nothing to it and
        its end removes nothing (no spare, no ``live.json``, no summary)."""
        self.fault = RecordLost(self.events.path, OSError("a forked child writes no record"))
        self.events.close()
        self._forgotten = True

    def close(self, hello: ev.HelloEvent | None, done: ev.DoneEvent | None = None) -> None:
        """Close the events file, summarise the run (when it got as far as hello), go quiet.

        The spare file goes first, so that a full disk has room for the end. After a failure
        the events file is given the ``done`` it could not take, and the summary (written
        whenever it can be) holds it too.
        """
        if getattr(self, "_forgotten", False):
            return
        with contextlib.suppress(OSError):
            (self.run_dir / SPARE_FILE).unlink()
        if self.fault is not None and done is not None:
            with contextlib.suppress(RecordLost):
                self.events.append(ev.encode(done))
        self.events.close()
        if hello is not None:
            with contextlib.suppress(OSError):
                write_summary(self.run_dir, hello, done)
        self._end_heartbeat()


def open_run_dir(
    preset: cfg.Preset, record: bool, runs_dir: Path | None, run_dir: Path | None
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


def write_summary(run_dir: Path, hello: ev.HelloEvent, done: ev.DoneEvent | None = None) -> None:
    """``summary.json``: the ``done`` found in the events file, else the one given."""
    recs, _ = records.read_events(run_dir / records.EVENTS_FILE)
    found = next((e for e in reversed(recs) if isinstance(e, ev.DoneEvent)), None)
    done = found or done
    records.write_json(
        run_dir / records.SUMMARY_FILE,
        {"hello": ev.to_dict(hello), "done": ev.to_dict(done) if done else None},
    )


def start_heartbeat(
    run_dir: Path, on_failure: Callable[[Path, OSError], None] | None = None
) -> Callable[[], None]:
    """Write ``live.json`` now and refresh it every HEARTBEAT_S; the returned call removes it.

    A refresh that fails (the folder was removed, the disk is full) is told to ``on_failure``.
    """
    started = time.time()
    records.write_live(run_dir, os.getpid(), started)
    ended = threading.Event()

    def beat() -> None:
        while not ended.wait(HEARTBEAT_S):
            try:
                records.write_live(run_dir, os.getpid(), started)
            except OSError as exc:
                if on_failure is not None:
                    on_failure(run_dir / records.LIVE_FILE, exc)

    thread = threading.Thread(target=beat, name="ampscope-heartbeat", daemon=True)
    thread.start()

    def end() -> None:
        ended.set()
        thread.join(2.0)
        records.clear_live(run_dir)

    return end
