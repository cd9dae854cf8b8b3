"""What the Presets screen holds, apart from how it draws it: the preset loaded, the form's
edits, whether they validate and why not, and the sweep queue (presets marked with m, and how
many interleaved rounds w runs).

A speed verdict needs repeated runs (``ampscope.core.comparison.significance``: three at least), so a
marked sweep runs 3 interleaved rounds unless the user picks another count, as
``ampscope bench --repeats`` does. Textual-free.
"""

from __future__ import annotations

import copy
import typing
from collections.abc import Mapping
from typing import Any

from ampscope.core import presets
from ampscope.core.presets.toml_text import tomllib  # tomli before Python 3.11

# (key in the preset, label, choices or None for a free input)
FIELDS: list[tuple[str, str, tuple[str, ...] | None]] = [
    ("precision", "precision", typing.get_args(presets.Precision)),
    ("grad_scaler", "grad scaler", typing.get_args(presets.ScalerMode)),
    ("compile", "compile", typing.get_args(presets.CompileMode)),
    ("steps", "steps", None),
    ("batch_size", "batch size", None),
    ("lr", "lr", None),
    ("device", "device", None),
    ("workload.kind", "workload", typing.get_args(presets.WorkloadKind)),
    ("workload.size", "size", typing.get_args(presets.WorkloadSize)),
]

REPEAT_CHOICES = (3, 5, 1)
"""The rounds a sweep can run, the default first: 3 gives a verdict (the least
``ampscope.core.comparison.significance.MIN_REPEATS`` takes, which the comparison's records
would load before the first screen), 1 is quickest."""


def parse_field(key: str, text: str) -> Any:
    """A free field's text as the preset's value (``device`` stays text)."""
    text = text.strip()
    if key == "device":
        return text
    return presets.parse_value(text)


def next_repeats(repeats: int) -> int:
    i = REPEAT_CHOICES.index(repeats) if repeats in REPEAT_CHOICES else -1
    return REPEAT_CHOICES[(i + 1) % len(REPEAT_CHOICES)]


class PresetDraft:
    """The preset on the form: loaded, edited, validated; and the sweep queue beside it."""

    def __init__(self) -> None:
        self.info: presets.PresetInfo | None = None
        self.base: dict[str, Any] = {}  # the preset as loaded
        self.edited: dict[str, Any] = {}  # with the form's last valid edits
        self.preset: presets.Preset | None = None  # the edited preset, when it validates
        self.problem: str | None = None  # why it does not, in one paragraph
        self.problem_key: str | None = None  # the field at fault, when one is
        # the sweep queue, in order: preset name -> the form's edits when it was marked edited
        self.marked: dict[str, presets.Preset | None] = {}
        self.taken: dict[str, presets.Preset | None] = {}  # the marks of a sweep asked for
        self.changes: dict[str, str] = {}  # a marked edited preset's edits, as the queue says
        self.repeats = REPEAT_CHOICES[0]

    # ------------------------------------------------------------------ the form

    def load(self, info: presets.PresetInfo) -> presets.Preset | None:
        """Load ``info`` as the form's preset; None (and ``problem``) when it cannot be read."""
        self.info = info
        try:
            preset = presets.load_preset(str(info.path))
        except presets.ConfigError as exc:
            self.base, self.edited, self.preset = {}, {}, None
            self._refuse(str(exc))
            return None
        self.base = presets.to_dict(preset)
        self.edited = copy.deepcopy(self.base)
        self.preset = preset
        self._refuse(None)
        return preset

    def value(self, key: str) -> Any:
        """A field's value in the loaded preset."""
        return presets.get_dotted(self.base, key)

    def update(self, fields: Mapping[str, str | None]) -> bool:
        """Apply the form: free fields as typed, choices as picked (None: none picked).
        Validates the whole preset; False (and ``problem``) when it cannot run."""
        data = copy.deepcopy(self.base)
        for key, _label, choices in FIELDS:
            raw = fields.get(key)
            if choices is not None:
                if raw is not None:
                    presets.set_dotted(data, key, raw)
                continue
            if (raw or "").strip() == "":
                return self._refuse(f"'{key}' is empty.", key)
            try:
                presets.set_dotted(data, key, parse_field(key, raw or ""))
            except presets.ConfigError as exc:  # 5,000 pasted digits, say
                return self._refuse(f"'{key}': {exc.detail}", key)
        try:
            self.preset = presets.validate(data, source="edited preset")
        except presets.ConfigError as exc:
            return self._refuse(str(exc), exc.key)
        self.edited = data
        self._refuse(None)
        return True

    def _refuse(self, problem: str | None, key: str | None = None) -> bool:
        if problem is not None:
            self.preset = None
        self.problem, self.problem_key = problem, key
        return problem is None

    @property
    def loaded(self) -> bool:
        return bool(self.base)

    @property
    def is_edited(self) -> bool:
        return self.edited != self.base

    @property
    def save_suggestion(self) -> str:
        """The name Save as offers: a shipped preset's copy is NAME-custom."""
        name = self.preset.name if self.preset is not None else "preset"
        shipped = self.info is not None and self.info.source != "user"
        return f"{name}-custom" if shipped else name

    def status(self) -> str:
        """The line under the form: that the form is edited, else what the sweep queue holds."""
        if self.problem:
            return ""
        if self.is_edited:
            return "edited: runs as a temporary copy"
        if self.marked:
            queue = ", ".join(
                f"{n} ({self.changes.get(n) or 'edited'})" if e else n
                for n, e in self.marked.items()
            )
            rounds = (
                f"{self.repeats} runs each, interleaved"
                if self.repeats > 1
                else "1 run each, no verdict"
            )
            return f"sweep queue: {queue} · {rounds}  (w runs it, x repeats)"
        return ""

    # ------------------------------------------------------------------ the sweep queue

    def toggle_mark(self) -> bool:
        """Add the preset on the form, as edited, to the sweep queue, or take it out. False
        when an edited form that does not validate could not be marked."""
        if self.info is None:
            return True
        name = self.info.name
        if name in self.marked:
            del self.marked[name]
        elif not self.is_edited:
            self.marked[name] = None
        elif self.preset is not None:
            self.marked[name] = self.preset
            self.changes[name] = self.edits()
        else:
            return False
        return True

    def edits(self) -> str:
        """The form's fields that differ from the preset as loaded: 'steps 20000, lr 0.01'."""
        changed = [
            f"{label} {presets.get_dotted(self.edited, key)}"
            for key, label, _choices in FIELDS
            if presets.get_dotted(self.edited, key) != presets.get_dotted(self.base, key)
        ]
        return ", ".join(changed)

    def next_repeats(self) -> None:
        self.repeats = next_repeats(self.repeats)

    def take_sweep(self) -> list[str | presets.Preset] | None:
        """The queue w runs (an edited preset as its edits), emptied; None under two."""
        if len(self.marked) < 2:
            return None
        queue: list[str | presets.Preset] = [edit or name for name, edit in self.marked.items()]
        self.taken, self.marked = self.marked, {}
        return queue

    def untake_sweep(self) -> None:
        """The sweep did not start (the user kept the run it would stop): its marks come back."""
        self.marked, self.taken = self.taken, {}


def model_spec(overrides: list[str]) -> str | None:
    """The ``workload.model`` spec among the dashboard's ``--set`` overrides (``--model``)."""
    for override in overrides:
        key, _, value = override.partition("=")
        if key.strip() == "workload.model":
            try:
                return str(tomllib.loads(f"v = {value}")["v"])
            except (tomllib.TOMLDecodeError, KeyError):
                return value.strip().strip("\"'")
    return None
