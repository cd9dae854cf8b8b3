"""A tool screen (Formats, Memory): fields to type into above a table of what they give.

esc leaves a field first (to the table), then goes back; the footer says which it will do.
"""

from __future__ import annotations

from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Input

from ampscope.tui.screens import SCREENS_CSS

ESC_BINDINGS = [
    # one of the two shows (check_action)
    Binding("escape", "leave_field", "Done editing", id="form.leave"),
]


class ToolScreen(Screen):
    CSS_PATH = SCREENS_CSS

    FIELDS: tuple[type, ...] = (Input,)
    """The widgets a user types or picks in."""
    TABLE = "DataTable"
    """The table esc moves to from a field."""

    @property
    def editing(self) -> bool:
        return isinstance(self.focused, self.FIELDS)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "leave_field":
            return self.editing
        if action == "back":
            return not self.editing
        return True

    def on_descendant_focus(self) -> None:
        self.refresh_bindings()  # esc says what it will do: leave the field, or go back

    def action_leave_field(self) -> None:
        self.query_one(self.TABLE, DataTable).focus()

    def action_back(self) -> None:
        self.app.pop_screen()
