"""The Run view: header, stat cards, four plots and the event log, drawn from a run source."""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Static
from textual.worker import Worker

from ampscope.core.presets.run_args import DEFAULT_REFRESH_HZ
from ampscope.core.text import visible
from ampscope.tui.model import figures
from ampscope.tui.model.replay import SEEK_STEP
from ampscope.tui.model.run_state import RunState
from ampscope.tui.model.source import PAUSE, STOP, Playback, RunSource
from ampscope.tui.screens import SCREENS_CSS
from ampscope.tui.screens.dialogs import ConfirmDialog
from ampscope.tui.screens.profile import (
    ASK,
    DEFAULT_STEPS,
    NO,
    ProfileScreen,
    ask_engine,
    profile_offer,
    read_only_view,
)
from ampscope.tui.widgets.event_log import EventLogView
from ampscope.tui.widgets.key_bar import KeyBar
from ampscope.tui.widgets.plots import LossPlot, MemoryPlot, RunPlot, StepTimePlot, UtilPlot
from ampscope.tui.widgets.ranks import RankStrip
from ampscope.tui.widgets.stat_cards import StatCards

SHORT_HEIGHT = 32  # rows below which the view packs tighter
PLAYBACK_ACTIONS = ("pause", "seek", "seek_to")


class RunScreen(Screen):
    """Shows one run source. What it offers (stop, restart, pause, seek) is the source's say."""

    CSS_PATH = SCREENS_CSS

    HELP_TITLE = "Run view"
    HELP = (
        "One run, live or recorded: the header says its phase, step, preset, device and "
        "precision; the cards its latest figures (medians of the last 20 steps); the plots its "
        "history (each title names its lines by their marker); the log its warnings and "
        "errors with their step. A replay plays a record at its pace."
    )
    BINDINGS = [
        Binding("s", "stop", "Stop", id="run.stop"),
        Binding("r", "restart", "Restart", id="run.restart"),
        Binding("n", "numerics", "Numerics", id="run.numerics"),
        Binding("p", "profile", "Profile", id="run.profile"),
        Binding("escape", "back", "Back", id="run.back"),
        Binding("b", "back", "Back", show=False, id="run.back-alt"),
        Binding("q", "app.quit", "Quit", id="quit"),
        # replays (priority: the focused event log would scroll on these keys)
        Binding("space", "pause", "Pause/play", priority=True, id="replay.pause"),
        Binding("left", "seek(-1)", "-10%", priority=True, id="replay.back"),
        Binding("right", "seek(1)", "+10%", priority=True, id="replay.forward"),
        Binding("home", "seek_to(0)", "Start", show=False, priority=True, id="replay.start"),
        Binding("end", "seek_to(1)", "End", show=False, priority=True, id="replay.end"),
    ]

    def __init__(self, source: RunSource, refresh_hz: float = DEFAULT_REFRESH_HZ) -> None:
        super().__init__()
        self.source = source
        self.refresh_hz = refresh_hz
        self.redraws = 0
        self.displayed_step: int | None = None
        self._header_lines = 0
        self._error: str | None = None  # the message shown, once one was

    @property
    def state(self) -> RunState:
        return self.source.state

    def compose(self) -> ComposeResult:
        with Vertical(id="run-top"):
            yield Static("", id="run-header", markup=False)
            # a long message scrolls, never cut; focusable only while it shows one
            with VerticalScroll(id="run-error-box", can_focus=False):
                yield Static("", id="run-error", markup=False)
        yield StatCards(id="cards")
        yield RankStrip(id="ranks")
        with Grid(id="plots"):
            yield StepTimePlot(id="plot-step")
            yield LossPlot(id="plot-loss")
            yield MemoryPlot(id="plot-mem")
            yield UtilPlot(id="plot-util")
        yield EventLogView(id="event-log")
        yield KeyBar()

    def on_mount(self) -> None:
        self._feed()
        self.refresh_view()
        # One redraw timer (2 Hz unless --refresh says otherwise), never a redraw per event:
        # rendering, plotext's above all, is what the UI spends its CPU on.
        self.set_interval(1.0 / self.refresh_hz, self.refresh_view, name="redraw")

    def on_resize(self, event: events.Resize) -> None:
        short = event.size.height < SHORT_HEIGHT
        self.set_class(short, "-short")
        self.query_one(StatCards).set_compact(short)

    def show(self, source: RunSource) -> None:
        """Show another source in this view (the dashboard's next run, a restart).

        The last run's toasts go with it: one still up would read as said of this run. A
        notice posted for this one (a detached start) is still queued, so it stays.
        """
        if source is not self.source:
            self.app.clear_notifications()
        self.source = source
        if self.is_attached:
            self._feed()
            self.refresh_view()
            self.refresh_bindings()

    def _work(self, work: Callable[[], Coroutine[Any, Any, None]], group: str) -> Worker[None]:
        """``work`` as this screen's one worker of ``group``. A callable, not a coroutine: one
        cancelled before it starts (by the next show) then leaves no coroutine that Python warns
        was never awaited."""
        return self.run_worker(work, group=group, exclusive=True)

    def _feed(self) -> None:
        self._work(partial(self._follow, self.source), "feed")

    async def _follow(self, source: RunSource) -> None:
        await source.feed()
        if self.is_attached and source is self.source:  # it ended: what is offered changes
            self.refresh_view()
            self.refresh_bindings()

    def refresh_view(self) -> None:
        try:
            self.refresh_text()
            self.redraw_plots()
        except NoMatches:  # a feed that ended while the app tears the screen down
            return

    def refresh_text(self) -> None:
        if not self.is_attached:
            return
        state = self.state
        self.displayed_step = state.step
        header = state.header()
        note = self.source.label()
        if note:
            header += " · " + note
        width = self.size.width - 2
        header = fit_header(visible(header), width)
        lines = header.count("\n") + 1  # a relayout only when that changes
        self.query_one("#run-header", Static).update(header, layout=lines != self._header_lines)
        self._header_lines = lines
        error = visible(state.error or "", keep_newlines=True)
        box = self.query_one("#run-error-box", VerticalScroll)
        if error != self._error:  # a new message is laid out; the same one costs nothing
            self._error = error
            self.query_one("#run-error", Static).update(error)
            box.display = box.can_focus = bool(state.error)
        # A run that failed before its first step (a factory's error) has empty plots: the
        # message takes their place, whole, and scrolls with the arrows when longer still.
        early = bool(state.error) and state.step is None
        if early and not self.has_class("-failed-early"):
            self.add_class("-failed-early")
            box.focus()
        elif not early:
            self.remove_class("-failed-early")
        self.query_one(StatCards).show(figures.cards(state))
        self.query_one(RankStrip).show(state.ranks)
        self.query_one(EventLogView).sync(state)

    def redraw_plots(self) -> None:
        if not self.is_attached:
            return
        for plot in self.query(RunPlot):
            plot.draw(self.state)
        self.redraws += 1

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in PLAYBACK_ACTIONS:
            return self.source.allows(PAUSE) is True  # False: not shown at all
        if action in ("stop", "restart"):
            return self.source.allows(action)
        if action == "profile":
            return None if profile_offer(self.state, read_only_view(self.app))[0] == NO else True
        return True

    def key_note(self, action: str) -> str:
        """Why a key does nothing here (the help screen says it)."""
        if action in PLAYBACK_ACTIONS:
            return "only a replay pauses and seeks"
        if action in ("stop", "restart"):
            why_not = getattr(self.source, "why_not", None)
            return why_not(action) if why_not else ""
        if action == "profile":
            return profile_offer(self.state, read_only_view(self.app))[1]
        return ""

    def on_screen_resume(self) -> None:
        self.refresh_bindings()

    def action_stop(self) -> None:
        """Stop at once a run an engine trains; someone's own watched training, once asked."""
        source = self.source
        if not getattr(source, "watched", False):
            self.stop_now(source)
            return
        question = (
            f"{self.state.label} is someone's own training process (ampscope.watch), not a run "
            "this dashboard started. Stop it? It gets SIGINT, as Ctrl+C would."
        )

        def answered(yes: bool | None) -> None:
            if yes and self.source is source:
                self.stop_now(source)

        self.app.push_screen(ConfirmDialog(question, yes="Stop"), answered)

    def stop_now(self, source: RunSource) -> None:
        self._work(partial(self._stop, source), "stop")
        self.refresh_view()

    async def _stop(self, source: RunSource) -> None:
        await source.stop()
        if self.is_attached:
            self.refresh_view()
            self.refresh_bindings()

    async def action_restart(self) -> None:
        """Start the run again; when it is still going, only once the user said so."""
        source = self.source
        if source.allows(STOP) is not True:
            await source.restart()
            return
        question = f"{self.state.label} is still running. Restart stops it and starts it again?"

        def answered(yes: bool | None) -> None:
            if yes:
                self._work(source.restart, "restart")

        self.app.push_screen(ConfirmDialog(question, yes="Restart"), answered)

    def action_profile(self) -> None:
        """Ask the engine to profile its next steps (or show the profile a record holds)."""
        offer, why = profile_offer(self.state, read_only_view(self.app))
        if offer == NO:
            self.app.notify(visible(f"Profile: {why}"), title="Not now", markup=False)
            return
        before, steps = self.state.profile, None
        if offer == ASK:
            problem = ask_engine(self.state)
            if problem:
                self.app.notify(visible(problem), severity="error", markup=False)
                return
            steps = DEFAULT_STEPS
        self.app.push_screen(ProfileScreen(self.source, steps, before))

    def action_pause(self) -> None:
        if isinstance(self.source, Playback):
            self.source.toggle_pause()
            self.refresh_view()

    def action_seek(self, direction: int) -> None:
        if isinstance(self.source, Playback):
            self.source.seek_by(direction * SEEK_STEP)
            self.refresh_view()

    def action_seek_to(self, fraction: int) -> None:
        if isinstance(self.source, Playback):
            self.source.seek_fraction(float(fraction))
            self.refresh_view()

    def action_numerics(self) -> None:
        """Per-layer numerics of this run (tui/screens/numerics.py)."""
        from ampscope.tui.screens.numerics import NumericsScreen

        self.app.push_screen(NumericsScreen(self.source, self.refresh_hz))

    def action_back(self) -> None:
        """Back to what was below (the presets, the history, the viewer's waiting screen)."""
        if len(self.app.screen_stack) > 2:
            self.app.pop_screen()


DEVICE_NAME = re.compile(r" \([^()]*\)(?= · )")


def fit_header(header: str, width: int) -> str:
    """The header on one line when it can be: the device's name goes first (the log has it);
    when it is still too long, it breaks between two of its parts, never inside one."""
    if len(header) <= width:
        return header
    header = DEVICE_NAME.sub("", header, count=1)
    if len(header) <= width:
        return header
    cut = header.rfind(" · ", 0, width)
    return header if cut < 0 else header[:cut] + "\n" + header[cut + 3 :]
