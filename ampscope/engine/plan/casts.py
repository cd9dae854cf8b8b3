"""torchao's six fp8 casts of a linear layer, run on any device, and what each one loses.

A torchao ``Float8Linear`` casts its input twice (per token for the forward GEMM, per feature
across tokens for the grad-weight GEMM under rowwise scaling), its weight twice (for the
forward and the grad-input GEMM) and the gradient twice (for the grad-input and the
grad-weight GEMM). ``CAST_PLANS`` says, per recipe, each cast's format and the axis its scale
is taken along, as ``torchao.float8.Float8LinearConfig.from_recipe_name`` configures it;
tests/test_plan_fp8.py checks every cast against torchao's own (``hp_tensor_to_float8_dynamic``).

A cast is a round trip: scale by the format's largest value over the amax (per tensor or
along an axis; rowwise recipes round the scale down to a power of two), saturate, cast to the
fp8 dtype, and back. Measured against the tensor the cast reads (under autocast the input and
the gradient are bf16, the weight is the fp32 master copy), the loss is what fp8 adds to an
amp-bf16 run. A GEMM a recipe keeps in high precision (rowwise_with_gw_hp's grad-weight) is
figured as its bf16 tensors, which lose nothing beyond amp-bf16's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ampscope.core.plan.report import FITS_BAND, CastFigures, RecipeNumerics

EPS = 1e-12  # torchao's floor on an amax (torchao/float8/float8_utils.py)
OUTLIER_RATIO = 16.0  # a row is an outlier when its largest value is 16x the median row's
FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
CASTS = (
    "input",
    "weight",
    "grad_output",
    "weight_for_grad_input",
    "input_for_grad_weight",
    "grad_output_for_grad_weight",
)
TENSOR_OF = {
    "input": "input",
    "input_for_grad_weight": "input",
    "weight": "weight",
    "weight_for_grad_input": "weight",
    "grad_output": "grad",
    "grad_output_for_grad_weight": "grad",
}


@dataclass(frozen=True)
class CastPlan:
    """One cast: the fp8 format (None: kept in bf16), the axis of its amax on the 2-D tensor
    as stored (input ``M x K``, weight ``N x K``, gradient ``M x N``; None: one scale for the
    tensor), whether the scale is a power of two, and its scaling in the contract's words."""

    format: str | None
    axis: int | None
    power_of_two: bool
    scaling: str


def _plans() -> dict[str, dict[str, CastPlan]]:
    tensor = CastPlan("e4m3", None, False, "tensor")
    tensor_grad = CastPlan("e5m2", None, False, "tensor")
    per_token = CastPlan("e4m3", 1, True, "token")  # one scale per row: amax over features
    per_feature = CastPlan("e4m3", 0, True, "feature")  # one scale per column, across tokens
    per_out = CastPlan("e4m3", 1, True, "out_feature")  # weight N x K: a scale per row
    per_in = CastPlan("e4m3", 0, True, "in_feature")  # a scale per input feature
    kept = CastPlan(None, None, False, "none")
    return {
        "tensorwise": {
            "input": tensor,
            "weight": tensor,
            "grad_output": tensor_grad,
            "weight_for_grad_input": tensor,
            "input_for_grad_weight": tensor,
            "grad_output_for_grad_weight": tensor_grad,
        },
        "rowwise": {
            "input": per_token,
            "weight": per_out,
            "grad_output": per_token,
            "weight_for_grad_input": per_in,
            "input_for_grad_weight": per_feature,
            "grad_output_for_grad_weight": per_feature,
        },
        "rowwise_with_gw_hp": {
            "input": per_token,
            "weight": per_out,
            "grad_output": per_token,
            "weight_for_grad_input": CastPlan("e4m3", None, True, "tensor"),
            "input_for_grad_weight": kept,
            "grad_output_for_grad_weight": kept,
        },
    }


CAST_PLANS = _plans()


def round_trip(
    x: torch.Tensor, plan: CastPlan, magnitudes: torch.Tensor | None = None
) -> torch.Tensor:
    """``x`` (fp32) cast as ``plan`` says and back to fp32 (``magnitudes``: ``x.abs()``)."""
    if plan.format is None:
        return x
    dtype = FP8[plan.format]
    largest = torch.finfo(dtype).max
    a = x.abs() if magnitudes is None else magnitudes
    amax = a.amax() if plan.axis is None else a.amax(dim=plan.axis, keepdim=True)
    scale = (largest / amax.double().clamp(min=EPS)).float()
    if plan.power_of_two:
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    return (x * scale).clamp(-largest, largest).to(dtype).float() / scale


