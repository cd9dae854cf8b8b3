"""A grid of stat cards: title, big value, a line of detail."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Grid
from textual.widgets import Static

from ampscope.tui.model.figures import Card

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
        self.compact = False  # two lines: the detail line is hidden (an 80x24 terminal)

    def show(self, card: Card) -> None:
        if card == self._shown:
            return
        self._shown = card
        title, value = card.short if self.compact and card.short else (card.title, card.value)
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(title + "\n", style="dim")
        text.append(value + "\n", style="bold")
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

    def set_compact(self, compact: bool) -> None:
        """Two-line cards (the detail line hidden): a card with more to say puts it beside
        its value."""
        for card in self.query(StatCard):
            if card.compact != compact:
                card.compact = compact
                shown, card._shown = card._shown, None
                if shown is not None:
                    card.show(shown)
