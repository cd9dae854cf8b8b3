"""A run's folder while it runs: config, the events file, ``live.json``, and the summary at the
end. One writer, with one heartbeat, for engine runs and watched loops alike.

``live.json`` is refreshed every HEARTBEAT_S so that ``ampscope runs`` can tell a live run from
one whose process died without cleaning up.

The record is the durable copy of the run, so a disk that fills up, a folder that is removed or
becomes unwritable ends the record with a word about it, never silently. Events are appended
as whole lines: after a failed write the file is cut back to the last complete line, so the
record keeps every line it could write and never a torn one. A spare file (SPARE_FILE) holds
room from the start: removed at the end, it leaves a full disk room for the ``done`` and the
summary, so such a run reads ``failed`` with its reason, not ``crashed``.

Where an engine run and a watched loop differ, the writer takes a parameter:

- ``queued``: nothing is written on the thread that hands the lines over (a watched loop's
  training thread, which a stalled disk must never hold up): they wait in memory, at most
  MAX_QUEUED_BYTES (beyond, they are dropped and that is said), until ``tick``, which the
  watching thread calls ten times a second. Otherwise lines are written at once, and the
  writer's own thread calls ``tick`` for the heartbeat;
- ``goes_on``: the run goes on when its record cannot (a watched loop), so the record ends with
  an ``io`` error and a ``failed`` done that say so; an engine run stops instead, and its own
  ``done`` says why.

Torch-free.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from ampscope.core import events as ev
from ampscope.core import records

HEARTBEAT_S = 1.0
SPARE_FILE = ".spare"
SPARE_BYTES = 64 << 10
"""Room held for the end of the record: a summary is a few kB, and so is a ``done``."""
MAX_QUEUED_BYTES = 32 << 20
"""Queued lines waiting for a stalled disk beyond this are dropped (and said so)."""
CLOSE_WAIT_S = 5.0
"""At the end of a queued record, how long its last lines may take to reach the disk."""

Trouble = Callable[[str, BaseException | None], None]
"""Told once of each trouble a record meets: what it is, and the error behind it if any."""


class RecordLost(Exception):
    """The run record cannot be written any more. ``goes_on``: the run goes on without it;
    ``gone``: it was deleted while the run was live (nothing more is written to it)."""

    def __init__(
        self, path: Path, error: OSError, goes_on: bool = False, gone: bool = False
    ) -> None:
        super().__init__(path, error)
        self.path = path
        self.error = error
        self.goes_on = goes_on
        self.gone = gone

    @property
    def message(self) -> str:
        reason = self.error.strerror or str(self.error)
        if self.goes_on:
            return (
                f"cannot write the run record {self.path}: {reason}. ampscope recorded no more "
                "of this run after that (your training went on); the record keeps every event "
                "written before it."
            )
        return (
            f"cannot write the run record {self.path}: {reason}. The run stopped; the record "
            "keeps every event written before this."
        )

    def __str__(self) -> str:
        return self.message


class EventsFile:
    """``events.jsonl``, appended with whole lines through the file descriptor itself
    (unbuffered: nothing a forked child could flush twice)."""

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

    def deleted(self) -> bool:
        """The file was deleted (its folder removed) while open: lines would go nowhere."""
        try:
            return os.fstat(self.fd).st_nlink == 0
        except OSError:
            return False  # closed: nothing more is written anyway

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
    """One run's record, opened before its first event and closed after its last.

    ``append`` never raises: the first failure (of the events file, of the heartbeat, or the
    record deleted) is kept in ``fault``, told to ``on_trouble``, and the record takes no more
    lines until ``close`` gives it its end in the room the spare file held. ``live``: fields
    ``live.json`` adds (a watched process says whether a viewer may stop it). Opening raises
    OSError when the folder cannot be written at all.
    """

    def __init__(
        self,
        run_dir: Path,
        config: dict[str, Any],
        *,
        live: dict[str, Any] | None = None,
        queued: bool = False,
        goes_on: bool = False,
        on_trouble: Trouble | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.queued, self.goes_on, self.on_trouble = queued, goes_on, on_trouble
        self.live = dict(live or {})
        self.fault: RecordLost | None = None
        self.gone = False  # deleted while the run was live
        self._chunks: list[bytes] = []
        self._queued_bytes = 0
        self._lock = threading.Lock()
        # queued lines go to disk one taker at a time: two threads that each took their
        # chunks (the monitor's, the close) wrote them in either order, a step after done
        self._writing = threading.Lock()
        self._closed = self._forgotten = False
        self.events = EventsFile(run_dir / records.EVENTS_FILE)
        try:
            reserve(run_dir / SPARE_FILE, SPARE_BYTES)
            records.write_json(run_dir / records.CONFIG_FILE, config)
            self.started = time.time()
            records.write_live(run_dir, os.getpid(), self.started, self.live)
        except OSError:
            self.events.close()
            with contextlib.suppress(OSError):
                (run_dir / SPARE_FILE).unlink()
            raise
        self._beaten = time.monotonic()
        self._stop_beating = threading.Event()
        self._beating: threading.Thread | None = None
        if not queued:
            self._beating = threading.Thread(
                target=self._beat_forever, name="ampscope-heartbeat", daemon=True
            )
            self._beating.start()

    # ------------------------------------------------------------------ while it runs

    def append(self, data: bytes) -> None:
        """Whole lines: queued, or written at once; dropped once the record has failed."""
        if self.fault is not None or self._closed:
            return
        if self.queued:
            with self._lock:
                if self._queued_bytes + len(data) > MAX_QUEUED_BYTES:
                    self._trouble(f"the disk holding {self.events.path} does not keep up")
                    return
                self._chunks.append(data)
                self._queued_bytes += len(data)
            return
        try:
            self.events.append(data)
        except RecordLost as lost:
            self._lose(lost.path, lost.error)

    def tick(self) -> None:
        """The queued lines to disk, then every HEARTBEAT_S: a look that the record is still
        there (one fstat) and ``live.json`` refreshed."""
        if self._forgotten or self.gone:
            return
        self.write_queued()
        now = time.monotonic()
        if now - self._beaten < 0.9 * HEARTBEAT_S:
            return
        self._beaten = now
        if self.events.deleted():  # nothing more to a file nobody can read, and no heartbeat
            self.gone = True
            error = FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT))
            self._lose(
                self.events.path,
                error,
                f"the run record {self.run_dir} was deleted while the run was live",
            )
            return
        try:
            records.write_live(self.run_dir, os.getpid(), self.started, self.live)
        except OSError as exc:
            self._lose(self.run_dir / records.LIVE_FILE, exc)

    def write_queued(self) -> None:
        """What ``append`` queued, to disk (the caller's thread, never the training one), in
        the order it was queued whichever threads call this at once."""
        with self._writing:
            with self._lock:
                chunks, self._chunks, self._queued_bytes = self._chunks, [], 0
            if not chunks or self.fault is not None:
                return
            try:
                self.events.append(b"".join(chunks))  # whole lines: a torn one is cut back off
            except RecordLost as lost:
                self._lose(lost.path, lost.error)

    def _beat_forever(self) -> None:
        while not self._stop_beating.wait(HEARTBEAT_S):
            self.tick()

    def _lose(self, path: Path, error: OSError, what: str | None = None) -> None:
        if self.fault is not None:
            return
        self.fault = RecordLost(path, error, self.goes_on, self.gone)
        if what is not None:
            self._trouble(what)
        else:
            self._trouble(f"cannot write the run record {path}", error)

    def _trouble(self, what: str, error: BaseException | None = None) -> None:
        if self.on_trouble is not None:
            self.on_trouble(what, error)

    def forget_after_fork(self) -> None:
        """In a forked child: the record is the parent's. The child writes nothing to it, its
        end removes nothing (no spare, no ``live.json``, no summary), and the queued lines
        are dropped, never written; no lock another thread of the parent's may have held is
        waited on."""
        self._forgotten = self._closed = True
        self.fault = RecordLost(self.events.path, OSError("a forked child writes no record"))
        self._lock = threading.Lock()
        self._writing = threading.Lock()
        self._chunks, self._queued_bytes = [], 0
        self.events.close()

    # ------------------------------------------------------------------ the end

    def close(
        self, hello: ev.HelloEvent | None, done: ev.DoneEvent | None, wait_s: float = CLOSE_WAIT_S
    ) -> ev.DoneEvent | None:
        """The last lines (waiting at most ``wait_s`` for a stalled disk), the end after a
        fault, ``summary.json`` (when the run got as far as hello), then quiet: ``live.json``
        removed. Returns the ``done`` the record ends with.

        The spare file goes first, so that a full disk has room for the end. After a fault
        the events file is given the ``done`` it could not take (a run that went on: an
        ``io`` error and its ``done`` marked failed), and the summary holds it too. A record
        deleted while live gets nothing more.
        """
        if self._forgotten:
            return done
        self._closed = True
        self._stop_beating.set()
        if self._beating is not None and self._beating is not threading.current_thread():
            self._beating.join(2.0)
        written = True
        if self.queued:
            last = threading.Thread(target=self.write_queued, name="ampscope-record", daemon=True)
            last.start()
            last.join(wait_s)
            written = not last.is_alive()
        with contextlib.suppress(OSError):
            (self.run_dir / SPARE_FILE).unlink()
        lost = self.fault
        if lost is not None and not self.gone and done is not None:
            end = b""
            if self.goes_on:
                done = msgspec.structs.replace(done, status="failed", error=lost.message)
                end = ev.encode(ev.ErrorEvent(kind="io", message=lost.message, t=done.t))
            self._write_end(end + ev.encode(done))
        if written:
            self.events.close()
        if hello is not None and not self.gone:
            with contextlib.suppress(OSError):
                write_summary(self.run_dir, hello, done)
        records.clear_live(self.run_dir)
        return done

    def _write_end(self, data: bytes) -> None:
        """Through a descriptor of its own: the record's may be the one that failed."""
        with contextlib.suppress(OSError, RecordLost):
            end = EventsFile(self.events.path)
            try:
                end.append(data)
            finally:
                end.close()


def write_summary(run_dir: Path, hello: ev.HelloEvent, done: ev.DoneEvent | None = None) -> None:
    """``summary.json``: the ``done`` that ends the events file, else the one given. Only the
    file's end is read: a long run's record is hundreds of MB."""
    tail = records.tail_events(run_dir / records.EVENTS_FILE)
    found = next((e for e in reversed(tail) if isinstance(e, ev.DoneEvent)), None)
    done = found or done
    records.write_json(  # each as its line in the events file reads (``ev.encode``'s escapes)
        run_dir / records.SUMMARY_FILE,
        {
            "hello": json.loads(ev.encode(hello)),
            "done": json.loads(ev.encode(done)) if done else None,
        },
    )
