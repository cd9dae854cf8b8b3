"""The ampscope dashboard: the screen stack, and the run manager's listener.

The app decides what is shown. Runs are the run manager's (``tui.model.run_manager``, Textual-free); screens
ask for runs with messages (``tui.messages``) and read runs through a source (``tui.model.source``).
"""

from __future__ import annotations

import gc
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import events
from textual.app import App
from textual.binding import Binding
from textual.notifications import SeverityLevel
from textual.screen import Screen

from ampscope.core import records
from ampscope.core.presets.run_args import DEFAULT_REFRESH_HZ, check_refresh
from ampscope.core.text import visible
from ampscope.tui.commands import PresetCommands
from ampscope.tui.keymapping import Keymapping
from ampscope.tui.messages import (
    EditedRunRequested,
    RecordOpened,
    RunRequested,
    SweepRequested,
)
from ampscope.tui.navigation import Navigation
from ampscope.tui.screens import SCREENS_CSS
from ampscope.tui.screens.installed import LIVE_RUN_SCREEN
from ampscope.tui.screens.presets import PresetsScreen
from ampscope.tui.terminal import SavedTerminal

if TYPE_CHECKING:
    from ampscope.core.presets import parallel
    from ampscope.tui.model.run_manager import LiveRun, RunManager
    from ampscope.tui.model.source import RunSource
    from ampscope.tui.screens.run import RunScreen

# The first screen is the presets'; every other screen, and the run manager with the engine
# processes behind it, is loaded when first asked for (benchmarks/first_paint.py).


class ScreensWithKeys:
    """``AmpscopeApp.SCREENS_WITH_KEYS``: the screens, loaded when a keymap is read."""

    def __get__(self, app: object, owner: type | None = None) -> tuple[type[Screen], ...]:
        from ampscope.tui.screens.compare import CompareScreen
        from ampscope.tui.screens.dialogs import ConfirmDialog, TooSmallScreen
        from ampscope.tui.screens.formats import FormatsScreen
        from ampscope.tui.screens.help import HelpScreen
        from ampscope.tui.screens.history import HistoryScreen
        from ampscope.tui.screens.machine import MachineScreen
        from ampscope.tui.screens.memory import MemoryScreen
        from ampscope.tui.screens.numerics import NumericsScreen
        from ampscope.tui.screens.plan import PlanScreen
        from ampscope.tui.screens.profile import ProfileScreen
        from ampscope.tui.screens.run import RunScreen
        from ampscope.tui.screens.save import SaveDialog
        from ampscope.tui.screens.waiting import WaitingScreen

        return (
            PresetsScreen,
            SaveDialog,
            RunScreen,
            HistoryScreen,
            CompareScreen,
            FormatsScreen,
            MemoryScreen,
            MachineScreen,
            ProfileScreen,
            NumericsScreen,
            PlanScreen,
            WaitingScreen,
            HelpScreen,
            ConfirmDialog,
            TooSmallScreen,
        )


AUTOSTART_ENV = "AMPSCOPE_AUTOSTART"
THEME_ENV = "AMPSCOPE_THEME"


