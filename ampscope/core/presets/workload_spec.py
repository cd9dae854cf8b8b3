"""A user's own model as a preset names it: the factory's spec, checked before any engine starts.

``workload.model = "path/to/my_model.py:make"`` (or ``"my_pkg.models:make"``) names a factory
that ampscope calls as ``make(ctx)``. It answers with an ``ampscope.Workload`` or a mapping of
the same fields (both types are in core/workload.py). Everything here is plain Python (no
torch): the spec is checked before any engine starts.
"""

from __future__ import annotations

import keyword
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

SPEC_FORMS = "FILE.py:FUNCTION or MODULE:FUNCTION (for example models/my_model.py:make or my_pkg.models:make)"
RETURN_FORMS = (
    "an ampscope.Workload or a mapping with 'model' (an nn.Module) and 'batches' (an iterable "
    "of (inputs, targets), a DataLoader, or a callable step -> (inputs, targets)), and "
    "optionally 'loss', 'flops_per_step', 'tokens_per_step', 'samples_per_step' and 'name'"
)


@dataclass(frozen=True)
class ModelSpec:
    """A parsed ``workload.model``: a file or an importable module, and the factory's name."""

    text: str
    source: Literal["file", "module"]
    target: str  # the file's path as written, or the dotted module name
    function: str  # a name, or a dotted path of attributes (``Models.small``)

    @property
    def path(self) -> Path:
        return Path(self.target).expanduser()


class SpecError(ValueError):
    """``workload.model`` cannot name a factory; the message names the spec and the forms."""


def _dotted_names(text: str) -> bool:
    parts = text.split(".")
    return all(p.isidentifier() and not keyword.iskeyword(p) for p in parts)


def parse_model_spec(text: str) -> ModelSpec:
    """Split ``FILE.py:FUNCTION`` or ``MODULE:FUNCTION``; SpecError says what is wrong."""
    target, sep, function = text.strip().rpartition(":")
    if not sep or not target or not function:
        raise SpecError(f"workload.model = '{text}' names no factory. Accepted: {SPEC_FORMS}.")
    if not _dotted_names(function):
        raise SpecError(
            f"workload.model = '{text}': '{function}' is not a Python function name. "
            f"Accepted: {SPEC_FORMS}."
        )
    if target.endswith(".py") or os.sep in target or "/" in target:
        if not target.endswith(".py"):
            raise SpecError(
                f"workload.model = '{text}': '{target}' is not a Python file (.py). "
                f"Accepted: {SPEC_FORMS}."
            )
        return ModelSpec(text, "file", target, function)
    if not _dotted_names(target):
        raise SpecError(
            f"workload.model = '{text}': '{target}' is neither a .py file nor a module name. "
            f"Accepted: {SPEC_FORMS}."
        )
    return ModelSpec(text, "module", target, function)


def record_name(preset_name: str, model: str | None) -> str:
    """A run folder's name after its timestamp: the preset, and for a user's model its file or
    module (and the factory when it is not ``make``), so runs of two models tell apart."""
    if not model:
        return preset_name
    try:
        spec = parse_model_spec(model)
    except SpecError:
        return preset_name
    where = spec.path.stem if spec.source == "file" else spec.target.rsplit(".", 1)[-1]
    factory = "" if spec.function == "make" else f"-{spec.function}"
    return f"{preset_name}-{where}{factory}"


def model_label(model: str | None, name: str | None = None) -> str | None:
    """What every screen calls a user's model: the factory's ``name`` (or its model's class)
    once the engine has built it, else ``FILE:FUNCTION`` (the file's name alone) or the spec
    as written: the same for a run that failed before it got a name. None: no user's model."""
    if not model:
        return None
    if name:
        return name
    try:
        spec = parse_model_spec(model)
    except SpecError:
        return model
    where = spec.path.name if spec.source == "file" else spec.target
    return f"{where}:{spec.function}"


def config_model(config: Any) -> str | None:
    """The ``workload.model`` spec of a run's (or a record's) configuration, if any."""
    workload = config.get("workload") if isinstance(config, dict) else None
    model = workload.get("model") if isinstance(workload, dict) else None
    return str(model) if model else None


def check_model_spec(text: str) -> ModelSpec:
    """Parse the spec and, for a file, check that it is there: what can be known without
    importing anything. The rest (the module, the function, what it returns) is the engine's."""
    spec = parse_model_spec(text)
    if spec.source == "file" and not spec.path.is_file():
        where = spec.path if spec.path.is_absolute() else Path.cwd() / spec.path
        if spec.path.is_dir():
            missing = "is a folder, not a file"
        elif spec.path.is_symlink():  # a loop, or a target gone: it is there, but leads nowhere
            missing = "is a link that leads to no file (a loop, or its target is gone)"
        elif spec.path.exists():  # a FIFO, a socket, a device: Python code is read from a file
            missing = "is not a regular file (a FIFO, a socket or a device)"
        else:
            missing = "does not exist"
        raise SpecError(
            f"workload.model = '{text}': the file {spec.target} {missing} (looked for {where}). "
            f"Accepted: {SPEC_FORMS}."
        )
    return spec


def model_override(text: str) -> str:
    """``--model SPEC`` as the ``--set`` it stands for, the spec quoted as a TOML string
    (a control character in a path too, which a plain quote left no TOML string)."""
    from ampscope.core.presets.toml_text import toml_value

    return f"workload.model={toml_value(text)}"
