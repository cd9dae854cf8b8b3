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
    good = [r for r in candidates if fits[r] and speedups[r] > 1.0]
    chosen = max(good, key=lambda r: speedups[r]) if good else None
    fitting = [r for r in candidates if fits[r]]
    shown = chosen or (max(fitting, key=lambda r: speedups[r]) if fitting else None)
    # Where numerics ruled out a recipe faster than the one shown, the reason names every
    # recipe they ruled out, fastest first.
    blocked = [r for r in sorted(candidates, key=lambda r: -speedups[r]) if not fits[r]]
    faster = [r for r in blocked if shown is None or speedups[r] > speedups[shown]]
    ruled_out = blocked if faster else []
    deciding = None
    if ruled_out and numerics is not None:
        cast, figures = worst_cast(numerics[ruled_out[0]])
        deciding = DecidingCast(
            recipe=ruled_out[0], cast=cast, underflow=figures.underflow, nonfinite=figures.nonfinite
        )
    flushes = _flushes(ruled_out, numerics) if numerics is not None else []
    m = gemm.M if gemm else 0
    if chosen is not None:
        reason = _fp8_words(chosen, speedups[chosen], m, numerics, measured)
    elif shown is not None:
        reason = f"bf16: predicted {speedups[shown]:.2f}x at M={m}"
        reason += f" ({shown}, the fastest that fits)" if len(candidates) > 1 else ""
    else:
        reason = "bf16"
    if flushes:
        reason += ("; " if chosen or shown else ": ") + "; ".join(flushes)
    if chosen is None:
        reason += _others(candidates, speedups, fits)
    speed_of = shown or max(candidates, key=lambda r: speedups[r])
    return LayerPlan(
        name=facts.name,
        kind=facts.kind,
        gemm=gemm,
        calls=len(calls),
        predicted_speedup=speedups[speed_of],
        speedups=speedups,
        speed_from="measured" if predictions[speed_of].measured else "model",
        numerics=numerics,
        decision="fp8" if chosen else "bf16",
        recipe=chosen,
        deciding_cast=deciding,
        reason=reason,
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


def _flushes(ruled_out: Sequence[str], numerics: dict[str, RecipeNumerics]) -> list[str]:
    """Each recipe that numerics ruled out, in a phrase: its worst cast."""
    said: list[str] = []
    for recipe in ruled_out:
        cast, figures = worst_cast(numerics[recipe])
        said.append(_flush_words(recipe, cast, figures, first=not said))
    return said


def _others(candidates: Sequence[str], speedups: dict[str, float], fits: dict[str, bool]) -> str:
    """A recipe outside ``--recipe`` that would hold the layer, and would pay."""
    others = [r for r in RECIPES if r not in candidates and fits[r] and speedups[r] > 1.0]
    if not others:
        return ""
    best = max(others, key=lambda r: speedups[r])
    return f"; {best} holds it, at {speedups[best]:.2f}x predicted (--recipe {best} or auto)"


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
