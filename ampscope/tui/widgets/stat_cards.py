"""A grid of stat cards: title, big value, a line of detail."""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual.app import ComposeResult
from textual.containers import Grid
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

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
ELLIPSIS = "…"
DIM = Style(dim=True)
BOLD = Style(bold=True)


def fit(text: str, width: int) -> str:
    """``text`` in ``width`` cells, cut with an ellipsis when longer (one cell a character:
    figures, units and names)."""
    if len(text) <= width:
        return text
    return text[: max(0, width - 1)] + ELLIPSIS if width > 0 else ""


class StatCard(Widget):
    """One figure: its three lines (title, value, detail) drawn through the line API, and
    only the lines whose text changed sent again (the elapsed time moves every redraw, its
    title does not)."""

    DEFAULT_CSS = """
    StatCard {
        height: 3;
    }
    """

    def __init__(self, key: str, **kwargs) -> None:
        super().__init__(id=f"card-{key}", classes="stat-card", **kwargs)
        self.key = key
        self._shown: Card | None = None
        self._lines: list[tuple[str, Style]] = []  # what render_line draws
        self._strips: dict[int, Strip] = {}
        self._base: Style | None = None  # the card's own style, until another theme
        self.compact = False  # two lines: the detail line is hidden (an 80x24 terminal)

    def show(self, card: Card) -> None:
        if card == self._shown:
            return
        self._shown = card
        title, value = card.short if self.compact and card.short else (card.title, card.value)
        lines = [(title, DIM), (value, BOLD), (card.sub, DIM)]
        changed = [y for y, line in enumerate(lines) if line not in self._lines[y : y + 1]]
        self._lines = lines
        for y in changed:
            self._strips.pop(y, None)
        width = self.size.width
        if changed and width:
            self.refresh(*(Region(0, y, width, 1) for y in changed))

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if self._base is None:  # costly (it walks the ancestors): once a style, not a line
            self._base = self.rich_style
        strip = self._strips.get(y)
        if strip is None or strip.cell_length != width:
            base = self._base
            if y < len(self._lines):
                text, style = self._lines[y]
                strip = Strip([Segment(fit(text, width), base + style)])
                strip = strip.adjust_cell_length(width, base)
            else:
                strip = Strip.blank(width, base)
            self._strips[y] = strip
        return strip

    def notify_style_update(self) -> None:
        """Another theme: every line is drawn again in its style."""
        super().notify_style_update()
        self._strips.clear()
        self._base = None

    def on_resize(self) -> None:
        self._strips.clear()

    @property
    def text(self) -> str:
        """What the card shows, as plain text (tests, copy)."""
        height = self.size.height or len(self._lines)
        return "\n".join(fit(text, self.size.width) for text, _ in self._lines[:height])

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

    _by_key: dict[str, StatCard] | None = None

    def show(self, cards: list[Card]) -> None:
        if not self._by_key:  # once: a query every redraw costs more than the update
            self._by_key = {card.key: card for card in self.query(StatCard)}
        for card in cards:
            widget = self._by_key.get(card.key)
            if widget is not None:
                widget.show(card)

    def set_compact(self, compact: bool) -> None:
        """Two-line cards (the detail line hidden): a card with more to say puts it beside
        its value."""
        for card in self.query(StatCard):
            if card.compact != compact:
                card.compact = compact
                shown, card._shown = card._shown, None
                if shown is not None:
                    card.show(shown)
