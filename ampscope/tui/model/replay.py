"""Finished records in the Run view: played back at their recorded pace, or shown whole.

Events carry ``t`` (seconds since the run started); playback advances a clock by wall time
times ``speed`` and feeds every event up to it into a RunState. It starts at the run's
``hello``: what came before (importing torch, building the model) has nothing to show. Seeking
forward feeds more; seeking back rebuilds the state from the start (ingesting is cheap: ~1 us
an event).

A record is read thinned (``core.records.thinned``): however long the run, the view holds a
few thousand of its steps, spread over all of it, and lets go of them when it closes.
"""

from __future__ import annotations

import asyncio
import bisect
import os
import time
from collections.abc import Iterable
from pathlib import Path

from ampscope.core import events as ev
from ampscope.core import records
from ampscope.core.text import visible
from ampscope.core.units import fmt_ms
from ampscope.tui.model.run_state import RunState
from ampscope.tui.model.source import PAUSE

TICK_S = 0.05
SEEK_STEP = 0.1
"""left/right move by this fraction of the run."""
NO_ENGINE = "a record has no engine behind it (the run is over)"


MAX_GAP_S = 10.0
"""The longest gap between two events a replay plays as recorded: a running engine writes
telemetry twice a second, so a longer silence is a stopped process or a damaged stamp."""

INGEST_CHUNK = 5000
"""Events ingested between two looks at the UI's own events, so that keys (q) still work."""


def _load_events(run_dir: Path) -> tuple[list[ev.Event], str, str, str | None, bool]:
    """The record's events (thinned), its preset, what the thinning left out, why its events
    could not be read, when they could not (None when they could), and whether its run was
    still going when they were read (its end is then no end)."""
    run_dir = Path(run_dir)
    record = records.load_run(run_dir, thinned=True)
    running = record.done is None and records.run_state(record) in ("live", "stalled")
    return (
        record.events,
        record.preset,
        record.note,
        unreadable(run_dir, record.problem),
        running,
    )


def unreadable(run_dir: Path, problem: str | None) -> str | None:
    """Why a record's events could not be read: gone since it was listed, no file, or one
    that cannot be read (permissions, a FIFO). None when they were read."""
    events = run_dir / records.EVENTS_FILE
    if problem:
        return visible(f"{records.EVENTS_FILE} {problem}")
    if not run_dir.is_dir():
        return visible(f"the record is gone: {run_dir} was removed")
    if not events.is_file():
        what = "is not a regular file" if os.path.lexists(events) else "is missing"
        return f"{records.EVENTS_FILE} {what}"
    return None


class RecordSource:
    """A finished record shown whole (History): nothing more to feed, stop or seek.

    ``load`` reads the record in a thread while the view is already up: a large record (or a
    slow disk) never freezes the dashboard.
    """

    def __init__(
        self, events: Iterable[ev.Event] = (), label: str = "", run_dir: Path | None = None
    ) -> None:
        self.state = RunState(label=label, read_only=True, read_from="record")
        self.run_dir = run_dir  # still to be read
        if run_dir is None:
            self.state.ingest_many(events)
            self.state.record_ended()

    @classmethod
    def load(cls, run_dir: Path) -> RecordSource:
        return cls(label=Path(run_dir).name, run_dir=Path(run_dir))

    def label(self) -> str:
        return "loading" if self.run_dir is not None else ""

    def allows(self, control: str) -> bool | None:
        return False  # a record has no engine: no stop, no restart, nothing to play

    def why_not(self, control: str) -> str:
        return NO_ENGINE

    async def feed(self) -> None:
        if self.run_dir is None:
            return
        events, preset, note, unread, running = await asyncio.to_thread(_load_events, self.run_dir)
        self.state.label = preset
        if note:
            self.state.log.add("info", None, note)
        for start in range(0, len(events), INGEST_CHUNK):
            self.state.ingest_many(events[start : start + INGEST_CHUNK])
            await asyncio.sleep(0)
        self.state.record_ended(unread, running=running)
        self.run_dir = None

    async def stop(self) -> None:
        return

    async def restart(self) -> None:
        return