class AmpscopeApp(Keymapping, Navigation, App):
    """The dashboard.

    ``extra_overrides`` are appended (as ``--set``) to every run the app starts; ``autostart``
    is ``(preset, overrides)`` to run as soon as the app is up; ``open_run`` is a source to show
    as soon as the app is up (``ampscope attach`` and ``replay``). ``read_only``: no start, stop
    or preset edits (a served viewer); ``follow_live``: show the newest live run and move on to
    the next (tui.screens.waiting). ``refresh_hz`` outside ``REFRESH_RANGE`` is a ValueError.
    """

    CSS_PATH = "app.tcss"
    TITLE = "ampscope"
    COMMANDS = App.COMMANDS | {PresetCommands}
    BINDINGS = [
        # ctrl+q works while a text field has the letters; the footer shows it then
        Binding("ctrl+q", "quit", "Quit", priority=True, id="app.quit"),
        Binding("question_mark,f1", "help", "Help", id="help"),
        Binding("ctrl+p", "command_palette", "Palette", priority=True, id="palette"),
        # the shell's job control, as in any terminal program: fg brings it back. A run it
        # started trains on meanwhile; its live stream drops the steps the stopped view
        # cannot take and says how many (engine/emitter.py), the record keeps them all
        Binding(
            "ctrl+z",
            "suspend_process",
            "Suspend (fg resumes)",
            show=False,
            priority=True,
            id="suspend",
        ),
    ]
    SCREENS_WITH_KEYS = ScreensWithKeys()
    """Every screen whose bindings ``keys.toml`` may remap."""

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
        self.extra_overrides = list(extra_overrides)
        self._processes = processes
        self._run_manager: RunManager | None = None
        self._wanted_theme = theme

    @property
    def run_manager(self) -> RunManager:
        """The runs this dashboard starts: made (its engine code loaded) on first use."""
        if self._run_manager is None:
            from ampscope.core.processes.launch import launch_detached
            from ampscope.tui.model.run_manager import RunManager, start_engine_process

            self._run_manager = RunManager(
                self,
                self.runs_dir,
                extra_overrides=self.extra_overrides,
                read_only=self.read_only,
                start_engine=partial(start_engine_process, processes=self._processes),
                launch=partial(launch_detached, launch=self._processes),
            )
        return self._run_manager

    # ------------------------------------------------------------------ lifecycle

    def on_mount(self) -> None:
        # what is wrong with keys.toml is said once the screen is drawn: a notice posted
        # before then lasts its 5 s from the post, and a slow first draw (a loaded machine)
        # could take all of them
        problems = self.load_keys()
        self.call_after_refresh(self._first_screen_drawn, problems)
        self.screen_change_signal.subscribe(self, lambda _screen: self.check_size())
        theme = self._wanted_theme or os.environ.get(THEME_ENV, "")
        if theme == "ansi":
            theme = "textual-ansi" if "textual-ansi" in self.available_themes else "ansi-dark"
        if theme and theme in self.available_themes:
            self.theme = theme
        if self.follow_live:
            from ampscope.tui.screens.waiting import WaitingScreen

            self.push_screen(WaitingScreen(self.runs_dir))
        else:
            self.push_screen(PresetsScreen(self.runs_dir, read_only=self.read_only))
        if self.open_run_at_start is not None:
            self.call_after_refresh(self.open_run, self.open_run_at_start)
        elif self.autostart:
            preset, overrides = self.autostart
            self.call_after_refresh(self.run_manager.start_run, preset, list(overrides))

    def _first_screen_drawn(self, keys_problems: list[str]) -> None:
        """What is wrong with the user's keys file is said, now that it can be seen.

        The garbage collector runs again (``ampscope`` with no command stops it while the
        dashboard's code loads and its first screen is built: tens of thousands of objects,
        none of them garbage, that each collection would walk, benchmarks/first_paint.py).

        And the other screens' styles are read now, while the first screen is looked at:
        each of those screens would read them (its ``CSS_PATH``) when first shown, and Textual
        then parses every style again and restyles every widget, tens of milliseconds on the
        keypress that opens it."""
        self.tell_keys_problems(keys_problems)
        gc.enable()
        if not self.stylesheet.has_source(str(SCREENS_CSS)):
            self.stylesheet.read(SCREENS_CSS)
            self.stylesheet.reparse()
            self.stylesheet.update(self)

    # ------------------------------------------------------------------ keys, help, size

    def action_help(self) -> None:
        from ampscope.tui.screens.help import HelpScreen

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.screen))

    async def _on_resize(self, event: events.Resize) -> None:
        # Textual's handler stops the event, so no on_resize of ours would ever run
        await super()._on_resize(event)
        self.check_size()

    def check_size(self) -> None:
        """Under ``MIN_SIZE`` a notice covers the dashboard; it goes when the terminal grows."""
        from ampscope.tui.screens.dialogs import MIN_SIZE, TooSmallScreen

        width, height = self.size
        small = width < MIN_SIZE[0] or height < MIN_SIZE[1]
        if small and not isinstance(self.screen, TooSmallScreen):
            self.push_screen(TooSmallScreen())
        elif not small and isinstance(self.screen, TooSmallScreen):
            self.pop_screen()

    async def action_quit(self) -> None:
        """Stop the engine (SIGTERM, then SIGKILL after the grace period), then exit."""
        if self._run_manager is not None:
            await self._run_manager.stop_run()
        self.exit(0)

    async def on_unmount(self) -> None:
        """The last chance (exit without quit): the engine never outlives the app."""
        if self._run_manager is not None:
            await self._run_manager.close()

    # ------------------------------------------------------------------ what screens ask

    async def on_run_requested(self, message: RunRequested) -> None:
        self.after_stopping(
            message.preset,
            lambda: self.run_manager.start_run(message.preset, detach=message.detach),
        )

    async def on_edited_run_requested(self, message: EditedRunRequested) -> None:
        from ampscope.tui.model.run_manager import edited_name

        name = edited_name(message.preset)
        self.after_stopping(
            name, lambda: self.run_manager.start_edited_run(message.preset, detach=message.detach)
        )

    async def on_sweep_requested(self, message: SweepRequested) -> None:
        self.after_stopping(
            f"a sweep of {len(message.presets)}",
            lambda: self.run_manager.start_sweep(message.presets, message.repeats),
            declined=message.declined,
        )

    def after_stopping(
        self,
        what: str,
        start: Callable[[], Awaitable[object]],
        declined: Callable[[], None] = lambda: None,
    ) -> None:
        """Start ``what``; when that would stop a run this dashboard is running, ask first
        (``declined`` when the user keeps the run).

        A detached run is not this dashboard's child, and a new run never stops it.
        """
        running = self._run_manager.current if self._run_manager is not None else None
        if running is None or not running.engine.running or running.state.finished:
            self.run_worker(start(), group="start", exclusive=False)
            return
        state = running.state
        step = "" if state.step is None else f" at step {state.step + 1}"
        question = (
            f"{state.label} is running{step}. Starting {what} stops it "
            "(its record keeps what it did so far). Stop it?"
        )

        def answered(yes: bool | None) -> None:
            if yes:
                self.run_worker(start(), group="start", exclusive=False)
            else:
                declined()

        from ampscope.tui.screens.dialogs import ConfirmDialog

        self.push_screen(ConfirmDialog(question, yes="Stop it and start"), answered)

    def on_record_opened(self, message: RecordOpened) -> None:
        from ampscope.tui.model.follow import AttachSource
        from ampscope.tui.model.replay import RecordSource

        if message.live:
            self.watch_live(AttachSource(message.run_dir, allow_stop=not self.read_only))
        else:
            self.open_run(RecordSource.load(message.run_dir))

    def open_run(self, source: RunSource) -> RunScreen:
        """Show ``source`` on top: a live one in the live Run view (``v`` comes back to it)."""
        from ampscope.tui.model.follow import AttachSource
        from ampscope.tui.screens.run import RunScreen

        if isinstance(source, AttachSource) and not source.ended:
            return self.watch_live(source, pop=False)
        screen = RunScreen(source, self.refresh_hz)
        self.push_screen(screen)
        return screen

    def watch_live(self, source: RunSource, pop: bool = False) -> RunScreen:
        """Show a live run in the one live Run view, installed under ``LIVE_RUN_SCREEN``.

        Installed, so that going back keeps it alive and ``v`` returns to it: Textual removes
        a popped screen that is not installed, and a removed screen cannot be shown again.
        """
        from ampscope.tui.screens.run import RunScreen

        if self.is_screen_installed(LIVE_RUN_SCREEN):
            screen = self.get_screen(LIVE_RUN_SCREEN, RunScreen)
            screen.show(source)
        else:
            screen = RunScreen(source, self.refresh_hz)
            self.install_screen(screen, name=LIVE_RUN_SCREEN)
        if self.screen is not screen:
            if pop:
                self._pop_above_presets()
            elif screen in self.screen_stack:
                self._pop_above(screen)
                return screen
            self.push_screen(screen)
        return screen

    # ------------------------------------------------------------------ what the run manager says

    def run_started(self, run: LiveRun) -> None:
        self.watch_live(run, pop=True)

    def run_detached(self, run_dir: Path) -> None:
        from ampscope.tui.model.follow import AttachSource

        self.watch_live(AttachSource(run_dir), pop=True)

    def sweep_compared(
        self, runs: list[records.RunRecord], baseline: str, *, repeated: bool = False
    ) -> None:
        from ampscope.tui.screens.compare import CompareScreen

        self.push_screen(CompareScreen(runs, baseline=baseline, repeated=repeated))

    def tell(self, message: str, *, error: bool = False, title: str = "") -> None:
        severity: SeverityLevel = "error" if error else "information"
        self.notify(visible(message), title=visible(title), severity=severity, markup=False)

    def _pop_above_presets(self) -> None:
        while len(self.screen_stack) > 2:
            self.pop_screen()

    def _pop_above(self, screen: Screen) -> None:
        while self.screen is not screen and len(self.screen_stack) > 1:
            self.pop_screen()


