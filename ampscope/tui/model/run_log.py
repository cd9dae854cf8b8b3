"""A run's event log as the Run view shows it: bounded, numbered, literal."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ampscope.core.text import visible

MAX_LOG = 1000
LOG_LINE_CHARS = 2000
"""Characters an event-log entry keeps: a 10 MB warning is cut, so the log holds at most
MAX_LOG x LOG_LINE_CHARS characters however a record is made."""


@dataclass(frozen=True)
class LogEntry:
    seq: int
    level: str  # info, warning, error, skipped, stderr
    step: int | None
    text: str


class EventLog(deque[LogEntry]):
    """The run's event log, newest last: at most ``MAX_LOG`` entries, each numbered, each
    shown literally and cut at ``LOG_LINE_CHARS``."""

    def __init__(self) -> None:
        super().__init__(maxlen=MAX_LOG)
        self.seq = 0

    def add(self, level: str, step: int | None, text: str) -> None:
        self.seq += 1
        self.append(
            LogEntry(self.seq, level, step, visible(text, LOG_LINE_CHARS, keep_newlines=True))
        )

    def since(self, seq: int) -> list[LogEntry]:
        """Entries newer than ``seq`` (those already dropped from the ring are lost)."""
        if not self or self[-1].seq <= seq:
            return []
        return [e for e in self if e.seq > seq]
