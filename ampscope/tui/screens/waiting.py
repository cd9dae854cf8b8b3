"""The read-only viewer ``ampscope serve`` gives each browser tab: it follows the current run.

``python -m ampscope.cli.serve.viewer --runs-dir DIR`` (textual-serve runs one per tab) opens the
dashboard with ``read_only=True, follow_live=True``: no presets, no start, stop or edits. It
shows the newest live run in DIR, keeps showing it when it ends, and moves to the next live run
when one starts. This screen is under every run it follows.
"""

from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Static

from ampscope.core.text import visible
from ampscope.tui.messages import RecordOpened
from ampscope.tui.model.follow import AttachSource
from ampscope.tui.model.live_runs import LiveRunFinder
from ampscope.tui.screens import SCREENS_CSS
from ampscope.tui.screens.run import RunScreen
from ampscope.tui.widgets.key_bar import KeyBar

POLL_S = 1.0


class WaitingScreen(Screen):
    """Shown while no live run is there to follow, and under every followed run.

    It polls the runs dir and opens the newest live run when it is not the one shown.
    """

    CSS_PATH = SCREENS_CSS

    HELP_TITLE = "Viewer (read-only)"
    HELP = (
        "A read-only view of the presenter's runs: it follows the newest live run and moves "
        "to the next when one starts. Runs are started and stopped in the presenter's terminal."
    )
    BINDINGS = [
        Binding("enter", "show_run", "Current run", id="viewer.current-run"),
        Binding("q", "app.quit", "Quit", id="quit"),
    ]

    def __init__(self, runs_dir: Path) -> None:
        super().__init__()
        self.runs_dir = runs_dir
        self.finder = LiveRunFinder(runs_dir)
        self.shown: Path | None = None

    def compose(self) -> ComposeResult:
        yield Static(
            f"ampscope viewer · read-only\n\nWaiting for a live run in {visible(str(self.runs_dir))} …\n\n"
            "Runs are started from the presenter's dashboard; this view follows the newest one.",
            id="viewer-waiting",
            markup=False,
        )
        yield KeyBar()

    def on_mount(self) -> None:
        self.call_after_refresh(self.poll)
        self.set_interval(POLL_S, self.poll, name="follow-live")

    @property
    def following(self) -> bool:
        """True while the screen on top follows the run this viewer opened, still going."""
        screen = self.app.screen
        if not isinstance(screen, RunScreen):
            return False
        source = screen.source
        return (
            isinstance(source, AttachSource) and source.run_dir == self.shown and not source.ended
        )

    def newest_live(self) -> Path | None:
        return self.finder.newest_live()

    def poll(self) -> None:
        if not self.following:
            self.show_latest()

    def show_latest(self, force: bool = False) -> None:
        path = self.newest_live()
        if path is None or (path == self.shown and not force):
            return
        self.shown = path
        while self.app.screen is not self and len(self.app.screen_stack) > 1:  # stay below
            self.app.pop_screen()
        self.post_message(RecordOpened(path, live=True))

    def action_show_run(self) -> None:
        self.show_latest(force=True)
