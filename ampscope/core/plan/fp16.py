"""The fp16 decision per module: which modules an amp-fp16 run keeps in fp32, and why.

From the fp32 steps observed (their worst, ``core.plan.steps``), each module's inputs and
outputs as fp16 would hold them: a module stays
in fp32 when any of its inputs or outputs reaches beyond fp16's 65504 (an fp32 output that
large fed to the next autocast op overflows there, so the module of that op, whose input it
is, stays too), or when more than 2 % of their non-zero values round to zero in fp16. A
container is kept whole only where its own code, outside its submodules, is what leaves the
range (``own_inf``: found by a check step under amp-fp16 with the others kept). Where that is
the model's own forward (the residual stream, or a functional op no module holds), keeping it
in fp32 would be no AMP at all: the plan says so and points to amp-bf16, whose range holds it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ampscope.core.numerics import LIMITS
from ampscope.core.numerics.report import limit, magnitude
from ampscope.core.plan.decide import pct
from ampscope.core.plan.report import FITS_BAND, CastFigures, LayerPlan, RecipeNumerics
from ampscope.core.plan.steps import never_called

FP16 = LIMITS["fp16"]


@dataclass
class ModuleFacts:
    """One module in the fp32 steps: its inputs' and outputs' figures as fp16 (None: it has no
    floating-point tensor there, or never ran), whether it is a leaf, whether under amp-fp16
    its own code computed inf/NaN (a check with the others kept in fp32), its calls in all
    the steps (0: it never ran), and why it never runs whatever the data, where the model's
    structure says (``why_not``: nn.MultiheadAttention's out_proj)."""

    name: str
    kind: str
    leaf: bool
    input: CastFigures | None
    output: CastFigures | None
    own_inf: bool = False
    calls: int = 0
    why_not: str | None = None


def leaves_range(figures: CastFigures | None) -> bool:
    if figures is None:
        return False
    return bool(figures.overflow) or figures.underflow > FITS_BAND


def plan_module(facts: ModuleFacts, steps: int) -> LayerPlan:
    """One module's decision over ``steps`` observed steps; a module none of them ran stays
    in fp16 (autocast's default), said so: nothing was seen to keep it out."""
    casts = {k: v for k, v in (("input", facts.input), ("output", facts.output)) if v}
    fits = not (leaves_range(facts.input) or leaves_range(facts.output) or facts.own_inf)
    numerics = {"fp16": RecipeNumerics(casts=casts, fits=fits)} if casts else None
    if facts.calls or facts.own_inf:
        reason = _words(facts, fits)
    else:
        reason = f"fp16: {never_called(steps)}" + (f": {facts.why_not}" if facts.why_not else "")
    return LayerPlan(
        name=facts.name,
        kind=facts.kind,
        gemm=None,
        calls=facts.calls,
        predicted_speedup=None,
        speedups={},
        speed_from=None,
        numerics=numerics,
        decision="fp16" if fits else "fp32",
        recipe=None,
        deciding_cast=None,
        reason=reason,
    )


def _words(facts: ModuleFacts, fits: bool) -> str:
    if fits:
        amax = (
            max((f.amax or 0.0) for f in (facts.input, facts.output) if f)
            if (facts.input or facts.output)
            else 0.0
        )
        return f"fp16: its inputs and outputs stay within fp16's range (largest {magnitude(amax)})"
    said = []
    for side, figures in (("output", facts.output), ("input", facts.input)):
        if figures is None:
            continue
        if figures.overflow:
            beyond = (
                f"its {side} reaches {magnitude(figures.amax)}, beyond fp16's {limit(FP16.largest)}"
            )
            if side == "input":
                beyond += " (an fp32 value fed to its first op in fp16 would overflow there)"
            said.append(beyond)
        elif figures.underflow > FITS_BAND:
            said.append(
                f"{pct(figures.underflow)} of its {side} rounds to zero in fp16 (under "
                f"{magnitude(FP16.zero_below)})"
            )
    if facts.own_inf:
        said.append("under amp-fp16 its own forward computes inf/NaN, outside its submodules")
    return "fp32: " + "; ".join(said)


def amp_bf16_note() -> str:
    """The plan's word when the overflow is in code no module holds."""
    return (
        "the model's own forward leaves fp16's range outside every submodule (a functional op, "
        "or the residual stream): keeping it in fp32 would be no AMP at all. amp-bf16 holds it "
        "(bf16 has fp32's range): the preset written trains amp-bf16"
    )
