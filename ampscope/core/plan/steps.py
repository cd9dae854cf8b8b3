"""Several observed fp32 steps as one set of figures per layer, and the words for them.

A plan watches ``STEPS`` fp32 training steps (``--steps``; ``ampscope.engine.plan.fp32_steps``
runs them), not the first batch alone: an MoE's expert may get its first tokens at step 4, an
outlier or an fp16 overflow may come with a later batch. Each step's figures are taken on their
own and the steps are merged worst first: a scale is set per step, so a cast that flushes
30 % of a tensor in one step of eight loses that 30 % there, not the 4 % a pooled share would
say. So per cast: the largest share flushed to zero or beyond fp16's range, the largest error,
the largest magnitude and the most outlier tokens of any step; the inf/NaN values of all steps
together. A layer's calls are counted over all steps.
"""

from __future__ import annotations

from ampscope.core.plan.report import CastFigures, RecipeNumerics

STEPS = 8  # fp32 steps a plan observes unless --steps says
MAX_STEPS = 10_000


def steps_words(steps: int) -> str:
    """``the 8 fp32 steps observed``; ``the fp32 step observed`` for one."""
    return "the fp32 step observed" if steps == 1 else f"the {steps} fp32 steps observed"


def never_called(steps: int) -> str:
    """Why a layer that no observed step ran gets no decision of its own."""
    return f"never called in {steps_words(steps)}"


def _most(a: float | int | None, b: float | int | None) -> float | int | None:
    if a is None or b is None:
        return b if a is None else a
    return max(a, b)


def worst(a: CastFigures, b: CastFigures) -> CastFigures:
    """One cast's figures over two sets of steps: the worst of each, inf/NaN values summed."""
    outliers = _most(a.outlier_tokens, b.outlier_tokens)
    return CastFigures(
        underflow=max(a.underflow, b.underflow),
        rel_error=max(a.rel_error, b.rel_error),
        nonfinite=a.nonfinite + b.nonfinite,
        format=a.format or b.format,
        scaling=a.scaling or b.scaling,
        outlier_tokens=None if outliers is None else int(outliers),
        overflow=_most(a.overflow, b.overflow),
        amax=_most(a.amax, b.amax),
    )


def merge_numerics(
    before: dict[str, RecipeNumerics] | None, step: dict[str, RecipeNumerics]
) -> dict[str, RecipeNumerics]:
    """Every recipe's casts over the steps so far and one more; a recipe fits only where it fit
    every step."""
    if before is None:
        return step
    merged = dict(before)
    for recipe, numerics in step.items():
        had = before.get(recipe)
        if had is None:
            merged[recipe] = numerics
            continue
        casts = dict(had.casts)
        for cast, figures in numerics.casts.items():
            casts[cast] = worst(casts[cast], figures) if cast in casts else figures
        merged[recipe] = RecipeNumerics(casts=casts, fits=had.fits and numerics.fits)
    return merged
