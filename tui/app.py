"""The ampscope dashboard: the screen stack, and the run session's listener.

The app decides what is shown. Runs are the session's (``tui.session``, Textual-free); screens
ask for runs with messages (``tui.messages``) and read runs through a source (``tui.source``).
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from textual.app import App
from textual.binding import Binding

from ampscope.core import parallel, records
from ampscope.core.launch import launch_detached
from ampscope.core.run_args import DEFAULT_REFRESH_HZ, check_refresh
from ampscope.core.text import visible
from ampscope.tui.commands import PresetCommands
from ampscope.tui.engine_process import kill_all_now
from ampscope.tui.follow import AttachSource
from ampscope.tui.messages import (
    EditedRunRequested,
    RecordOpened,
    RunRequested,
    SweepRequested,
)
from ampscope.tui.replay import RecordSource
from ampscope.tui.screens.compare import CompareScreen
from ampscope.tui.screens.presets import PresetsScreen
from ampscope.tui.screens.run import LIVE_RUN_SCREEN, RunScreen
from ampscope.tui.session import LiveRun, RunSession, start_engine_process
from ampscope.tui.source import RunSource
from ampscope.tui.viewer import WaitingScreen

AUTOSTART_ENV = "AMPSCOPE_AUTOSTART"
THEME_ENV = "AMPSCOPE_THEME"


class AmpscopeApp(App):
    """The dashboard.

    ``extra_overrides`` are appended (as ``--set``) to every run the app starts; ``autostart``
    is ``(preset, overrides)`` to run as soon as the app is up; ``open_run`` is a source to show
    as soon as the app is up (``ampscope attach`` and ``replay``). ``read_only``: no start, stop
    or preset edits (a served viewer); ``follow_live``: show the newest live run and move on to
    the next (tui.viewer). ``refresh_hz`` outside ``REFRESH_RANGE`` is a ValueError.
    """

    CSS_PATH = "app.tcss"
    TITLE = "ampscope"
    COMMANDS = App.COMMANDS | {PresetCommands}
    BINDINGS = [Binding("ctrl+q", "quit", "Quit", show=False, priority=True, id="app.quit")]

    def __init__(
        self,
        runs_dir: Path | None = None,
        refresh_hz: float | None = None,
        *,
        extra_overrides: Sequence[str] = (),
        autostart: tuple[str, Sequence[str]] | None = None,
        theme: str | None = None,
        read_only: bool = False,
        follow_live: bool = False,
        open_run: RunSource | None = None,
        processes: parallel.Launch | None = None,
    ) -> None:
        """``processes``: every run the app starts runs on torchrun's ranks (--nproc-per-node)."""
        super().__init__()
        self.refresh_hz = DEFAULT_REFRESH_HZ if refresh_hz is None else check_refresh(refresh_hz)
        self.runs_dir = Path(runs_dir) if runs_dir else records.default_runs_dir()
        self.read_only = read_only
        self.follow_live = follow_live
        self.open_run_at_start = open_run
        self.autostart = autostart
        self.session = RunSession(
            self,
            self.runs_dir,
            extra_overrides=extra_overrides,
            read_only=read_only,
            start_engine=partial(start_engine_process, processes=processes),
            launch=partial(launch_detached, launch=processes),
        )
        self._wanted_theme = theme

    # ------------------------------------------------------------------ lifecycle

    def on_mount(self) -> None:
        theme = self._wanted_theme or os.environ.get(THEME_ENV, "")
        if theme == "ansi":
            theme = "textual-ansi" if "textual-ansi" in self.available_themes else "ansi-dark"
        if theme and theme in self.available_themes:
            self.theme = theme
        if self.follow_live:
            self.push_screen(WaitingScreen(self.runs_dir))
        else:
            self.push_screen(PresetsScreen(self.runs_dir, read_only=self.read_only))
        if self.open_run_at_start is not None:
            self.call_after_refresh(self.open_run, self.open_run_at_start)
        elif self.autostart:
            preset, overrides = self.autostart
            self.call_after_refresh(self.session.start_run, preset, list(overrides))

    async def action_quit(self) -> None:
        """Stop the engine (SIGTERM, then SIGKILL after the grace period), then exit."""
        await self.session.stop_run()
        self.exit(0)

    async def on_unmount(self) -> None:
        """The last chance (exit without quit): the engine never outlives the app."""
        await self.session.close()

    # ------------------------------------------------------------------ what screens ask

    async def on_run_requested(self, message: RunRequested) -> None:
        await self.session.start_run(message.preset, detach=message.detach)

    async def on_edited_run_requested(self, message: EditedRunRequested) -> None:
        await self.session.start_edited_run(message.preset, detach=message.detach)

    async def on_sweep_requested(self, message: SweepRequested) -> None:
        await self.session.start_sweep(message.presets)

    def on_record_opened(self, message: RecordOpened) -> None:
        if message.live:
            self.open_run(AttachSource(message.run_dir, allow_stop=not self.read_only))
        else:
            self.open_run(RecordSource.load(message.run_dir))

    def open_run(self, source: RunSource) -> RunScreen:
        """Show ``source`` in a new Run view on top."""
        screen = RunScreen(source, self.refresh_hz)
        self.push_screen(screen)
        return screen

    # ------------------------------------------------------------------ what the session says

    def run_started(self, run: LiveRun) -> None:
        if self.is_screen_installed(LIVE_RUN_SCREEN):
            screen = self.get_screen(LIVE_RUN_SCREEN, RunScreen)
            screen.show(run)
        else:
            # Installed, so that going back to the presets keeps it alive: Textual removes a
            # popped screen that is not installed, and a removed screen cannot be shown again.
            screen = RunScreen(run, self.refresh_hz)
            self.install_screen(screen, name=LIVE_RUN_SCREEN)
        if self.screen is not screen:
            self._pop_above_presets()
            self.push_screen(screen)

    def run_detached(self, run_dir: Path) -> None:
        self._pop_above_presets()
        self.open_run(AttachSource(run_dir))

    def sweep_compared(self, runs: list[records.RunRecord], baseline: str) -> None:
        self.push_screen(CompareScreen(runs, baseline=baseline))

    def tell(self, message: str, *, error: bool = False, title: str = "") -> None:
        severity = "error" if error else "information"
        self.notify(visible(message), title=visible(title), severity=severity, markup=False)

    def _pop_above_presets(self) -> None:
        while len(self.screen_stack) > 2:
            self.pop_screen()


