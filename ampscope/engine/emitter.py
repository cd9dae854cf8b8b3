"""Writes events to the run record, the live stream and a callback, with coalesced flushes.

Encoding a step event costs about 2 us (msgspec). Lines are buffered and flushed when the
last flush is older than the flush interval; a background thread flushes whatever is left,
so that no line waits longer than the interval even when the loop is busy compiling.
Warnings, errors, phases and ``done`` are flushed at once.

The record is the durable copy and is written in the flush itself. The live stream (the
engine's stdout, read by a dashboard) is written by a thread of its own: a reader that stops
reading (a paused dashboard, a slow SSH link) never holds up training. When it falls behind,
step and sys lines are dropped from the live stream, and the reader is told how many.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from ampscope.core import events as ev

FLUSH_INTERVAL_S = 0.1
LIVE_QUEUE_LINES = 1000
"""Lines the live stream holds for a slow reader before it drops step and sys lines."""
LIVE_DRAIN_S = 5.0
"""At the end, how long the live stream's last lines (``done``) may wait for a reader."""
DROPPABLE = (ev.StepEvent, ev.SysEvent)
"""What the live stream may drop: the next one says as much. The rest is always sent."""


class RecordSink(Protocol):
    """Where the durable copy goes (``core.records.writer.RecordWriter``). ``append`` never raises."""

    @property
    def fault(self) -> Exception | None:
        """Why the record takes no more lines, once it does not."""
        ...

    def append(self, data: bytes) -> None: ...


