"""Pick a preset, edit its main fields (validated as you type), run it or save it."""

from __future__ import annotations

import copy
import re
import typing
from pathlib import Path
from typing import Any

import msgspec
from rich.markup import escape
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, Footer, Input, Label, OptionList, Select, Static
from textual.widgets.option_list import Option

from ampscope.core import config as cfg
from ampscope.core.text import visible
from ampscope.tui.messages import EditedRunRequested, RunRequested, SweepRequested
from ampscope.tui.screens.history import HistoryScreen
from ampscope.tui.screens.run import LIVE_RUN_SCREEN
from ampscope.tui.text import literal

# (key in the preset, label, choices or None for a free input)
FIELDS: list[tuple[str, str, tuple[str, ...] | None]] = [
    ("precision", "precision", typing.get_args(cfg.Precision)),
    ("grad_scaler", "grad scaler", typing.get_args(cfg.ScalerMode)),
    ("compile", "compile", typing.get_args(cfg.CompileMode)),
    ("steps", "steps", None),
    ("batch_size", "batch size", None),
    ("lr", "lr", None),
    ("device", "device", None),
    ("workload.kind", "workload", typing.get_args(cfg.WorkloadKind)),
    ("workload.size", "size", typing.get_args(cfg.WorkloadSize)),
]
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def field_id(key: str) -> str:
    return "field-" + key.replace(".", "-").replace("_", "-")


def save_user_preset(preset: cfg.Preset, name: str) -> Path:
    """Write ``preset`` as the user preset ``name`` (it then lists as 'NAME  (user)')."""
    folder = cfg.user_presets_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.toml"
    path.write_text(cfg.to_toml(msgspec.structs.replace(preset, name=name)))
    return path


def parse_field(key: str, text: str) -> Any:
    text = text.strip()
    if key == "device":
        return text
    return cfg.parse_value(text)


