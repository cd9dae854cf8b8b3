"""A watched run's record on disk, written so that its troubles never become the user's.

The folder layout is an engine run's (see ``ampscope.core.records``), so ``ampscope runs``,
``attach``, ``replay``, History and Compare read it unchanged. Two things differ:

- ``events.jsonl`` is written off the training thread (``RecordFile``): the training loop only
  hands bytes to a queue, so a slow, stalled or full disk never blocks or breaks it;
- every failure (an unwritable runs folder, a full disk) becomes one ``WatchWarning`` for the
  run and the record stops where it is. Training goes on. As in the engine's record, lines are
  written whole (a torn one is cut back off) and a spare file holds room for the end: on a
  full disk the record still ends with ``done``, ``failed`` with the reason.

Torch-free.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import warnings
from pathlib import Path
from types import FrameType
from typing import Any

import msgspec

from ampscope.core import events as ev
from ampscope.core import records
from ampscope.engine.lifecycle.record import (
    SPARE_BYTES,
    SPARE_FILE,
    EventsFile,
    RecordLost,
    reserve,
)

HEARTBEAT_S = 1.0
MAX_QUEUED_BYTES = 32 << 20
"""Lines waiting for a stalled disk beyond this are dropped (and said so), not held in memory."""
STILL_THERE_S = 1.0
"""How often the monitor's thread makes sure the record's file was not deleted (one fstat)."""
CLOSE_WAIT_S = 5.0
"""At the end of the run, how long the last lines may take to reach the disk."""


class WatchWarning(RuntimeWarning):
    """ampscope could not record part of a watched run; the training itself is unaffected."""


class Troubles:
    """One Python warning per kind of trouble and run, then silence."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def report(self, what: str, exc: BaseException | None = None) -> None:
        if what in self.seen:
            return
        self.seen.add(what)
        cause = f" ({type(exc).__name__}: {exc})" if exc is not None else ""
        warnings.warn(
            f"ampscope.watch: {what}{cause}. Your training goes on; ampscope records no more of it.",
            WatchWarning,
            stacklevel=_users_level(),
        )

    def note(self, message: str) -> None:
        """A note on what the loop gave ampscope (the record goes on): each one said once."""
        if message in self.seen:
            return
        self.seen.add(message)
        warnings.warn(f"ampscope.watch: {message}", WatchWarning, stacklevel=_users_level())


_PACKAGE = Path(__file__).parent.parent
_OURS = tuple(
    str(p) + os.sep for p in {_PACKAGE, _PACKAGE.resolve(), (_PACKAGE / "engine").resolve()}
)  # the package as imported, and where its engine/ link points


def _users_level() -> int:
    """The ``stacklevel`` of the first caller outside ampscope: the warning names the user's
    line (their ``watch()`` or ``mon.step()`` call), not ours."""
    level = 2
    frame: FrameType | None = sys._getframe(2)  # 1 is report(), which calls warnings.warn
    while frame is not None and frame.f_code.co_filename.startswith(_OURS):
        frame, level = frame.f_back, level + 1
    return level


class RecordFile:
    """``events.jsonl`` behind a queue: ``write`` hands bytes over and returns at once.

    Given to ``EventWriter`` as its record (a ``RecordSink``). The monitor's own thread calls ``write_queued``
    every tick to put the lines on disk; an OSError there (disk full, folder gone) is reported
    once and later lines are dropped. Nothing wakes a thread per write: on a busy machine that
    costs the writer milliseconds.
    """

    def __init__(self, path: Path, troubles: Troubles) -> None:
        self.path = path
        self.troubles = troubles
        self.failed = False
        self.lost: RecordLost | None = None  # why a write failed (a full disk), once one did
        self._file = EventsFile(path)  # unbuffered: nothing a forked child could flush
        self._chunks: list[bytes] = []
        self._queued = 0
        self._lock = threading.Lock()
        self._closed = False

    def write(self, data: bytes) -> int:
        with self._lock:
            if self.failed or self._closed:
                return len(data)
            if self._queued + len(data) > MAX_QUEUED_BYTES:
                self.troubles.report(f"the disk holding {self.path} does not keep up")
                return len(data)
            self._chunks.append(data)
            self._queued += len(data)
        return len(data)

    @property
    def fault(self) -> Exception | None:
        """Never a reason to stop: a watched loop goes on when its record cannot (it warned)."""
        return None

    def append(self, data: bytes) -> None:
        self.write(data)

    def flush(self) -> None:
        """Nothing to do here: ``write_queued`` puts the lines on disk, off the training thread."""

    def write_queued(self) -> None:
        with self._lock:
            chunks, self._chunks, self._queued = self._chunks, [], 0
        if not chunks or self.failed:
            return
        try:
            self._file.append(b"".join(chunks))  # whole lines: a torn one is cut back off
        except RecordLost as lost:
            self.failed, self.lost = True, lost
            self.troubles.report(f"cannot write the run record {self.path}", lost.error)

    def write_end(self, data: bytes) -> None:
        """After a failed write, once the spare room is free: the record's last lines."""
        with contextlib.suppress(OSError, RecordLost):
            end = EventsFile(self.path)
            try:
                end.append(data)
            finally:
                end.close()

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """The last lines, waiting at most ``wait_s`` for a stalled disk."""
        self._closed = True
        last = threading.Thread(target=self.write_queued, name="ampscope-record", daemon=True)
        last.start()
        last.join(wait_s)
        if not last.is_alive():
            self._file.close()

    def deleted(self) -> bool:
        """The file was deleted (its folder removed) while open: lines would go nowhere."""
        try:
            return os.fstat(self._file.fd).st_nlink == 0
        except OSError:
            return False  # closed: nothing more is written anyway

    def forget_after_fork(self) -> None:
        """In a forked child: the queued lines are the parent's. Dropped, never written, and
        the lock (another thread of the parent's may have held it) is not waited on."""
        self.failed = self._closed = True
        self._lock = threading.Lock()
        self._chunks, self._queued = [], 0
        self._file.close()  # the child's copy of the descriptor; unbuffered, nothing flushed


