"""Pick a preset, edit its main fields (validated as you type), run it or save it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Input, Label, OptionList, Select, Static
from textual.widgets.option_list import Option

from ampscope.core import config as cfg
from ampscope.core.text import visible
from ampscope.core.workload_spec import model_label
from ampscope.tui.messages import EditedRunRequested, RunRequested
from ampscope.tui.screens.history import HistoryScreen
from ampscope.tui.screens.preset_form import FIELDS, PresetForm, field_id, parse_field
from ampscope.tui.screens.presets_sweep import SWEEP_BINDINGS, SweepScreen, queue_status
from ampscope.tui.screens.run import LIVE_RUN_SCREEN
from ampscope.tui.screens.save import SaveDialog, save_user_preset
from ampscope.tui.text import literal
from ampscope.tui.widgets.key_bar import KeyBar


class PresetsScreen(SweepScreen):
    """The first screen. Runs are asked of the app (messages); ``read_only`` offers none."""

    HELP_TITLE = "Presets"
    HELP = (
        "A preset is a training run: a precision (fp32, tf32, bf16, fp16, AMP with or without "
        "loss scaling), a torch.compile mode and a workload. Pick one on the left; its fields on "
        "the right can be edited (a value that cannot run is refused with the reason). Run it "
        "and the Run view opens. Up and down move in the list, tab and shift+tab between the "
        "list and the fields, esc leaves a field."
    )
    BINDINGS = [
        Binding("r", "run", "Run", id="presets.run"),
        # shown only while a field has the letters (the bar shows one key per action)
        Binding("enter", "run", "Run", id="presets.run-enter"),
        Binding("escape", "leave_field", "Done editing", id="form.leave"),
        Binding("s", "save", "Save as", id="presets.save"),
        *SWEEP_BINDINGS,
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
        self.base: dict[str, Any] = {}
        self.edited: dict[str, Any] = {}
        self.problem: str | None = None

    def compose(self) -> ComposeResult:
        with Horizontal(id="presets-main"):
            yield OptionList(id="preset-list")
            yield PresetForm(id="preset-form")
        yield KeyBar()

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        """The focused field's row lights its label too (the name says which field it is)."""
        for row in self.query(".form-row"):
            row.set_class(event.widget in row.children, "-focused")
        self.refresh_bindings()  # esc 'Done editing' comes and goes with a field's focus

    def on_mount(self) -> None:
        self.reload()
        self.query_one("#preset-list", OptionList).focus()

    def on_screen_resume(self) -> None:
        """Back from another screen, the list has the keys (never a field: 'h' is no text)."""
        self.query_one("#preset-list", OptionList).focus()
        self.refresh_bindings()

    @property
    def editing(self) -> bool:
        focused = self.focused
        return focused is not None and focused.has_class("form-input")

    def action_leave_field(self) -> None:
        self.query_one("#preset-list", OptionList).focus()

    def reload(self, select: str | None = None) -> None:
        self.presets = cfg.list_presets()
        options = self.query_one("#preset-list", OptionList)
        options.clear_options()
        options.add_options(
            [
                Option(
                    Text.assemble(
                        "● " if p.name in self.marked else "  ",
                        literal(p.name),
                        "  (user)" if p.source == "user" else "",
                    ),
                    id=p.name,
                )
                for p in self.presets
            ]
        )
        longest = max((len(visible(p.name)) for p in self.presets), default=10)
        options.styles.width = min(max(longest + 9, 20), 40)  # names whole, never wrapped
        if not self.presets:
            self.query_one("#preset-error", Label).update(
                f"No presets found. Add .toml files to {visible(cfg.user_presets_dir())}."
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
        where = "shipped" if info.source == "shipped" else f"{info.source}: {info.path}"
        self.query_one("#preset-description", Static).update(
            Text.assemble(
                literal(info.name, "bold"),
                "  ",
                literal(f"({where})", "dim"),
                "\n",
                literal(preset.description, keep_newlines=True),
            )
        )
        self.show_model()
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

    def show_model(self) -> None:
        """With ``--model`` the workload and size fields do not apply: the model's row says
        what trains instead."""
        from ampscope.tui.screens.memory import model_spec

        spec = model_spec(getattr(getattr(self.app, "session", None), "extra_overrides", []))
        row = self.query_one("#preset-model", Static)
        row.display = spec is not None
        if spec is not None:
            row.update(Text.assemble(("model      ", "bold"), literal(model_label(spec) or spec)))
        for key in ("workload.kind", "workload.size"):
            parent = self.query_one("#" + field_id(key)).parent
            if parent is not None:
                parent.display = spec is None

    def form_values(self) -> dict[str, Any]:
        """The loaded preset with the form's fields applied (not yet validated).

        Raises ConfigError (with the field's key) for a value that cannot even be read:
        5,000 pasted digits, say.
        """
        data = copy.deepcopy(self.base)
        for key, _label, choices in FIELDS:
            widget = self.query_one("#" + field_id(key))
            if choices is None:
                assert isinstance(widget, Input)
                try:
                    value = parse_field(key, widget.value)
                except cfg.ConfigError as exc:
                    raise cfg.ConfigError(f"'{key}': {exc.detail}", key=key) from None
                cfg.set_dotted(data, key, value)
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
        try:
            data = self.form_values()
        except cfg.ConfigError as exc:
            self.preset = None
            self.show_problem(str(exc), exc.key)
            return False
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
        self.query_one("#preset-error", Label).update(visible(message or "", keep_newlines=True))
        for fkey, _label, _choices in FIELDS:
            self.query_one("#" + field_id(fkey)).set_class(fkey == key, "-invalid")
        self.show_status()

    def show_status(self) -> None:
        """Under the form: that the form is edited, else what the sweep queue holds."""
        if self.problem:
            status = ""
        elif self.is_edited:
            status = "edited: runs as a temporary copy"
        elif self.marked:
            status = queue_status(self.marked, self.repeats)
        else:
            status = ""
        self.query_one("#preset-status", Static).update(literal(status))

    def action_formats(self) -> None:
        from ampscope.tui.screens.formats import (
            FormatsScreen,  # numpy and ml_dtypes: only when asked
        )

        self.app.push_screen(FormatsScreen())

    def action_memory(self) -> None:
        from ampscope.tui.screens.memory import MemoryScreen

        self.app.push_screen(MemoryScreen(self.current.name if self.current else None))

    def runnable(self, title: str) -> bool:
        """The form, validated again; when it cannot run, say why under ``title``."""
        if self.base and self.revalidate() and self.preset is not None:
            return True
        self.app.notify(
            visible(self.problem or "This preset cannot run."),
            severity="error",
            title=title,
            markup=False,
        )
        return False

    async def action_run(self) -> None:
        if self.current is None:
            return
        if not self.runnable("Not valid"):
            return
        if self.is_edited and self.preset is not None:
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
        if action == "leave_field":
            return self.editing
        if action == "sweep":
            return True if len(self.marked) >= 2 else None
        if action == "repeats":
            return self.repeats_shown(int(str(parameters[0])))
        return True

    def key_note(self, action: str) -> str:
        return {
            "view_run": "no run has been watched yet",
            "leave_field": "no field has the focus",
            "sweep": "mark two or more presets with m first",
            "repeats": "mark presets with m first",
            "toggle_detach": "this dashboard is read-only",
        }.get(action, "")

    def action_toggle_detach(self, detach: bool) -> None:
        """Runs started while on outlive the dashboard ('ampscope attach' finds them)."""
        self.detach = detach
        self.refresh_bindings()

    def action_view_run(self) -> None:
        if self.app.is_screen_installed(LIVE_RUN_SCREEN):
            self.app.push_screen(LIVE_RUN_SCREEN)