class ReplaySource:
    """A record played back at ``speed`` times its pace. ``state`` is replaced when seeking back.

    ``load`` reads the record in a thread once the view is up (``feed``).
    """

    def __init__(
        self,
        events: Iterable[ev.Event],
        label: str = "",
        speed: float = 1.0,
        read_from: str = "replay",
    ) -> None:
        self.label_text = label
        self.read_from = read_from  # the header's word for it: a shipped example says so
        self.speed = speed
        self.paused = False
        self.position = 0.0  # seconds of the run shown, from its hello
        self.index = 0  # next event to feed
        self.run_dir: Path | None = None  # still to be read
        self.note = ""  # what reading the record thinned, if it did
        self.unread: str | None = None  # why the record's events could not be read, if so
        self.running = False  # its run was still going when the record was read
        self._set_events(events)
        self.state = self._new_state()

    def _set_events(self, events: Iterable[ev.Event]) -> None:
        """The events, each with its time on the replay's clock: the record's, except that a
        gap of more than ``MAX_GAP_S`` with no event at all (a stopped process, a damaged
        stamp such as t = 1e300) is played as ``MAX_GAP_S``, so that every replay ends."""
        self.events = [e for e in events if isinstance(e, ev.Event)]
        self.times: list[float] = []
        at = next((i for i, e in enumerate(self.events) if isinstance(e, ev.HelloEvent)), None)
        self.longest_gap = 0.0  # the longest gap played shortened, in record seconds (0: none)
        latest = played = 0.0
        for i, e in enumerate(self.events):  # telemetry's lines may be a hair out of order
            t = max(latest, e.t)
            gap = t - latest
            if gap > MAX_GAP_S and at is not None and i > at:  # before the hello: not played
                self.longest_gap = max(self.longest_gap, gap)
            played += min(gap, MAX_GAP_S)
            latest = t
            self.times.append(played)
        # record time of position 0: the hello's on the same clock as the others (a hello
        # stamped before 0, as a damaged record has it, made the run last 1e300 s, never ending)
        self.start = self.times[at] if at is not None else 0.0
        self.duration = max(0.0, self.times[-1] - self.start) if self.times else 0.0

    @classmethod
    def load(cls, run_dir: Path, speed: float = 1.0, read_from: str = "replay") -> ReplaySource:
        source = cls([], label=Path(run_dir).name, speed=speed, read_from=read_from)
        source.run_dir = Path(run_dir)
        return source

    def _new_state(self) -> RunState:
        """Before the replay reaches the hello, the header still names the run's settings."""
        hello = next((e for e in self.events if isinstance(e, ev.HelloEvent)), None)
        launch = dict(hello.config or {}) if hello is not None else None
        state = RunState(
            label=self.label_text, launch=launch, read_only=True, read_from=self.read_from
        )
        if self.note:
            state.log.add("info", None, self.note)
        if self.longest_gap:
            state.log.add(
                "info",
                None,
                f"the record holds no event for up to {fmt_ms(self.longest_gap * 1000)}; "
                f"each such gap is played as {MAX_GAP_S:g} s",
            )
        return state

    @property
    def at_end(self) -> bool:
        return self.run_dir is None and self.index >= len(self.events)

    @property
    def fraction(self) -> float:
        return 1.0 if self.duration <= 0 else min(1.0, self.position / self.duration)

    def label(self) -> str:
        if self.run_dir is not None:
            return "loading"
        mark = "end" if self.at_end else "paused" if self.paused else "playing"
        return f"{mark} {self.fraction * 100:.0f}% at {self.speed:g}x"

    def allows(self, control: str) -> bool | None:
        return control == PAUSE  # a replay has no engine: stop and restart are not offered

    def why_not(self, control: str) -> str:
        return NO_ENGINE

    async def stop(self) -> None:
        return

    async def restart(self) -> None:
        return

    # ------------------------------------------------------------------ playing

    async def feed(self) -> None:
        """Read the record (if not yet), then play: advance the clock every tick while not
        paused (seeking works at any time)."""
        if self.run_dir is not None:
            loaded = await asyncio.to_thread(_load_events, self.run_dir)
            events, self.label_text, self.note, self.unread, self.running = loaded
            self._set_events(events)
            self.state = self._new_state()  # its header names the run's settings at once
            self.run_dir = None
        last = time.monotonic()
        self.advance_to(0.0)
        while True:
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            self.tick(now - last)
            last = now

    def tick(self, wall_s: float) -> None:
        """``wall_s`` seconds went by: unless paused, the record's clock moves ``speed`` times that."""
        if not self.paused and not self.at_end:
            self.advance_to(self.position + wall_s * self.speed)

    def advance_to(self, position: float) -> None:
        """Feed the events up to ``position`` (seconds of the run from its hello)."""
        self.position = min(max(0.0, position), self.duration)
        # at the end, every event: start + (last - start) can round below last (0.0194 +
        # (0.297 - 0.0194) < 0.297), which left the done unfed and the replay at 100% for ever
        at = self.start + self.position
        end = (
            len(self.times)
            if self.position >= self.duration
            else bisect.bisect_right(self.times, at)
        )
        if end > self.index:
            self.state.ingest_many(self.events[self.index : end])
            self.index = end
        if self.at_end:
            self.position = self.duration
            self.state.record_ended(self.unread, running=self.running)

    # ------------------------------------------------------------------ controls

    def toggle_pause(self) -> None:
        if self.at_end:  # play again from the start
            self.seek_to(0.0)
            self.paused = False
            return
        self.paused = not self.paused

    def seek_by(self, fraction: float) -> None:
        self.seek_to(self.position + fraction * self.duration)

    def seek_fraction(self, fraction: float) -> None:
        self.seek_to(fraction * self.duration)

    def seek_to(self, position: float) -> None:
        position = min(max(0.0, position), self.duration)
        if bisect.bisect_right(self.times, self.start + position) < self.index:
            self.state = self._new_state()
            self.index = 0
        self.advance_to(position)
