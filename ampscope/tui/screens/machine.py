"""The Machine view: what ``ampscope doctor --bench`` measured here, per number format."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

from ampscope.core.machine import check
from ampscope.tui.model.machine_view import view_lines
from ampscope.tui.screens import SCREENS_CSS
from ampscope.tui.widgets.key_bar import KeyBar


class MachineScreen(Screen):
    CSS_PATH = SCREENS_CSS
    HELP_TITLE = "Machine check"
    HELP = (
        "What this machine's GPU (or CPU) delivered per number format when 'ampscope doctor "
        "--bench' last ran here: each bar is the measured matmul rate, its full length the "
        "datasheet's; then memory bandwidth and the verdicts, each with its reason. Each figure "
        "is the best of several rounds; 'busy' marks one whose rounds disagreed, which runs are "
        "not read against. The dashboard only reads the kept results: run the command in a "
        "terminal to measure again."
    )
    BINDINGS = [
        Binding("escape", "back", "Back", id="machine.back"),
        Binding("q", "app.quit", "Quit", id="quit"),
    ]
    DEFAULT_CSS = """
    MachineScreen #machine-body { height: 1fr; padding: 0 1; }
    """

    def __init__(
        self,
        checks: dict[str, check.MachineCheck] | None = None,
        now: tuple[str | None, str | None] | None = None,
    ) -> None:
        """``checks`` and ``now`` (torch, driver): given by tests; read from disk otherwise."""
        super().__init__()
        self.given = checks
        self.now = now

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="machine-scroll"):
            yield Static("", id="machine-body")
        yield KeyBar()

    def on_mount(self) -> None:
        self.show()

    def on_resize(self) -> None:
        self.show()

    def show(self) -> None:
        if self.given is not None:
            checks, problem = self.given, None
        else:
            checks, problem = check.load_all()
        torch, driver = (
            self.now if self.now is not None else (check.installed_torch(), check.nvidia_driver())
        )
        width = max(20, self.size.width - 3)
        lines = view_lines(checks, problem, width, torch, driver)
        self.query_one("#machine-body", Static).update(
            Text("\n".join(lines))
        )  # each line made visible

    def action_back(self) -> None:
        self.app.pop_screen()