@dataclass
class Seen:
    """What a tensor holds, counted once for all its casts: its magnitudes, its zeros."""

    magnitudes: torch.Tensor
    zeros: int
    nonzero: int
    ref2: float

    @classmethod
    def of(cls, x: torch.Tensor) -> Seen:
        zeros = int((x == 0).sum())
        ref2 = _squares(x)
        if not math.isfinite(ref2):  # inf/NaN in the tensor itself: the finite values' sum
            ref2 = _squares(torch.where(torch.isfinite(x), x, 0.0))
        return cls(x.abs(), zeros, x.numel() - zeros, ref2)


def _squares(t: torch.Tensor) -> float:
    return float(torch.sum(t * t, dtype=torch.float64))


@dataclass
class Tally:
    """One cast's sums over a layer's calls: exact counts, and squares for the RMS error."""

    nonzero: int = 0
    flushed: int = 0
    nonfinite: int = 0
    err2: float = 0.0
    ref2: float = 0.0
    outliers: int | None = None

    def add(self, x: torch.Tensor, y: torch.Tensor, seen: Seen) -> None:
        """``y``, the round trip of ``x``; ``seen``, what ``x`` holds (counted once a tensor).
        A zero casts to zero, so the values flushed are ``y``'s zeros less ``x``'s."""
        with torch.no_grad():
            diff = y - x
            err2 = _squares(diff)
            bad = 0
            if not math.isfinite(err2):  # inf/NaN after the cast: the finite values' error
                bad = int((~torch.isfinite(y)).sum())
                err2 = _squares(torch.where(torch.isfinite(diff), diff, 0.0))
            self.nonzero += seen.nonzero
            self.flushed += int((y == 0).sum()) - seen.zeros
            self.nonfinite += bad
            self.err2 += err2
            self.ref2 += seen.ref2

    def figures(self, plan: CastPlan) -> CastFigures:
        return CastFigures(
            underflow=self.flushed / self.nonzero if self.nonzero else 0.0,
            rel_error=math.sqrt(self.err2 / self.ref2) if self.ref2 > 0 else 0.0,
            nonfinite=self.nonfinite,
            format=plan.format or "bf16",
            scaling=plan.scaling,
            outlier_tokens=self.outliers,
        )


def outlier_rows(x: torch.Tensor) -> int:
    """Rows of ``x`` (tokens) whose largest magnitude is ``OUTLIER_RATIO`` times the median
    row's or more: the few tokens that set a per-tensor or per-feature scale."""
    rows = x.abs().amax(dim=1)
    typical = rows.median()
    if typical <= 0:
        return int((rows > 0).sum())
    return int((rows >= OUTLIER_RATIO * typical).sum())


class LayerCasts:
    """A layer's casts for every recipe, summed over its calls: each distinct cast (format,
    axis, rounding) computed once per tensor however many recipes share it."""

    def __init__(self) -> None:
        self.tallies: dict[tuple[str, CastPlan], Tally] = {}
        self.weight_seen = False

    def add(self, tensor: str, x: torch.Tensor) -> None:
        """One call's ``tensor`` ("input", "weight" or "grad"), as the 2-D tensor the casts
        read: every distinct cast of it, tallied."""
        if tensor == "weight":
            if self.weight_seen:  # one weight, however often the layer is called
                return
            self.weight_seen = True
        x = x.detach().float()
        plans = {
            plan
            for recipe in CAST_PLANS.values()
            for cast, plan in recipe.items()
            if TENSOR_OF[cast] == tensor
        }
        seen = Seen.of(x)
        for plan in plans:
            tally = self.tallies.setdefault((tensor, plan), Tally())
            tally.add(x, round_trip(x, plan, seen.magnitudes), seen)
            if tensor in ("input", "grad") and plan.scaling in ("tensor", "feature"):
                found = outlier_rows(x)
                tally.outliers = max(tally.outliers or 0, found)

    def numerics(self) -> dict[str, RecipeNumerics]:
        out = {}
        for recipe, casts in CAST_PLANS.items():
            figures = {}
            for cast in CASTS:
                plan = casts[cast]
                tally = self.tallies.get((TENSOR_OF[cast], plan), Tally())
                figures[cast] = tally.figures(plan)
            fits = all(f.underflow <= FITS_BAND and f.nonfinite == 0 for f in figures.values())
            out[recipe] = RecipeNumerics(casts=figures, fits=fits)
        return out
