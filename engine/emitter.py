"""Writes events to the engine's outputs with coalesced flushes.

Encoding a step event costs about 2 us (msgspec). Lines are buffered and flushed when the
last flush is older than the flush interval; a background thread flushes whatever is left,
so that no line waits longer than the interval even when the loop is busy compiling.
Warnings, errors, phases and ``done`` are flushed at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import BinaryIO

from ampscope.core import events as ev

FLUSH_INTERVAL_S = 0.1


class EventWriter:
    def __init__(
        self,
        streams: list[BinaryIO],
        on_event: Callable[[ev.Event], None] | None = None,
        flush_interval: float = FLUSH_INTERVAL_S,
    ) -> None:
        self.streams = streams
        self.on_event = on_event
        self.flush_interval = flush_interval
        self.started = time.monotonic()
        self.broken = False  # a reader went away (closed pipe): the run should stop
        self._buffer = bytearray()
        self._last_flush = self.started
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(
            target=self._flush_periodically, name="ampscope-flush", daemon=True
        )
        self._thread.start()

    def emit(self, event: ev.Event, urgent: bool = False) -> None:
        now = time.monotonic()
        event.t = round(now - self.started, 4)
        line = ev.encode(event)
        with self._lock:
            self._buffer += line
            if urgent or now - self._last_flush >= self.flush_interval:
                self._flush_locked(now)
            if self.on_event is not None:  # under the lock: the telemetry thread emits too
                self.on_event(event)

    def flush(self) -> None:
        with self._lock:
            self._flush_locked(time.monotonic())

    def close(self) -> None:
        self._closed.set()
        self.flush()

    def _flush_locked(self, now: float) -> None:
        self._last_flush = now
        if not self._buffer:
            return
        data = bytes(self._buffer)
        self._buffer.clear()
        for stream in list(self.streams):
            try:
                stream.write(data)
                stream.flush()
            except (BrokenPipeError, ValueError, OSError):
                self.streams.remove(stream)
                self.broken = True

    def _flush_periodically(self) -> None:
        while not self._closed.wait(self.flush_interval / 2):
            with self._lock:
                now = time.monotonic()
                if self._buffer and now - self._last_flush >= self.flush_interval:
                    self._flush_locked(now)