def parse_autostart(text: str | None) -> tuple[str, list[str]] | None:
    """``AMPSCOPE_AUTOSTART="fp32 workload.kind=mlp steps=500"``: a preset, then overrides."""
    if not text or not text.strip():
        return None
    words = shlex.split(text)
    return words[0], words[1:]


def kill_engines() -> None:
    """Kill every engine this dashboard started: none when the module that starts them
    (tui/model/engine_process.py) was never loaded."""
    if "ampscope.tui.model.engine_process" in sys.modules:
        from ampscope.tui.model.engine_process import kill_all_now

        kill_all_now()


def _install_exit_handlers(terminal: SavedTerminal) -> None:
    """SIGTERM/SIGHUP: kill the engine's group and leave at once.

    A graceful exit hangs after a hang-up (Textual's writer thread dies on the closed tty),
    so neither waits for one. On SIGTERM the terminal is still there and is given back as it
    was (no raw mode, no mouse tracking); after SIGHUP it is gone and left untouched.
    """

    def handler(signum: int, frame: object) -> None:
        kill_engines()
        if signum == signal.SIGTERM:
            terminal.restore()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)
    _leave_when_the_terminal_goes(terminal.output_fd)


TERMINAL_LOOK_S = 1.0
"""How often the dashboard looks whether its terminal is still there."""


