"""A plan as data: what ``ampscope plan --json`` prints and the dashboard's plan screen reads.

Every field is documented in docs/plan.md, which is the contract; the structs below encode it
(``to_json``), so the command and the tests read one definition.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

VERSION = 1
FITS_BAND = 0.02  # a cast flushing more than this share of its non-zero values does not fit
BAND_SOURCE = (
    "BioNeMo's FP8 analyzer calls gradient underflow above 2 % critical, 0.5-2 % a warning"
)


class CastFigures(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One cast of one tensor: what it loses against the tensor it reads."""

    underflow: float  # share of the non-zero values the cast sends to zero
    rel_error: float  # RMS of the error over RMS of the tensor (finite results only)
    nonfinite: int  # inf/NaN values after the cast
    format: str = ""  # e4m3 | e5m2 | bf16 | fp16
    scaling: str = ""  # tensor | token | feature | out_feature | in_feature | none
    outlier_tokens: int | None = None  # rows whose largest value is 16x the typical row's
    overflow: float | None = None  # fp16: share beyond 65504
    amax: float | None = None  # fp16: the largest finite magnitude


class RecipeNumerics(msgspec.Struct, kw_only=True):
    casts: dict[str, CastFigures]
    fits: bool


class Gemm(msgspec.Struct, kw_only=True):
    M: int  # noqa: N815 - the GEMM's own letters
    K: int  # noqa: N815
    N: int  # noqa: N815


class DecidingCast(msgspec.Struct, kw_only=True):
    recipe: str
    cast: str
    underflow: float
    nonfinite: int


class LayerPlan(msgspec.Struct, kw_only=True):
    name: str
    kind: str
    gemm: Gemm | None
    calls: int
    predicted_speedup: float | None
    speedups: dict[str, float]
    speed_from: str | None  # measured | model
    numerics: dict[str, RecipeNumerics] | None
    decision: str  # fp8 | bf16 | fp16 | fp32
    recipe: str | None
    deciding_cast: DecidingCast | None
    reason: str


class Files(msgspec.Struct, kw_only=True):
    preset: str | None = None
    torchao: str | None = None
    torchtitan: str | None = None
    json: str | None = None


class Tokens(msgspec.Struct, kw_only=True):
    measured: int
    planned: int


class VerifyRow(msgspec.Struct, kw_only=True):
    name: str
    preset: str
    final_loss: float | None
    loss_gap: float | None
    skipped_steps: int
    step_ms: float | None
    status: str  # ok | failed | stopped | not run
    verdict: str


class ConstantUsed(msgspec.Struct, kw_only=True):
    name: str
    value: float
    unit: str
    source: str


class Plan(msgspec.Struct, kw_only=True):
    target: str  # fp8 | fp16
    gpu: str | None
    gpu_source: str | None
    speed_source: str | None  # measured | model
    recipe: str | None
    model: str | None
    tokens: Tokens | None
    layers: list[LayerPlan]
    files: Files = msgspec.field(default_factory=Files)
    verify: list[VerifyRow] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)
    constants: list[ConstantUsed] = msgspec.field(default_factory=list)
    preset_precision: str | None = None  # the precision of the preset written
    steps: int | None = None  # fp32 training steps observed (None: --gemm, nothing ran)
    version: int = VERSION

    @property
    def fp8_layers(self) -> list[LayerPlan]:
        return [layer for layer in self.layers if layer.decision == "fp8"]

    @property
    def fp32_layers(self) -> list[LayerPlan]:
        return [layer for layer in self.layers if layer.decision == "fp32"]

    def recipes(self) -> dict[str, list[str]]:
        """The fp8 layers by recipe, the recipe of most layers first."""
        by: dict[str, list[str]] = {}
        for layer in self.fp8_layers:
            by.setdefault(layer.recipe or "", []).append(layer.name)
        return dict(sorted(by.items(), key=lambda item: -len(item[1])))


def to_builtins(plan: Plan) -> dict[str, Any]:
    data = msgspec.to_builtins(plan)
    order = ["version", "target", "gpu", "gpu_source", "speed_source", "recipe", "model", "steps"]
    return {**{k: data[k] for k in order}, **{k: v for k, v in data.items() if k not in order}}


def to_json(plan: Plan) -> str:
    """The plan as the contract's JSON (docs/plan.md): finite numbers only."""
    return json.dumps(to_builtins(plan), indent=1, allow_nan=False)
