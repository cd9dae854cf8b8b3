"""Save the Presets screen's edited preset as a user preset, under a name the user gives."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import msgspec
from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label

from ampscope.core import presets
from ampscope.core.presets.toml_text import write_config_file
from ampscope.core.text import visible
from ampscope.tui.screens import SCREENS_CSS
from ampscope.tui.widgets.key_bar import KeyBar
from ampscope.tui.widgets.text_field import TextField

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def save_user_preset(preset: presets.Preset, name: str) -> Path:
    """Write ``preset`` as the user preset ``name`` (it then lists as 'NAME  (user)')."""
    folder = presets.user_presets_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.toml"
    write_config_file(path, presets.to_toml(msgspec.structs.replace(preset, name=name)))
    return path


def ask_and_save(
    app: App, preset: presets.Preset, suggestion: str, read_only: bool, saved: Callable[[str], None]
) -> None:
    """Ask for a name, save ``preset`` under it and say where (or why not); ``saved(name)``
    after it is written."""

    def named(name: str | None) -> None:
        if not name:
            return
        try:
            if read_only:
                raise OSError("this dashboard is read-only")
            path = save_user_preset(preset, name)
        except OSError as exc:
            app.notify(visible(f"Cannot save: {exc}"), severity="error", markup=False)
            return
        app.notify(visible(f"Saved {path}"), title="Preset saved", markup=False)
        saved(name)

    app.push_screen(SaveDialog(suggestion), named)


class SaveDialog(ModalScreen[str | None]):
    """Ask for the name of a new user preset."""

    CSS_PATH = SCREENS_CSS

    HELP_TITLE = "Save as a user preset"
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="save.cancel")]

    def __init__(self, suggestion: str) -> None:
        super().__init__()
        self.suggestion = suggestion
        self.replacing: str | None = None  # the name the user was told is taken

    def _taken(self, name: str) -> str | None:
        """What saving as ``name`` would replace, said before it does; None when nothing."""
        if (presets.user_presets_dir() / f"{name}.toml").is_file():
            return f"'{name}' is a user preset already: Save again to replace it."
        if (presets.shipped_presets_dir() / f"{name}.toml").is_file():
            return (
                f"'{name}' is a shipped preset: yours would be listed in its place. Save again "
                "to do so, or give another name."
            )
        return None

    def compose(self) -> ComposeResult:
        with Vertical(id="save-dialog"):
            yield Label(
                f"Save as a user preset in {visible(presets.user_presets_dir())}",
                id="save-where",
                markup=False,
            )
            yield TextField(value=self.suggestion, placeholder="name", id="save-name")
            yield Label("", id="save-error", classes="error", markup=False)
            with Horizontal(id="save-buttons"):
                yield Button("Save", variant="primary", id="save-ok")
                yield Button("Cancel", id="save-cancel")
        yield KeyBar()

    @on(Input.Submitted, "#save-name")
    @on(Button.Pressed, "#save-ok")
    def _save(self) -> None:
        name = self.query_one("#save-name", Input).value.strip()
        if not NAME_PATTERN.match(name):
            self.query_one("#save-error", Label).update(
                "A name is letters, digits, '-', '_' or '.', starting with a letter or digit."
            )
            return
        try:
            taken = None if name == self.replacing else self._taken(name)
        except OSError:  # a folder that cannot be looked into: saving says why
            taken = None
        if taken:
            self.replacing = name
            self.query_one("#save-error", Label).update(taken)
            return
        self.dismiss(name)

    @on(Button.Pressed, "#save-cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