def _leave_when_the_terminal_goes(fd: int | None) -> None:
    """A terminal that closes without a hang-up signal (the dashboard started under
    ``setsid``, so no session of that terminal holds it) leaves the dashboard drawing to
    nothing, and its engine training, for ever: a thread looks once a second whether the
    terminal is still one (a hung-up terminal answers no) and, once it is not, leaves as a
    hang-up does: the engines killed, the terminal left untouched."""
    if fd is None or not os.isatty(fd):
        return

    def look() -> None:
        while os.isatty(fd):
            time.sleep(TERMINAL_LOOK_S)
        kill_engines()
        os._exit(128 + signal.SIGHUP)

    threading.Thread(target=look, name="ampscope-terminal", daemon=True).start()


DUMB_TERMINALS = ("dumb", "unknown")


def terminal_refusal(term: str | None) -> str | None:
    """Why the dashboard will not start in this terminal, or None when it can."""
    if term not in DUMB_TERMINALS:
        return None
    return (
        f"ampscope: this terminal (TERM={term}) cannot show the dashboard: it has no cursor "
        "movement or colours. The headless commands work here: 'ampscope run PRESET' "
        "(progress and a summary), 'ampscope runs', 'ampscope bench', 'ampscope stop'. Or "
        "set TERM to your terminal's type (xterm-256color for most)."
    )


def missing_terminal(input_fd: int | None, output_fd: int | None) -> str | None:
    """Why the dashboard will not start without a terminal to read keys from and draw on
    (started from a script, a cron job, with input from /dev/null): it would draw to nothing
    and wait for keys for ever. None when both are terminals, or Textual is told to use
    another driver (``TEXTUAL_DRIVER``, as ``ampscope serve`` does)."""
    if os.environ.get("TEXTUAL_DRIVER"):
        return None
    lacking = [
        name
        for name, fd in (("input", input_fd), ("output (stderr)", output_fd))
        if fd is None or not os.isatty(fd)
    ]
    if not lacking:
        return None
    return (
        f"ampscope: the dashboard needs a terminal, and its {' and '.join(lacking)} here "
        f"{'is' if len(lacking) == 1 else 'are'} not one (a pipe, a file or /dev/null). The "
        "headless commands work anywhere: 'ampscope run PRESET' (progress and a summary), "
        "'ampscope runs', 'ampscope bench'; 'ampscope serve' shows the dashboard in a browser."
    )


def run_dashboard(
    runs_dir: Path | None = None, refresh_hz: float | None = None, **options: Any
) -> int:
    """Run the dashboard in this terminal and return the exit code.

    ``$AMPSCOPE_AUTOSTART`` (``"PRESET [key=value ...]"``) starts a run right away, unless
    ``open_run`` names a run to show. A terminal that cannot draw it (``TERM=dumb``) is told
    which commands work there instead, with exit code 2, and so is a dashboard started
    with no terminal at all.
    """
    terminal = SavedTerminal()
    refusal = terminal_refusal(os.environ.get("TERM")) or missing_terminal(
        terminal.input_fd, terminal.output_fd
    )
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    try:
        autostart = parse_autostart(os.environ.get(AUTOSTART_ENV))
    except ValueError as exc:
        print(f"ampscope: ${AUTOSTART_ENV} cannot be read ({exc}).", file=sys.stderr)
        return 2
    if not os.environ.get("TEXTUAL_DRIVER"):
        # Textual reads the size through shutil, which takes COLUMNS and LINES before the
        # terminal's own: a pair exported elsewhere would size every screen, resizes ignored
        # (serve's viewers set TEXTUAL_DRIVER and pass their browser's size in these two)
        for name in ("COLUMNS", "LINES"):
            os.environ.pop(name, None)
    app = AmpscopeApp(runs_dir=runs_dir, refresh_hz=refresh_hz, autostart=autostart, **options)
    _install_exit_handlers(terminal)
    try:
        result = app.run()
    finally:
        kill_engines()
    if app.return_code not in (None, 0):
        return int(app.return_code)
    return int(result) if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(run_dashboard())
