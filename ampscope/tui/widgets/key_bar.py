"""The footer: the keys that work here, most important first, as many as fit.

Textual's footer lays every binding out in declaration order and lets the last ones fall off
the edge; at 80 columns that was help, quit and detach. Here each key has a rank
(``ampscope.tui.keys.PRIORITY``): the bar shows the best-ranked that fit, and ``?`` (which
lists the rest) is always among them. A key whose action is disabled is shown dimmed; one
that does nothing on this screen is not shown at all. While a text field has focus, the
letters go to the field: the bar then offers the keys that still work (esc, F1, ctrl+q).
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.screen import Screen
from textual.widget import Widget

from ampscope.tui.keys import DEFAULT_PRIORITY, priority

GAP = 2


@dataclass(frozen=True)
class KeyItem:
    key: str
    display: str
    description: str
    enabled: bool
    rank: int


def key_items(screen: Screen) -> list[KeyItem]:
    """What the screen's keys offer now, one item per description, best rank first."""
    items: dict[str, KeyItem] = {}
    order: dict[str, int] = {}
    for index, (key, active) in enumerate(screen.active_bindings.items()):
        binding: Binding = active.binding
        if not binding.show or not binding.description:
            continue
        name = binding.description
        if name in items and (items[name].enabled or not active.enabled):
            continue
        items[name] = KeyItem(
            key,
            screen.app.get_key_display(binding),
            name,
            bool(active.enabled),
            priority(binding.id),
        )
        order.setdefault(name, index)
    return sorted(items.values(), key=lambda item: (shown_rank(item), order[item.description]))


def shown_rank(item: KeyItem) -> int:
    """A dimmed key keeps its place only among the main few (a stop after the run ended);
    otherwise it gives way to every key that works now."""
    return item.rank if item.enabled or item.rank <= 1 else DEFAULT_PRIORITY + 1


def fit(items: list[KeyItem], width: int) -> list[KeyItem]:
    """The best-ranked items whose labels fit in ``width``, in rank order."""
    shown: list[KeyItem] = []
    used = 0
    for item in items:
        size = len(item.display) + 1 + len(item.description) + (GAP if shown else 0)
        if used + size > width:
            continue
        shown.append(item)
        used += size
    return shown


class KeyBar(Widget):
    """Docked at the bottom of each screen, in place of Textual's Footer."""

    DEFAULT_CSS = """
    KeyBar {
        dock: bottom;
        height: 1;
        background: $footer-background;
        color: $footer-description-foreground;
        padding: 0 1;
    }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.items: list[KeyItem] = []
        self.shown: list[KeyItem] = []
        self._spans: list[tuple[int, int, KeyItem]] = []

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._bindings_changed)
        self._bindings_changed(self.screen)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def _bindings_changed(self, screen: Screen) -> None:
        if self.is_attached and screen is self.screen:
            self.items = key_items(screen)
            self.refresh()

    def render(self) -> Text:
        width = max(0, self.content_region.width)
        self.shown = fit(self.items, width)
        key_style = self.app.theme_variables.get("footer-key-foreground", "")
        text = Text(no_wrap=True, overflow="crop")
        self._spans = []
        for i, item in enumerate(self.shown):
            if i:
                text.append(" " * GAP)
            start = len(text)
            dim = "" if item.enabled else " dim"
            text.append(item.display, style=f"bold {key_style}{dim}".strip())
            text.append(" " + item.description, style="dim" if not item.enabled else "")
            self._spans.append((start, len(text), item))
        return text

    def on_click(self, event: events.Click) -> None:
        x = event.x - self.styles.padding.left
        for start, end, item in self._spans:
            if start <= x < end:
                if item.enabled:
                    self.app.simulate_key(item.key)
                else:
                    self.app.bell()
                return

    @property
    def plain(self) -> str:
        """The bar as text (tests)."""
        return "  ".join(f"{item.display} {item.description}" for item in self.shown)
