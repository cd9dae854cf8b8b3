"""The fp8 decision per layer: which recipe, if any, and why, in a sentence.

A layer trains in fp8 in the recipe that is predicted fastest among those that fit it
(``RecipeNumerics.fits``: no cast flushes more than 2 % of its non-zero values to zero, none
is inf/NaN) and faster than bf16 (a predicted speed-up above 1.00); else it stays in bf16,
and the reason names what ruled fp8 out: the cast that flushes (``deciding_cast``) or the
speed-up at the M that ran. ``--recipe`` narrows the recipes considered; the numerics of every
recipe are figured all the same, so a reason can say that another recipe would hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ampscope.core.plan.report import (
    FITS_BAND,
    CastFigures,
    DecidingCast,
    Gemm,
    LayerPlan,
    RecipeNumerics,
)
from ampscope.core.plan.speed import RECIPES, GemmTimes, Machine, Shape, predict

CAST_WORDS = {
    "input": "the input",
    "weight": "the weight",
    "grad_output": "the gradient",
    "weight_for_grad_input": "the weight in the grad-input GEMM",
    "input_for_grad_weight": "the input in the grad-weight GEMM",
    "grad_output_for_grad_weight": "the gradient in the grad-weight GEMM",
}
UNDER_BOUNDS = (0.001, 0.005, 0.01, FITS_BAND)  # "every cast under 0.5 %"


@dataclass
class LayerFacts:
    """What was measured of one layer: its calls' forward GEMM shapes (empty: it never ran),
    why fp8 cannot take it (None: it can), and its casts per recipe (None: unknown)."""

    name: str
    kind: str
    calls: list[Shape]
    why_not: str | None
    numerics: dict[str, RecipeNumerics] | None


def pct(share: float) -> str:
    """0.61 -> '61 %', 0.004 -> '0.4 %', 0 -> '0 %'."""
    if share == 0:
        return "0 %"
    if share >= 0.1:
        return f"{share * 100:.0f} %"
    return f"{share * 100:.2g} %"


def scaled_calls(calls: Sequence[Shape], factor: float) -> list[Shape]:
    """Each call's M times ``factor`` (``--tokens`` over the rows of the measured step)."""
    return [(max(1, round(m * factor)), k, n) for m, k, n in calls]


def worst_cast(numerics: RecipeNumerics) -> tuple[str, CastFigures]:
    """The cast that loses most: inf/NaN first, then the largest underflow."""
    return max(numerics.casts.items(), key=lambda item: (item[1].nonfinite, item[1].underflow))


def plan_layer(
    facts: LayerFacts,
    machine: Machine,
    candidates: Sequence[str],
    factor: float = 1.0,
    times: GemmTimes | None = None,
) -> LayerPlan:
    """One layer's decision. ``candidates``: the recipes ``--recipe`` allows; ``factor``:
    planned over measured tokens; ``times``: this GPU's measured GEMMs, where there are."""
    calls = scaled_calls(facts.calls, factor)
    largest = max(calls, default=None)
    gemm = Gemm(M=largest[0], K=largest[1], N=largest[2]) if largest else None
    if facts.why_not is not None or not calls:
        return LayerPlan(
            name=facts.name,
            kind=facts.kind,
            gemm=gemm,
            calls=len(calls),
            predicted_speedup=None,
            speedups={},
            speed_from=None,
            numerics=facts.numerics,
            decision="bf16",
            recipe=None,
            deciding_cast=None,
            reason=f"bf16: {facts.why_not or 'never called'}",
        )
    predictions = {r: predict(machine, calls, r, times) for r in RECIPES}
    speedups = {r: round(p.speedup, 3) for r, p in predictions.items()}
    measured = all(predictions[r].measured for r in candidates)
    numerics = facts.numerics
    fits = {r: numerics is None or numerics[r].fits for r in RECIPES}
    m = gemm.M if gemm else 0
    good = [r for r in candidates if fits[r] and speedups[r] > 1.0]
    if good:
        chosen = max(good, key=lambda r: speedups[r])
        reason = _fp8_words(chosen, speedups[chosen], m, numerics, measured)
        return LayerPlan(
            name=facts.name,
            kind=facts.kind,
            gemm=gemm,
            calls=len(calls),
            predicted_speedup=speedups[chosen],
            speedups=speedups,
            speed_from="measured" if predictions[chosen].measured else "model",
            numerics=numerics,
            decision="fp8",
            recipe=chosen,
            deciding_cast=None,
            reason=reason,
        )
    fastest = max(candidates, key=lambda r: speedups[r])
    failing = [r for r in candidates if not fits[r]]
    deciding = None
    if failing and numerics is not None:
        first = max(failing, key=lambda r: speedups[r])
        cast, figures = worst_cast(numerics[first])
        deciding = DecidingCast(
            recipe=first, cast=cast, underflow=figures.underflow, nonfinite=figures.nonfinite
        )
    fitting = [r for r in candidates if fits[r]]
    shown = max(fitting, key=lambda r: speedups[r]) if fitting else fastest
    return LayerPlan(
        name=facts.name,
        kind=facts.kind,
        gemm=gemm,
        calls=len(calls),
        predicted_speedup=speedups[shown],
        speedups=speedups,
        speed_from="measured" if predictions[shown].measured else "model",
        numerics=numerics,
        decision="bf16",
        recipe=None,
        deciding_cast=deciding,
        reason=_bf16_words(candidates, speedups, fits, m, numerics),
    )