def parse_autostart(text: str | None) -> tuple[str, list[str]] | None:
    """``AMPSCOPE_AUTOSTART="fp32 workload.kind=mlp steps=500"``: a preset, then overrides."""
    if not text or not text.strip():
        return None
    words = shlex.split(text)
    return words[0], words[1:]


def _install_exit_handlers() -> None:
    """SIGTERM/SIGHUP: kill the engine's group and leave at once, never touching the tty.

    A graceful exit hangs after a hang-up (Textual's writer thread dies on the closed tty).
    """

    def handler(signum: int, frame: object) -> None:
        kill_all_now()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)


def run_dashboard(
    runs_dir: Path | None = None, refresh_hz: float | None = None, **options: Any
) -> int:
    """Run the dashboard in this terminal and return the exit code.

    ``$AMPSCOPE_AUTOSTART`` (``"PRESET [key=value ...]"``) starts a run right away, unless
    ``open_run`` names a run to show.
    """
    try:
        autostart = parse_autostart(os.environ.get(AUTOSTART_ENV))
    except ValueError as exc:
        print(f"ampscope: ${AUTOSTART_ENV} cannot be read ({exc}).", file=sys.stderr)
        return 2
    app = AmpscopeApp(runs_dir=runs_dir, refresh_hz=refresh_hz, autostart=autostart, **options)
    _install_exit_handlers()
    try:
        result = app.run()
    finally:
        kill_all_now()
    if app.return_code not in (None, 0):
        return int(app.return_code)
    return int(result) if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(run_dashboard())
