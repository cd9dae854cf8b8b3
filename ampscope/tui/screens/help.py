"""``?`` (or F1) on any screen: what the screen is for, and every key it has, working or not.

A key that does nothing here is listed with the reason (a replay has no engine to stop), so
that the footer can leave it out without hiding it. Binding ids are listed for ``keys.toml``.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingsMap
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

from ampscope.core.text import visible
from ampscope.tui.keys import keys_path
from ampscope.tui.screens import SCREENS_CSS
from ampscope.tui.widgets.key_bar import KeyBar

EVERYWHERE = (
    "Everywhere: ? or F1 this help · ctrl+p the command palette (every screen, every preset, "
    "the theme) · tab and shift+tab move the focus (the focused part is outlined) · esc "
    "leaves a field, then goes back · ctrl+q quits, even while typing in a field."
)


def screen_bindings(screen: Screen) -> list[tuple[Binding, object]]:
    """The screen's and the app's bindings as the keymap made them, with their namespace."""
    out: list[tuple[Binding, object]] = []
    for node in (screen, screen.app):
        bindings: BindingsMap = node._bindings.copy()
        if screen.app._keymap:
            bindings.apply_keymap(screen.app._keymap)
        for _key, binding in bindings:
            out.append((binding, node))
    return out


def key_rows(screen: Screen) -> list[tuple[str, str, str, str]]:
    """(keys, what they do, a note when they do nothing now, binding ids), one row per action.

    Textual's own bindings without an id (tab, copy) are left to the line under the table.
    """
    groups: dict[tuple[str, str], tuple[list[str], list[str], Binding, object]] = {}
    for binding, node in screen_bindings(screen):
        if not binding.description or not binding.id or binding.system:
            continue
        keys, ids, _first, _node = groups.setdefault(
            (binding.action, binding.description), ([], [], binding, node)
        )
        display = screen.app.get_key_display(binding)
        if display not in keys:
            keys.append(display)
        if binding.id not in ids:
            ids.append(binding.id)
    rows = [  # a binding's tooltip is its longer description, where the footer's is too short
        (
            ", ".join(keys),
            binding.tooltip or binding.description,
            _note(screen, binding, node),
            ", ".join(ids),
        )
        for keys, ids, binding, node in groups.values()
    ]
    return _one_row_per_id(rows)


def _one_row_per_id(rows: list[tuple[str, str, str, str]]) -> list[tuple[str, str, str, str]]:
    """A key with two faces (the detach toggle names its state) is listed once: as the face
    that works now, else as its first."""
    working = {ids for _keys, _what, note, ids in rows if not note}
    kept: list[tuple[str, str, str, str]] = []
    seen: set[str] = set()
    for row in rows:
        ids, note = row[3], row[2]
        if note and (ids in working or ids in seen):
            continue
        seen.add(ids)
        kept.append(row)
    return kept


def key_reason(screen: Screen, action: str) -> str:
    """Why ``action`` does nothing on ``screen`` now, as the screen says (``key_note``)."""
    return getattr(screen, "key_note", lambda _action: "")(action)


def _note(screen: Screen, binding: Binding, node: object) -> str:
    action, _, params = binding.action.partition("(")
    if "." in action:  # app.quit and the like: always there
        return ""
    state = screen.app._check_action_state(binding.action, node)  # type: ignore[arg-type]
    if state is True:
        return ""
    why = key_reason(screen, action)
    if state is None:
        return f"unavailable now: {why}" if why else "unavailable now"
    return f"not here: {why}" if why else "not here"


class HelpScreen(ModalScreen[None]):
    """The keys of the screen below, in a box that scrolls (80x24 shows a part of it)."""

    CSS_PATH = SCREENS_CSS

    BINDINGS = [
        Binding("escape,question_mark,f1,q", "close", "Close", id="help.close"),
    ]

    def __init__(self, target: Screen) -> None:
        super().__init__()
        self.target = target
        self.rows = key_rows(target)

    def compose(self) -> ComposeResult:
        title = getattr(self.target, "HELP_TITLE", type(self.target).__name__)
        about = getattr(self.target, "HELP", "")
        table = Table(box=None, pad_edge=False, expand=True, show_header=True)
        table.add_column("keys", style="bold", no_wrap=True)
        table.add_column("does", ratio=1)
        table.add_column("id (keys.toml)", style="dim", no_wrap=True)
        for keys, does, note, name in self.rows:
            what = Text(does)
            if note:
                what.append(f" ({note})", style="dim italic")
            table.add_row(Text(keys), what, Text(name))
        with VerticalScroll(id="help-box"):
            yield Static(Text(f"Keys · {title}", style="bold"), id="help-title")
            if about:
                yield Static(Text(about), id="help-about")
            yield Static(table, id="help-keys")
            yield Static(Text(EVERYWHERE), classes="help-note")
            yield Static(
                Text(
                    f"Your own keys: {visible(str(keys_path()))}, one line per binding id, such as "
                    '"run.stop" = "x" (then restart ampscope).'
                ),
                classes="help-note",
            )
        yield KeyBar()

    def on_mount(self) -> None:
        self.query_one("#help-box").focus()

    def action_close(self) -> None:
        self.dismiss(None)