def _under(numerics: dict[str, RecipeNumerics] | None, recipe: str) -> str:
    if numerics is None:
        return "its numerics unknown (a shape alone)"
    worst = max(f.underflow for f in numerics[recipe].casts.values())
    if worst == 0:
        return "no cast flushes a value to zero"
    bound = next((b for b in UNDER_BOUNDS if worst < b), None)
    return f"every cast under {pct(bound)}" if bound else f"every cast at most {pct(FITS_BAND)}"


def _fp8_words(
    recipe: str,
    speedup: float,
    m: int,
    numerics: dict[str, RecipeNumerics] | None,
    measured: bool,
) -> str:
    how = "predicted from GEMMs timed here" if measured else "predicted"
    return f"fp8 {recipe}: {speedup:.2f}x {how} at M={m}, {_under(numerics, recipe)}"


def _bf16_words(
    candidates: Sequence[str],
    speedups: dict[str, float],
    fits: dict[str, bool],
    m: int,
    numerics: dict[str, RecipeNumerics] | None,
) -> str:
    """Why no recipe: each considered recipe's worst cast or its speed; a recipe outside
    ``--recipe`` that would hold the layer is named too."""
    if numerics is None or all(fits[r] for r in candidates):
        best = max(candidates, key=lambda r: speedups[r])
        which = f" ({best})" if len(candidates) > 1 else ""
        return f"bf16: predicted {speedups[best]:.2f}x at M={m}{which}"
    said: list[str] = []
    for recipe in RECIPES:
        asked = recipe in candidates
        if fits[recipe]:
            if asked or speedups[recipe] > 1.0:
                note = "" if asked else " (not asked: --recipe auto would consider it)"
                said.append(f"{recipe} holds it, at {speedups[recipe]:.2f}x predicted{note}")
            continue
        if not asked:
            continue
        cast, figures = worst_cast(numerics[recipe])
        said.append(_flush_words(recipe, cast, figures, first=not said))
    return "bf16: " + "; ".join(said)


def _flush_words(recipe: str, cast: str, figures: CastFigures, first: bool) -> str:
    what = CAST_WORDS[cast]
    if figures.nonfinite:
        return f"{recipe} turns {figures.nonfinite} values of {what} into inf/NaN"
    outliers = figures.outlier_tokens or 0
    scale = "scale" if figures.scaling == "tensor" else "per-feature scales"
    if first and outliers and figures.scaling in ("tensor", "feature"):
        whose = "one token's outlier sets" if outliers == 1 else f"{outliers} outlier tokens set"
        return f"{whose} the {recipe} {scale}, {pct(figures.underflow)} of {what} flushes to zero"
    return f"{recipe} flushes {pct(figures.underflow)} of {what} to zero"
