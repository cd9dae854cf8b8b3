"""The read-only viewer ``ampscope serve`` gives each browser tab: it follows the current run.

``python -m ampscope.cli.viewer --runs-dir DIR`` (textual-serve runs one per tab) opens the dashboard with
``read_only=True, follow_live=True``: no presets, no start, stop or edits. It shows the newest
live run in DIR, keeps showing it when it ends, and moves to the next live run when one starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Static

from ampscope.core import records
from ampscope.tui.follow import AttachSource, attach_record

if TYPE_CHECKING:
    from ampscope.tui.app import AmpscopeApp
    from ampscope.tui.screens.run import RunScreen

POLL_S = 1.0


class WaitingScreen(Screen):
    """Shown while no live run is there to follow (and under every followed run)."""

    BINDINGS = [
        Binding("enter", "show_run", "Current run"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self, runs_dir: Path) -> None:
        super().__init__()
        self.runs_dir = runs_dir

    def compose(self) -> ComposeResult:
        yield Static(
            f"ampscope viewer · read-only\n\nWaiting for a live run in {self.runs_dir} …\n\n"
            "Runs are started from the presenter's dashboard; this view follows the newest one.",
            id="viewer-waiting",
        )
        yield Footer()

    def action_show_run(self) -> None:
        follower: LiveFollower | None = getattr(self.app, "live_follower", None)
        if follower is not None:
            follower.show_latest(force=True)


class LiveFollower:
    """Polls the runs dir; opens the newest live run when it is not the one shown."""

    def __init__(self, app: AmpscopeApp) -> None:
        self.app = app
        self.shown: Path | None = None
        self.screen: RunScreen | None = None

    @property
    def following(self) -> bool:
        screen = self.screen
        if screen is None or not screen.is_attached or screen is not self.app.screen:
            return False
        source = screen.source
        return isinstance(source, AttachSource) and not source.ended

    def newest_live(self) -> Path | None:
        return next(
            (r.path for r in records.list_runs(self.app.runs_dir) if r.state == "live"), None
        )

    def poll(self) -> None:
        if self.following:
            return
        self.show_latest()

    def show_latest(self, force: bool = False) -> None:
        path = self.newest_live()
        if path is None or (path == self.shown and not force):
            return
        self.shown = path
        app = self.app
        while len(app.screen_stack) > 2:  # keep the waiting screen at the bottom
            app.pop_screen()
        self.screen = attach_record(app, path)


def start_following(app: AmpscopeApp) -> LiveFollower:
    follower = LiveFollower(app)
    app.live_follower = follower  # type: ignore[attr-defined]
    app.push_screen(WaitingScreen(app.runs_dir))
    app.call_after_refresh(follower.poll)
    app.set_interval(POLL_S, follower.poll, name="follow-live")
    return follower