class Heartbeat:
    """``live.json``: the run is live while its heartbeat is fresh (``beat`` refreshes it)."""

    def __init__(self, run_dir: Path, extra: dict[str, Any]) -> None:
        self.run_dir = run_dir
        self.extra = extra
        self.started = time.time()
        self._last = time.monotonic()
        records.write_live(run_dir, os.getpid(), self.started, extra)

    def beat(self) -> None:
        now = time.monotonic()
        if now - self._last < HEARTBEAT_S:
            return
        self._last = now
        with contextlib.suppress(OSError):
            records.write_live(self.run_dir, os.getpid(), self.started, self.extra)

    def stop(self) -> None:
        records.clear_live(self.run_dir)


class WatchRecord:
    """The run folder of one watched run: config, events, heartbeat, and the summary at the end."""

    def __init__(self, run_dir: Path, file: RecordFile, heartbeat: Heartbeat) -> None:
        self.dir = run_dir
        self.file = file
        self.heartbeat = heartbeat
        self.gone = False  # its file was deleted while the run was live
        self._looked_at = time.monotonic()

    @classmethod
    def create(
        cls,
        root: Path,
        name: str,
        config: dict[str, Any],
        live_extra: dict[str, Any],
        troubles: Troubles,
    ) -> WatchRecord | None:
        """The record, or None (and one warning) when the runs folder cannot hold one."""
        try:
            run_dir = records.new_run_dir(root, name)
            records.write_json(run_dir / records.CONFIG_FILE, config)
            reserve(run_dir / SPARE_FILE, SPARE_BYTES)  # room for the end on a full disk
            file = RecordFile(run_dir / records.EVENTS_FILE, troubles)
            heartbeat = Heartbeat(run_dir, live_extra)
        except (OSError, RuntimeError) as exc:
            troubles.report(f"cannot create a run record under {root}", exc)
            return None
        return cls(run_dir, file, heartbeat)

    def tick(self) -> None:
        """Queued lines to disk and the heartbeat refreshed: called by the monitor's thread."""
        if self.gone:
            return
        now = time.monotonic()
        if now - self._looked_at >= STILL_THERE_S:
            self._looked_at = now
            if self.file.deleted():  # nothing more to a file nobody can read, and no heartbeat
                self.gone = self.file.failed = True
                self.file.troubles.report(
                    f"the run record {self.dir} was deleted while the run was live"
                )
                return
        self.file.write_queued()
        self.heartbeat.beat()

    def finish(self, hello: ev.HelloEvent | None, done: ev.DoneEvent) -> None:
        """Last lines to disk, then ``summary.json``, then the heartbeat goes (as the engine does).

        After a write failed (a full disk), the spare room takes the end: an ``io`` error and
        ``done`` ``failed`` that say which lines are missing and why."""
        self.file.close()
        with contextlib.suppress(OSError):
            (self.dir / SPARE_FILE).unlink()
        lost = self.file.lost
        if lost is not None and not self.gone:
            message = (
                f"cannot write the run record {lost.path}: {lost.error.strerror or lost.error}. "
                "ampscope recorded no more of this run after that (your training went on); "
                "the record keeps every event written before it."
            )
            done = msgspec.structs.replace(done, status="failed", error=message)
            error = ev.ErrorEvent(kind="io", message=message, t=done.t)
            self.file.write_end(ev.encode(error) + ev.encode(done))
        try:
            if not self.file.failed or (lost is not None and not self.gone):
                records.write_json(
                    self.dir / records.SUMMARY_FILE,
                    {"hello": ev.to_dict(hello) if hello else None, "done": ev.to_dict(done)},
                )
        except OSError:
            pass  # the events hold the same; the disk already said why, once
        finally:
            self.heartbeat.stop()
