"""What the Run view reads: a run source.

A source is an engine the dashboard started (``run_manager.LiveRun``), a record followed as it grows
(``follow.AttachSource``), a record played back at its pace (``replay.ReplaySource``) or a
finished record shown whole (``replay.RecordSource``). The view draws ``state`` on a timer, asks
``allows`` which keys to offer, and runs ``feed`` while it shows the source.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ampscope.tui.model.run_state import RunState

STOP = "stop"
RESTART = "restart"
PAUSE = "pause"
"""Pause, play and seek: a playback's keys."""


class RunSource(Protocol):
    @property
    def state(self) -> RunState:
        """The run as known so far; a source may replace it (a replay seeking back)."""
        ...

    def label(self) -> str:
        """A few words for the header after the run's own ('attached · catching up'), or ''."""
        ...

    def allows(self, control: str) -> bool | None:
        """True: the key is offered; None: shown, disabled; False: not shown at all."""
        ...

    async def feed(self) -> None:
        """Bring events into ``state``; returns when no more will come."""
        ...

    async def stop(self) -> None:
        """Stop the engine behind the run, where ``allows(STOP)``."""
        ...

    async def restart(self) -> None:
        """Start the same run again, where ``allows(RESTART)``."""
        ...


@runtime_checkable
class Playback(Protocol):
    """A source with a clock the user moves: pause, and seek by a fraction of the run."""

    def toggle_pause(self) -> None: ...

    def seek_by(self, fraction: float) -> None: ...

    def seek_fraction(self, fraction: float) -> None: ...
