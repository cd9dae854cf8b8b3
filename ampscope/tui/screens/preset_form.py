"""The Presets screen's form: the highlighted preset's main fields, one row each."""

from __future__ import annotations

import typing
from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Input, Label, Select, Static

from ampscope.core import config as cfg

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


def field_id(key: str) -> str:
    return "field-" + key.replace(".", "-").replace("_", "-")


def parse_field(key: str, text: str) -> Any:
    text = text.strip()
    if key == "device":
        return text
    return cfg.parse_value(text)


class PresetForm(VerticalScroll, can_focus=False):
    """The fields of the highlighted preset: tab goes from the list straight to a field (the
    form scrolls to the focused one; it takes no focus of its own, which nothing would show)."""

    def compose(self) -> ComposeResult:
        yield Static("", id="preset-description")
        yield Static("", id="preset-model")  # a --model dashboard: the model, for workload
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