class LiveStream:
    """The live copy of the stream, on a file descriptor (a pipe), written by its own thread.

    ``put`` never blocks. ``broken`` turns True when the reader went away (closed pipe).
    """

    def __init__(
        self,
        fd: int,
        max_lines: int = LIVE_QUEUE_LINES,
        recorded: bool = True,
        started: float | None = None,
    ) -> None:
        self.fd = fd
        self.max_lines = max_lines
        self.recorded = recorded
        self.started = time.monotonic() if started is None else started
        self.broken = False
        self.dropped = 0  # lines dropped in all
        self._untold = 0  # dropped since the reader was last told
        self._queue: deque[bytes] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(
            target=self._write_forever, name="ampscope-live", daemon=True
        )
        self._thread.start()

    def put(self, lines: list[tuple[bytes, bool]]) -> None:
        """Queue ``(line, droppable)`` pairs; past ``max_lines``, droppable ones are dropped."""
        with self._cond:
            if self.broken:
                return
            for line, droppable in lines:
                full = len(self._queue) >= self.max_lines
                if full and (droppable or len(self._queue) >= 4 * self.max_lines):
                    self._untold += 1
                    self.dropped += 1
                else:
                    self._queue.append(line)
            self._cond.notify()

    def close(self, timeout: float = LIVE_DRAIN_S) -> None:
        """Send what is queued, waiting at most ``timeout`` for a reader that does not read."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)

    def dropped_warning(self, count: int) -> bytes:
        where = "the record has them all" if self.recorded else "this run keeps no record"
        warning = ev.WarningEvent(
            code="live-stream-dropped",
            message=f"{count:,} step and sys events dropped from the live stream because its "
            f"reader fell behind; {where}.",
            t=round(time.monotonic() - self.started, 4),
        )
        return ev.encode(warning)

    def _write_forever(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                batch = list(self._queue)
                self._queue.clear()
                untold, self._untold = self._untold, 0
            if untold:
                batch.insert(0, self.dropped_warning(untold))
            try:
                _write_all(self.fd, b"".join(batch))
            except OSError as exc:  # the reader went away (EPIPE) or the descriptor is gone
                with self._cond:
                    self.broken = True
                    self._queue.clear()
                if exc.errno != errno.EPIPE:  # a reader leaving is no news; a full disk is
                    _say(
                        f"the event stream could not be written ({exc.strerror or exc}): the run stops"
                    )
                return


def _say(message: str) -> None:
    """One line on stderr, the user's terminal (the event stream is the one that failed)."""
    with contextlib.suppress(OSError):
        os.write(2, f"ampscope: {message}.\n".encode())


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class EventWriter:
    """Every event of a run goes through ``emit``: to the record, the live stream, ``on_event``.

    ``on_event`` (the headless console) runs under the lock, in order; if it fails with an
    OSError (its terminal hung up), it is dropped and the run goes on.

    ``done`` is a run's last line: the writer takes nothing after it (a telemetry sample, a
    second ``done`` from a thread that ended the run meanwhile). Once a thread ends the run
    (``end_here``: a stop the loop did not answer, the user's ``os._exit``), the others'
    events are left out: a step that fails because the ending killed its child process is
    no second ending.
    """

    def __init__(
        self,
        record: RecordSink | None = None,
        live: LiveStream | None = None,
        on_event: Callable[[ev.Event], None] | None = None,
        flush_interval: float = FLUSH_INTERVAL_S,
    ) -> None:
        self.record = record
        self.live = live
        self.on_event = on_event
        self.flush_interval = flush_interval
        self.started = time.monotonic()
        if live is not None:
            live.started = self.started
        self._pending: list[tuple[bytes, bool]] = []
        self.done: ev.DoneEvent | None = None  # the run's done, once out: nothing follows it
        self.in_forked_child: Callable[[], None] | None = None  # see forget_after_fork
        self._ender: int | None = None  # the thread ending the run, once one does
        self._last_flush = self.started
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(
            target=self._flush_periodically, name="ampscope-flush", daemon=True
        )
        self._thread.start()

    @property
    def broken(self) -> bool:
        """The live stream's reader went away (closed pipe): the run should stop."""
        return self.live is not None and self.live.broken

    @property
    def fault(self) -> Exception | None:
        """Why the record cannot be written any more (the run must end failed), if it cannot."""
        return self.record.fault if self.record is not None else None

    def check_record(self) -> None:
        """Raise the record's fault, if it has one: the loop calls this every step."""
        fault = self.fault
        if fault is not None:
            raise fault

    def end_here(self) -> None:
        """From now on only this thread's events are written: it ends the run."""
        with self._lock:
            self._ender = threading.get_ident()

    def forget_after_fork(self, leave: Callable[[], None]) -> None:
        """In a forked child (right after the fork, in the user's code): the run and its
        outputs are the parent's. Nothing is written, no lock or thread of the parent's is
        waited on, and ``leave`` is called as soon as the child emits: back in ampscope's
        run, it would run a second copy of it."""
        self.record, self.live, self.on_event = None, None, None
        self._pending = []
        self._lock = threading.Lock()
        self.in_forked_child = leave

    def emit(self, event: ev.Event, urgent: bool = False) -> None:
        if self.in_forked_child is not None:
            self.in_forked_child()
            return
        now = time.monotonic()
        event.t = round(now - self.started, 4)
        line = ev.encode(event)
        with self._lock:
            if self.done is not None:
                return
            if self._ender is not None and self._ender != threading.get_ident():
                return
            if isinstance(event, ev.DoneEvent):
                self.done = event
            self._pending.append((line, isinstance(event, DROPPABLE)))
            if urgent or now - self._last_flush >= self.flush_interval:
                self._flush_locked(now)
            if self.on_event is not None:  # under the lock: the telemetry thread emits too
                try:
                    self.on_event(event)
                except OSError:  # the console is gone (a hang-up): the record goes on
                    self.on_event = None

    def flush(self) -> None:
        with self._lock:
            self._flush_locked(time.monotonic())

    def close(self, drain_s: float = LIVE_DRAIN_S) -> None:
        if self.in_forked_child is not None:
            return
        self._closed.set()
        self.flush()
        if self.live is not None:
            self.live.close(drain_s)

    def _flush_locked(self, now: float) -> None:
        self._last_flush = now
        if not self._pending:
            return
        lines, self._pending = self._pending, []
        if self.record is not None:
            self.record.append(b"".join(line for line, _ in lines))
        if self.live is not None:
            self.live.put(lines)

    def _flush_periodically(self) -> None:
        while not self._closed.wait(self.flush_interval / 2):
            with self._lock:
                now = time.monotonic()
                if self._pending and now - self._last_flush >= self.flush_interval:
                    self._flush_locked(now)
