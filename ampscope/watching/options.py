"""What ``ampscope.watch()`` accepts, checked before anything is recorded.

``Options`` is the one list of the options, their defaults and what each accepts;
``WatchOptions`` (and ``RecordOptions``, what the Lightning and Hugging Face callbacks take:
the rest they read from the trainer) are its keyword types, for type checkers, held to the
same names by a test. Torch-free, so a bad argument is reported the same way whether or not torch is loaded. A bad
argument raises ``ValueError`` at the ``watch()`` call, before the first step: it is the
caller's to fix. Everything after that never raises into the training loop.
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from ampscope.core.presets import Precision
from ampscope.core.text import value_text
from ampscope.core.workload import MAX_FLOPS_PER_STEP

PRECISIONS: tuple[str, ...] = typing.get_args(Precision)
MIN_HZ, MAX_HZ = 0.25, 10.0


class RecordOptions(TypedDict, total=False):
    """The options of a watched run that a trainer cannot tell (see ``Options``)."""

    name: str | None
    runs_dir: str | Path | None
    allow_stop: bool
    flops_per_step: float | None
    count_flops: bool
    peak_tflops: float | None
    grad_zero_every: int
    numerics_every: int
    warmup_steps: int
    telemetry_hz: float


class WatchOptions(RecordOptions, total=False):
    """Every option of ``ampscope.watch()`` (see ``Options``)."""

    precision: str | None
    steps: int | None
    grad_norm: bool


@dataclass(frozen=True)
class Options:
    """Everything about a watched run that is not one of the user's objects."""

    name: str | None = None
    runs_dir: str | Path | None = None  # a Path once checked
    allow_stop: bool = False
    precision: str | None = None
    steps: int | None = None
    flops_per_step: float | None = None
    count_flops: bool = False
    peak_tflops: float | None = None
    grad_norm: bool = False
    grad_zero_every: int = 0
    numerics_every: int = 0
    warmup_steps: int = 5
    telemetry_hz: float = 2.0

    @classmethod
    def of(cls, given: WatchOptions) -> Options:
        """The options ``watch()`` was given; a name it does not know is a TypeError naming
        the ones it knows, as Python's own would be."""
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise TypeError(
                f"ampscope.watch() got an unexpected option {unknown[0]!r}. "
                f"Accepted: scaler and {', '.join(known)}."
            )
        return cls(**given)

    def __post_init__(self) -> None:
        _check(
            self.runs_dir is None or isinstance(self.runs_dir, (str, os.PathLike)),
            "runs_dir",
            self.runs_dir,
            "a folder (a str or a Path), or None for $AMPSCOPE_RUNS_DIR or ./runs",
        )
        if self.runs_dir is not None:  # '' or '  ' (an unset variable's value) is the default
            blank = isinstance(self.runs_dir, str) and not self.runs_dir.strip()
            object.__setattr__(self, "runs_dir", None if blank else Path(self.runs_dir))
        _check(
            self.precision is None or self.precision in PRECISIONS,
            "precision",
            self.precision,
            "one of " + ", ".join(repr(p) for p in PRECISIONS) + ", or None to infer it",
        )
        _check(
            self.steps is None or (_is_int(self.steps) and self.steps >= 1),
            "steps",
            self.steps,
            "a whole number of optimizer steps from 1 to 2**63 - 1, or None when unknown",
        )
        _check(
            self.flops_per_step is None
            or (_positive(self.flops_per_step) and self.flops_per_step <= MAX_FLOPS_PER_STEP),
            "flops_per_step",
            self.flops_per_step,
            "a positive number of floating-point operations per optimizer step, at most "
            f"{MAX_FLOPS_PER_STEP:.0e}, or None",
        )
        _check(
            self.peak_tflops is None or _positive(self.peak_tflops),
            "peak_tflops",
            self.peak_tflops,
            "the device's positive peak TFLOP/s (for MFU), or None",
        )
        _check(
            _is_int(self.grad_zero_every) and self.grad_zero_every >= 0,
            "grad_zero_every",
            self.grad_zero_every,
            "0 (off) or measure every N steps, N a whole number below 2**63",
        )
        _check(
            _is_int(self.numerics_every) and self.numerics_every >= 0,
            "numerics_every",
            self.numerics_every,
            "0 (off) or measure every leaf module every N steps, N a whole number below 2**63",
        )
        _check(
            _is_int(self.warmup_steps) and self.warmup_steps >= 0,
            "warmup_steps",
            self.warmup_steps,
            "a whole number of first steps left out of the summary, from 0 to 2**63 - 1",
        )
        _check(
            _is_number(self.telemetry_hz) and MIN_HZ <= self.telemetry_hz <= MAX_HZ,
            "telemetry_hz",
            self.telemetry_hz,
            f"{MIN_HZ:g} to {MAX_HZ:g} samples a second",
        )
        _check(
            self.name is None or isinstance(self.name, str),
            "name",
            self.name,
            "a string that names the run, or None for the script's name",
        )
        for flag in ("allow_stop", "count_flops", "grad_norm"):
            value = getattr(self, flag)
            _check(isinstance(value, bool), flag, value, "True or False")


def check_objects(model: object, optimizer: object, scaler: object) -> None:
    """``watch(model, optimizer, scaler=)``: each what it says, or a ValueError naming the
    argument (duck-typed, torch-free: an optimizer has ``param_groups``, a scaler ``update``).
    ``watch(model, model.parameters())`` is the usual slip: the parameters, not an optimizer."""
    if not callable(getattr(model, "parameters", None)) or not callable(model):
        _refuse("model", model, "the torch.nn.Module that trains")
    groups = getattr(optimizer, "param_groups", None)
    if optimizer is not None and not (isinstance(groups, list) and callable(optimizer.step)):  # type: ignore[attr-defined]
        hint = ""
        if callable(getattr(optimizer, "unscale_", None)):
            hint = " (this is a GradScaler: pass it as scaler=)"
        elif hasattr(optimizer, "__next__") or isinstance(optimizer, (list, tuple)):
            hint = " (the model's parameters, it seems: pass the optimizer built from them)"
        _refuse("optimizer", optimizer, "a torch.optim.Optimizer, or None" + hint)
    if scaler is not None and not (
        callable(getattr(scaler, "update", None)) and callable(getattr(scaler, "get_scale", None))
    ):
        _refuse("scaler", scaler, "a torch.amp.GradScaler, or None")


def _refuse(name: str, value: object, accepted: str) -> None:
    shown = _shown(value) if isinstance(value, (str, int, float)) else type(value).__name__
    raise ValueError(f"ampscope.watch(): {name}={shown} is not accepted. Accepted: {accepted}.")


def _check(ok: bool, name: str, value: object, accepted: str) -> None:
    if not ok:
        raise ValueError(
            f"ampscope.watch(): {name}={_shown(value)} is not accepted. Accepted: {accepted}."
        )


def _is_int(value: object) -> bool:
    """A whole number a record holds: below 2**63, as every int64 reader of JSON takes it."""
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) < value < 2**63


def _is_number(value: object) -> bool:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int past float's range (10**400) is no figure
        return False


def _positive(value: object) -> bool:
    return _is_number(value) and value > 0  # type: ignore[operator]


def _shown(value: object) -> str:
    return value_text(value, 60)  # a 100,000-character name would fill the screen
