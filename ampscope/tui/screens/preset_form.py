"""The Presets screen's two halves: the list of presets, and the form with the highlighted
preset's main fields, one row each."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Input, Label, OptionList, Select, Static
from textual.widgets.option_list import Option

from ampscope.core.presets import Preset, PresetInfo
from ampscope.core.presets.workload_spec import model_label
from ampscope.core.text import visible
from ampscope.tui.model.preset_draft import FIELDS, model_spec
from ampscope.tui.text import literal
from ampscope.tui.widgets.drop_down import DropDown
from ampscope.tui.widgets.form_row import FormRow
from ampscope.tui.widgets.text_field import TextField


def field_id(key: str) -> str:
    return "field-" + key.replace(".", "-").replace("_", "-")


class PresetList(OptionList):
    """The presets by name, a user's marked as such and the sweep's marked with a dot."""

    def show(self, presets: list[PresetInfo], marked: Collection[str]) -> None:
        self.clear_options()
        self.add_options(
            [
                Option(
                    Text.assemble(
                        "\u25cf " if p.name in marked else "  ",
                        literal(p.name),
                        "  (user)" if p.source == "user" else "",
                    ),
                    id=p.name,
                )
                for p in presets
            ]
        )
        longest = max((len(visible(p.name)) for p in presets), default=10)
        self.styles.width = min(max(longest + 9, 20), 40)  # names whole, never wrapped


def _title(info: PresetInfo) -> Text:
    """The preset's name and where it comes from: 'fp32  (shipped)'."""
    where = "shipped" if info.source == "shipped" else f"{info.source}: {info.path}"
    return Text.assemble(literal(info.name, "bold"), "  ", literal(f"({where})", "dim"))


class PresetForm(VerticalScroll, can_focus=False):
    """The fields of the highlighted preset: tab goes from the list straight to a field (the
    form scrolls to the focused one; it takes no focus of its own, which nothing would show)."""

    def compose(self) -> ComposeResult:
        yield Static("", id="preset-description")
        # a --model dashboard: the model, in place of workload, in the fields' own columns
        # (made only there: the dashboard's --model is set when it starts, and other
        # dashboards draw their first screen without it, benchmarks/first_paint.py)
        if model_spec(getattr(self.app, "extra_overrides", [])) is not None:
            with Horizontal(classes="form-row", id="preset-model-row"):
                yield Label("model", classes="form-label")
                yield Static("", id="preset-model")
        for key, label, choices in FIELDS:
            with FormRow(label):
                if choices is None:
                    yield TextField(id=field_id(key), compact=True, classes="form-input")
                else:
                    yield DropDown(
                        [(c, c) for c in choices],
                        id=field_id(key),
                        allow_blank=False,
                        compact=True,
                        classes="form-input",
                    )
        # a Static, not a Label: a Label is as wide as its text, and a long message was cut
        yield Static("", id="preset-error", classes="error", markup=False)
        yield Static("", id="preset-status")

    def show(
        self,
        info: PresetInfo,
        preset: Preset,
        model: str | None,
        value: Callable[[str], Any],
    ) -> None:
        """The preset: its name, where it comes from, its description and every field from
        ``value(key)``. With ``model`` (a --model dashboard) the workload and size fields do
        not apply: the model's row says what trains instead."""
        self.query_one("#preset-description", Static).update(
            Text.assemble(_title(info), "\n", literal(preset.description, keep_newlines=True))
        )
        if model is not None:
            self.query_one("#preset-model", Static).update(literal(model_label(model) or model))
        self._show_fields(
            lambda key: model is None or key not in ("workload.kind", "workload.size")
        )
        for key, _label, choices in FIELDS:
            widget = self.query_one("#" + field_id(key))
            if choices is None:
                assert isinstance(widget, Input)
                widget.value = "" if value(key) is None else str(value(key))
            else:
                assert isinstance(widget, Select)
                widget.value = value(key)

    def show_unreadable(self, info: PresetInfo) -> None:
        """A preset that cannot be loaded: its name and where it is, no fields (the last
        preset's would read as this one's); the error line under them says why."""
        self.query_one("#preset-description", Static).update(_title(info))
        self._show_fields(lambda key: False)

    def _show_fields(self, shown: Callable[[str], bool]) -> None:
        for key, _label, _choices in FIELDS:
            row = self.query_one("#" + field_id(key)).parent
            if row is not None:
                row.display = shown(key)

    def values(self) -> dict[str, str | None]:
        """What the fields hold: free fields as typed, choices as picked (None: no pick)."""
        out: dict[str, str | None] = {}
        for key, _label, choices in FIELDS:
            widget = self.query_one("#" + field_id(key))
            if choices is None:
                assert isinstance(widget, Input)
                out[key] = widget.value
            else:
                assert isinstance(widget, Select)
                out[key] = None if widget.value is Select.NULL else str(widget.value)
        return out

    def show_state(self, problem: str | None, key: str | None, status: str) -> None:
        """Why the form cannot run, with the field at fault (if one is) drawn invalid, and
        the status line under it."""
        self.query_one("#preset-error", Static).update(visible(problem or "", keep_newlines=True))
        for fkey, _label, _choices in FIELDS:
            self.query_one("#" + field_id(fkey)).set_class(fkey == key, "-invalid")
        self.query_one("#preset-status", Static).update(literal(status))