class SaveDialog(ModalScreen[str | None]):
    """Ask for the name of a new user preset."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="save.cancel")]

    def __init__(self, suggestion: str) -> None:
        super().__init__()
        self.suggestion = suggestion

    def compose(self) -> ComposeResult:
        with Vertical(id="save-dialog"):
            yield Label(f"Save as a user preset in {cfg.user_presets_dir()}")
            yield Input(value=self.suggestion, placeholder="name", id="save-name")
            yield Label("", id="save-error", classes="error", markup=False)
            with Horizontal(id="save-buttons"):
                yield Button("Save", variant="primary", id="save-ok")
                yield Button("Cancel", id="save-cancel")

    @on(Input.Submitted, "#save-name")
    @on(Button.Pressed, "#save-ok")
    def _save(self) -> None:
        name = self.query_one("#save-name", Input).value.strip()
        if not NAME_PATTERN.match(name):
            self.query_one("#save-error", Label).update(
                "A name is letters, digits, '-', '_' or '.', starting with a letter or digit."
            )
            return
        self.dismiss(name)

    @on(Button.Pressed, "#save-cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)


class PresetsScreen(Screen):
    """The first screen. Runs are asked of the app (messages); ``read_only`` offers none."""

    BINDINGS = [
        Binding("enter", "run", "Run", show=False, id="presets.run-enter"),
        Binding("r", "run", "Run", id="presets.run"),
        Binding("s", "save", "Save as", id="presets.save"),
        Binding("m", "mark", "Mark for sweep", id="presets.mark"),
        Binding("w", "sweep", "Run sweep", id="presets.sweep"),
        Binding("h", "history", "History", id="presets.history"),
        Binding("f", "formats", "Formats", id="presets.formats"),
        Binding("p", "memory", "Memory plan", id="presets.memory"),
        Binding("v", "view_run", "Live run", id="presets.live-run"),
        # one of the two shows (check_action): the toggle names the current state
        Binding("d", "toggle_detach(True)", "Detached: off", id="presets.detach"),
        Binding("d", "toggle_detach(False)", "Detached: ON", id="presets.detach"),
        Binding("q", "app.quit", "Quit", id="quit"),
    ]

    def __init__(self, runs_dir: Path, read_only: bool = False) -> None:
        super().__init__()
        self.runs_dir = runs_dir
        self.read_only = read_only
        self.detach = False  # runs started from here outlive the dashboard
        self.presets: list[cfg.PresetInfo] = []
        self.current: cfg.PresetInfo | None = None
        self.base: dict[str, Any] = {}
        self.edited: dict[str, Any] = {}
        self.preset: cfg.Preset | None = None
        self.problem: str | None = None
        self.marked: list[str] = []

    def compose(self) -> ComposeResult:
        with Horizontal(id="presets-main"):
            yield OptionList(id="preset-list")
            with VerticalScroll(id="preset-form"):
                yield Static("", id="preset-description")
                for key, label, choices in FIELDS:
                    with Horizontal(classes="form-row"):
                        yield Label(label, classes="form-label")
                        if choices is None:
                            yield Input(id=field_id(key), compact=True, classes="form-input")
                        else:
                            yield Select(
                                [(c, c) for c in choices],
                                id=field_id(key),
                                allow_blank=False,
                                compact=True,
                                classes="form-input",
                            )
                yield Label("", id="preset-error", classes="error", markup=False)
                yield Static("", id="preset-status")
        yield Footer()

    def on_mount(self) -> None:
        self.reload()
        self.query_one("#preset-list", OptionList).focus()

    def on_screen_resume(self) -> None:
        self.refresh_bindings()

    def reload(self, select: str | None = None) -> None:
        self.presets = cfg.list_presets()
        options = self.query_one("#preset-list", OptionList)
        options.clear_options()
        options.add_options(
            [
                Option(
                    ("● " if p.name in self.marked else "  ")
                    + literal(p.name)
                    + ("  (user)" if p.source == "user" else ""),
                    id=p.name,
                )
                for p in self.presets
            ]
        )
        if not self.presets:
            self.query_one("#preset-error", Label).update(
                f"No presets found. Add .toml files to {cfg.user_presets_dir()}."
            )
            return
        names = [p.name for p in self.presets]
        index = names.index(select) if select in names else 0
        options.highlighted = index
        self.load(self.presets[index])

    @on(OptionList.OptionHighlighted, "#preset-list")
    def _highlighted(self, event: OptionList.OptionHighlighted) -> None:
        info = next((p for p in self.presets if p.name == event.option_id), None)
        if info is not None and info is not self.current:
            self.load(info)

    @on(OptionList.OptionSelected, "#preset-list")
    async def _selected(self, event: OptionList.OptionSelected) -> None:
        await self.action_run()

    def load(self, info: cfg.PresetInfo) -> None:
        self.current = info
        try:
            preset = cfg.load_preset(str(info.path))
        except cfg.ConfigError as exc:
            self.base, self.edited, self.preset = {}, {}, None
            self.show_problem(str(exc))
            return
        self.base = cfg.to_dict(preset)
        self.edited = copy.deepcopy(self.base)
        self.preset = preset
        self.query_one("#preset-description", Static).update(
            f"[b]{literal(info.name)}[/b]  [dim]{info.source}: {literal(info.path)}[/dim]\n"
            + escape(visible(preset.description, keep_newlines=True))
        )
        for key, _label, choices in FIELDS:
            value = cfg.get_dotted(self.base, key)
            widget = self.query_one("#" + field_id(key))
            if choices is None:
                assert isinstance(widget, Input)
                widget.value = "" if value is None else str(value)
            else:
                assert isinstance(widget, Select)
                widget.value = value
        self.show_problem(None)

    def form_values(self) -> dict[str, Any]:
        """The loaded preset with the form's fields applied (not yet validated)."""
        data = copy.deepcopy(self.base)
        for key, _label, choices in FIELDS:
            widget = self.query_one("#" + field_id(key))
            if choices is None:
                assert isinstance(widget, Input)
                cfg.set_dotted(data, key, parse_field(key, widget.value))
            else:
                assert isinstance(widget, Select)
                if widget.value is not Select.NULL:
                    cfg.set_dotted(data, key, widget.value)
        return data

    @on(Input.Changed)
    @on(Select.Changed)
    def _changed(self, event: Input.Changed | Select.Changed) -> None:
        if not self.base or event.control.id in (None, "save-name"):
            return
        self.revalidate()

    @on(Input.Submitted, ".form-input")
    async def _submitted(self, event: Input.Submitted) -> None:
        await self.action_run()

    def revalidate(self) -> bool:
        data = self.form_values()
        for key, _label, choices in FIELDS:
            if choices is None and str(cfg.get_dotted(data, key)).strip() == "":
                self.preset = None
                self.show_problem(f"'{key}' is empty.", key)
                return False
        try:
            self.preset = cfg.validate(data, source="edited preset")
        except cfg.ConfigError as exc:
            self.preset = None
            self.show_problem(str(exc), exc.key)
            return False
        self.edited = data
        self.show_problem(None)
        return True

    @property
    def is_edited(self) -> bool:
        return self.edited != self.base

    def show_problem(self, message: str | None, key: str | None = None) -> None:
        self.problem = message
        self.query_one("#preset-error", Label).update(message or "")
        for fkey, _label, _choices in FIELDS:
            self.query_one("#" + field_id(fkey)).set_class(fkey == key, "-invalid")
        status = "" if message else ("edited: runs as a temporary copy" if self.is_edited else "")
        self.query_one("#preset-status", Static).update(status)

    def action_formats(self) -> None:
        from ampscope.tui.screens.formats import (
            FormatsScreen,  # numpy and ml_dtypes: only when asked
        )

        self.app.push_screen(FormatsScreen())

    def action_memory(self) -> None:
        from ampscope.tui.screens.memory import MemoryScreen

        self.app.push_screen(MemoryScreen(self.current.name if self.current else None))

    def action_mark(self) -> None:
        """Add the highlighted preset to the sweep queue, or take it out."""
        if self.current is None:
            return
        name = self.current.name
        if name in self.marked:
            self.marked.remove(name)
        else:
            self.marked.append(name)
        options = self.query_one("#preset-list", OptionList)
        index = options.highlighted
        self.reload(select=name)
        if index is not None and index + 1 < options.option_count:
            options.highlighted = index + 1
        self.query_one("#preset-status", Static).update(
            f"sweep queue: {literal(', '.join(self.marked))}  (w runs it)" if self.marked else ""
        )

    async def action_sweep(self) -> None:
        if len(self.marked) < 2:
            self.app.notify("Mark two or more presets with m, then press w.", title="Sweep")
            return
        queue, self.marked = list(self.marked), []
        self.reload(select=self.current.name if self.current else None)
        self.post_message(SweepRequested(queue))

    async def action_run(self) -> None:
        if self.current is None:
            return
        if not self.base or not self.revalidate() or self.preset is None:
            self.app.notify(
                visible(self.problem or "This preset cannot run."),
                severity="error",
                title="Not valid",
                markup=False,
            )
            return
        if self.is_edited:
            self.post_message(EditedRunRequested(self.preset, detach=self.detach))
        else:
            self.post_message(RunRequested(self.current.name, detach=self.detach))

    def action_save(self) -> None:
        if self.preset is None or not self.revalidate():
            self.app.notify(
                visible(self.problem or "Nothing to save."), severity="error", markup=False
            )
            return
        preset = self.preset
        suggestion = (
            f"{preset.name}-custom"
            if self.current and self.current.source != "user"
            else preset.name
        )

        def saved(name: str | None) -> None:
            if not name:
                return
            try:
                if self.read_only:
                    raise OSError("this dashboard is read-only")
                path = save_user_preset(preset, name)
            except OSError as exc:
                self.app.notify(visible(f"Cannot save: {exc}"), severity="error", markup=False)
                return
            self.app.notify(visible(f"Saved {path}"), title="Preset saved", markup=False)
            self.reload(select=name)

        self.app.push_screen(SaveDialog(suggestion), saved)

    def action_history(self) -> None:
        self.app.push_screen(HistoryScreen(self.runs_dir))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "view_run":
            return self.app.is_screen_installed(LIVE_RUN_SCREEN)
        if action == "toggle_detach":
            return not self.read_only and parameters[0] != self.detach
        return True

    def action_toggle_detach(self, detach: bool) -> None:
        """Runs started while on outlive the dashboard ('ampscope attach' finds them)."""
        self.detach = detach
        self.refresh_bindings()

    def action_view_run(self) -> None:
        if self.app.is_screen_installed(LIVE_RUN_SCREEN):
            self.app.push_screen(LIVE_RUN_SCREEN)
