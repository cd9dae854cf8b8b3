"""The live dashboard: header, stat cards, four plots and the event log."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Static

from ampscope.tui.run_state import RunState
from ampscope.tui.widgets.event_log import EventLog
from ampscope.tui.widgets.plots import LossPlot, MemoryPlot, RunPlot, StepTimePlot, UtilPlot
from ampscope.tui.widgets.ranks import RankStrip
from ampscope.tui.widgets.stat_cards import StatCards

if TYPE_CHECKING:
    from ampscope.tui.app import AmpscopeApp

SHORT_HEIGHT = 32  # rows below which the view packs tighter


class RunScreen(Screen):
    """Shows one RunState. Live runs can be stopped and restarted; replays are read-only."""

    BINDINGS = [
        Binding("s", "stop", "Stop"),
        Binding("r", "restart", "Restart"),
        Binding("escape", "back", "Back"),
        Binding("b", "back", "Back", show=False),
        Binding("q", "quit", "Quit"),
        # replays (priority: the focused event log would scroll on these keys)
        Binding("space", "pause", "Pause/play", priority=True),
        Binding("left", "seek(-1)", "-10%", priority=True),
        Binding("right", "seek(1)", "+10%", priority=True),
        Binding("home", "seek_to(0)", "Start", show=False, priority=True),
        Binding("end", "seek_to(1)", "End", show=False, priority=True),
    ]

    def __init__(self, state: RunState, refresh_hz: float = 4.0, source: Any = None) -> None:
        super().__init__()
        self.state = state
        self.source = source  # tui.follow.AttachSource or tui.replay.ReplaySource
        self.refresh_hz = refresh_hz
        self.redraws = 0
        self.displayed_step: int | None = None

    @property
    def ampscope(self) -> AmpscopeApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        with Vertical(id="run-top"):
            yield Static("", id="run-header")
            yield Static("", id="run-error")
        yield StatCards(id="cards")
        yield RankStrip(id="ranks")
        with Grid(id="plots"):
            yield StepTimePlot(id="plot-step")
            yield LossPlot(id="plot-loss")
            yield MemoryPlot(id="plot-mem")
            yield UtilPlot(id="plot-util")
        yield EventLog(id="event-log")
        yield Footer()

    def on_mount(self) -> None:
        if self.source is not None:
            self.source.start(self)
        self.refresh_view()
        # One redraw timer (2 Hz unless --refresh says otherwise), never a redraw per event:
        # rendering, plotext's above all, is what the UI spends its CPU on.
        self.set_interval(1.0 / self.refresh_hz, self.refresh_view, name="redraw")

    def on_resize(self, event: events.Resize) -> None:
        self.set_class(event.size.height < SHORT_HEIGHT, "-short")

    def show_state(self, state: RunState) -> None:
        self.state = state
        self.refresh_view()

    def refresh_view(self) -> None:
        self.refresh_text()
        self.redraw_plots()

    def refresh_text(self) -> None:
        if not self.is_attached:
            return
        state = self.state
        self.displayed_step = state.step
        header = state.header()
        if self.source is not None:
            header += " · " + self.source.label()
        self.query_one("#run-header", Static).update(header, layout=False)
        error = self.query_one("#run-error", Static)
        error.update(state.error or "")
        error.display = bool(state.error)
        self.query_one(StatCards).show(state.cards())
        self.query_one(RankStrip).show(state.ranks)
        self.query_one(EventLog).sync(state)

    def redraw_plots(self) -> None:
        if not self.is_attached:
            return
        for plot in self.query(RunPlot):
            plot.draw(self.state)
        self.redraws += 1

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        source = self.source
        if action in ("pause", "seek", "seek_to"):
            return source is not None and source.seekable  # False: not shown at all
        if getattr(self.app, "read_only", False) and action in ("stop", "restart"):
            return False  # a viewer: no engine controls
        if source is not None and action in ("stop", "restart"):
            return True if action == "stop" and source.can_stop else None
        if action in ("stop", "restart") and self.state.read_only:
            return None  # shown disabled: a replay has no engine
        if action == "stop" and self.state.finished:
            return None
        return True

    def on_screen_resume(self) -> None:
        self.refresh_bindings()

    async def action_stop(self) -> None:
        if self.source is not None:
            self.source.request_stop(self)
            self.refresh_view()
            return
        await self.ampscope.stop_run()
        self.refresh_view()

    async def action_restart(self) -> None:
        await self.ampscope.restart_run()

    def action_pause(self) -> None:
        self.source.toggle_pause()
        self.refresh_view()

    def action_seek(self, direction: int) -> None:
        from ampscope.tui.replay import SEEK_STEP

        self.source.seek_by(direction * SEEK_STEP)
        self.refresh_view()

    def action_seek_to(self, fraction: int) -> None:
        self.source.seek_fraction(float(fraction))
        self.refresh_view()

    def action_back(self) -> None:
        self.ampscope.pop_to_presets()

    async def action_quit(self) -> None:
        await self.ampscope.action_quit()
