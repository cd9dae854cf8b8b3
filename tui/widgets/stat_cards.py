"""A grid of stat cards: title, big value, a line of detail."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Grid
from textual.widgets import Static

from ampscope.tui.figures import Card

CARD_KEYS = (
    "step_ms",
    "throughput",
    "tflops",
    "memory",
    "util",
    "loss",
    "loss_scale",
    "skipped",
    "grad_zeros",
    "elapsed",
)


class StatCard(Static):
    """One figure. Updated only when its text changes."""

    def __init__(self, key: str, **kwargs) -> None:
        super().__init__("", id=f"card-{key}", classes="stat-card", **kwargs)
        self.key = key
        self._shown: Card | None = None

    def show(self, card: Card) -> None:
        if card == self._shown:
            return
        self._shown = card
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(card.title + "\n", style="dim")
        text.append(card.value + "\n", style="bold")
        text.append(card.sub, style="dim")
        self.update(text, layout=False)  # fixed-size cells: no relayout per update

    @property
    def value(self) -> str:
        return self._shown.value if self._shown else ""

    @property
    def sub(self) -> str:
        return self._shown.sub if self._shown else ""


class StatCards(Grid):
    def compose(self) -> ComposeResult:
        for key in CARD_KEYS:
            yield StatCard(key)

    def show(self, cards: list[Card]) -> None:
        for card in cards:
            self.query_one(f"#card-{card.key}", StatCard).show(card)
