"""A finished record played back at its recorded pace, with pause and seek.

Events carry ``t`` (seconds since the run started); playback advances a clock by wall time
times ``speed`` and feeds every event up to it into a RunState. Seeking forward feeds more;
seeking back rebuilds the state from the start (ingesting is cheap: ~1 us an event).
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from ampscope.core import events as ev
from ampscope.core import records
from ampscope.tui.run_state import RunState

if TYPE_CHECKING:
    from ampscope.tui.app import AmpscopeApp
    from ampscope.tui.screens.run import RunScreen

TICK_S = 0.05
SEEK_STEP = 0.1
"""left/right move by this fraction of the run."""


class ReplaySource:
    """The Run view's source for a replay. ``state`` is replaced when seeking back."""

    seekable = True
    can_stop = False

    def __init__(self, events: Iterable[ev.Event], label: str = "", speed: float = 1.0) -> None:
        self.events = [e for e in events if isinstance(e, ev.Event)]
        self.times: list[float] = []
        latest = 0.0
        for e in self.events:  # the telemetry thread's lines may be a hair out of order
            latest = max(latest, e.t)
            self.times.append(latest)
        self.duration = self.times[-1] if self.times else 0.0
        self.label_text = label
        self.speed = speed
        self.paused = False
        self.position = 0.0  # record time shown
        self.index = 0  # next event to feed
        self.state = self._new_state()
        self.screen: RunScreen | None = None

    def _new_state(self) -> RunState:
        return RunState(label=self.label_text, read_only=True)

    @property
    def at_end(self) -> bool:
        return self.index >= len(self.events)

    @property
    def fraction(self) -> float:
        return 1.0 if self.duration <= 0 else min(1.0, self.position / self.duration)

    def label(self) -> str:
        mark = "end" if self.at_end else "paused" if self.paused else "playing"
        return f"{mark} {self.fraction * 100:.0f}% · {self.speed:g}x"

    # ------------------------------------------------------------------ playing

    def start(self, screen: RunScreen) -> None:
        self.screen = screen
        screen.run_worker(self.play(), group="replay", exit_on_error=False)

    async def play(self) -> None:
        last = time.monotonic()
        self.advance_to(0.0)
        while True:
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            if not self.paused and not self.at_end:
                self.advance_to(self.position + (now - last) * self.speed)
            last = now

    def advance_to(self, position: float) -> None:
        """Feed the events up to ``position`` (seconds of record time)."""
        self.position = min(max(0.0, position), self.duration)
        end = bisect.bisect_right(self.times, self.position)
        if end > self.index:
            self.state.ingest_many(self.events[self.index : end])
            self.index = end
        if self.at_end:
            self.position = self.duration
            self._finish()

    def _finish(self) -> None:
        state = self.state
        if not state.finished:
            state.status = "incomplete"
            state.add_log("warning", None, "the record has no 'done' event (the run was cut short)")
            state.version += 1

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
        if bisect.bisect_right(self.times, position) < self.index:
            self.state = self._new_state()
            self.index = 0
            if self.screen is not None:
                self.screen.show_state(self.state)
        self.advance_to(position)


def replay_record(app: AmpscopeApp, run_dir: Path, speed: float = 1.0) -> RunScreen:
    """Play ``run_dir`` back in a Run view."""
    from ampscope.tui.screens.run import RunScreen

    record = records.load_run(Path(run_dir))
    source = ReplaySource(record.events, label=record.preset, speed=speed)
    screen = RunScreen(source.state, app.refresh_hz, source=source)
    app.push_screen(screen)
    return screen
