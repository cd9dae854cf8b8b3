"""Two screens that stand in the way on purpose: a question before a live run is stopped, and
a notice while the terminal is too small to draw the dashboard legibly."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, Static

from ampscope.core.text import visible
from ampscope.tui.screens import SCREENS_CSS
from ampscope.tui.widgets.key_bar import KeyBar

MIN_SIZE = (64, 20)
"""Columns and rows below which the dashboard shows ``TooSmallScreen`` instead."""


class ConfirmDialog(ModalScreen[bool]):
    """Yes or no; No has the focus, so an absent-minded Enter stops nothing."""

    CSS_PATH = SCREENS_CSS

    HELP_TITLE = "Confirm"
    BINDINGS = [
        Binding("y", "answer(True)", "Yes", id="confirm.yes"),
        Binding("n,escape", "answer(False)", "No", id="confirm.no"),
    ]

    def __init__(self, question: str, yes: str = "Yes", no: str = "No") -> None:
        super().__init__()
        self.question = question
        self.yes, self.no = yes, no

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-dialog"):
            yield Static(Text(visible(self.question, keep_newlines=True)), id="confirm-question")
            with Horizontal(id="confirm-buttons"):
                yield Button(f"{self.yes} (y)", variant="error", id="confirm-yes")
                yield Button(f"{self.no} (n)", id="confirm-no")
        yield KeyBar()

    def on_mount(self) -> None:
        self.query_one("#confirm-no", Button).focus()

    @on(Button.Pressed, "#confirm-yes")
    def _yes(self) -> None:
        self.dismiss(True)

    @on(Button.Pressed, "#confirm-no")
    def _no(self) -> None:
        self.dismiss(False)

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class TooSmallScreen(Screen):
    """Covers the dashboard while the terminal is under ``MIN_SIZE``; leaves when it grows."""

    CSS_PATH = SCREENS_CSS

    HELP_TITLE = "Terminal too small"
    BINDINGS = [Binding("q,ctrl+q", "app.quit", "Quit", id="too-small.quit")]

    def compose(self) -> ComposeResult:
        yield Static("", id="too-small")

    def on_mount(self) -> None:
        self.show_size()

    def on_resize(self) -> None:
        self.show_size()

    def show_size(self) -> None:
        width, height = self.app.size
        need_w, need_h = MIN_SIZE
        self.query_one("#too-small", Static).update(
            Text(
                f"terminal too small (need {need_w}x{need_h})\n"
                f"this one is {width}x{height}\n\n"
                "Enlarge the window, or use\n"
                "the headless commands:\n"
                "ampscope run, runs, stop.\n\n"
                "q quits."
            )
        )
