"""What a watched run says in words: notes at the start, what steps say beyond their figures,
and how the run ended. Torch-free (an exception's class is only looked at by name).
"""

from __future__ import annotations

import math
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from ampscope.core import events as ev
from ampscope.core.numerics.nonfinite import range_advice
from ampscope.core.text import cut, exception_text, exit_call, value_text

if TYPE_CHECKING:
    from ampscope.watching.describe import RunFacts
    from ampscope.watching.readout import StepValues

WIDE_FORMATS = ("fp32", "tf32", "fp64")
"""Formats whose range a loss does not run out of by accident: a NaN there is the loss's own."""
MAX_NONFINITE_WITH_SCALER = 20
"""Non-finite losses in a row a GradScaler may skip before it counts as not recovering."""


def setup_warnings(count_flops: bool, facts: RunFacts) -> list[ev.WarningEvent]:
    compiled, precision, inferred = facts.compiled, facts.precision, facts.precision_inferred
    on_cuda = facts.info.is_cuda
    notes = []
    if count_flops and compiled:
        notes.append(
            ev.WarningEvent(
                code="flops-not-counted",
                message=(
                    "count_flops=True needs an eager model: counting runs a step under "
                    "FlopCounterMode, and torch.compile then gives up compiling it for good. "
                    "Count once on the eager model (ampscope.count_flops) and pass "
                    "flops_per_step=."
                ),
            )
        )
    if inferred and on_cuda and not precision.startswith("amp"):
        notes.append(
            ev.WarningEvent(
                code="precision-inferred",
                message=(
                    f"Precision taken as {precision} from the parameters' dtype: autocast cannot "
                    "be seen from outside the loop. If the loop runs under torch.autocast, pass "
                    "precision='amp-bf16' (or 'amp-fp16') so MFU uses the right peak."
                ),
            )
        )
    return notes


def partial_count(flops: float, missing: tuple[str, ...]) -> str:
    """The sentence for a FLOP count that ran kernels torch has no FLOP formula for."""
    return (
        f"The FLOP count ({flops:.4g} a step) is a lower bound: torch has no FLOP formula for "
        f"{', '.join(missing)}, which ran in the counted step (a recurrent layer, or the CPU's "
        "flash attention), so TFLOP/s and MFU are lower bounds too. Pass flops_per_step= with "
        "a count of your own for true figures."
    )


def partial_count_warning(flops: float, missing: tuple[str, ...]) -> ev.WarningEvent:
    return ev.WarningEvent(code="flops-partial", message=partial_count(flops, missing), step=0)


class StepNotes:
    """Warnings and errors a run's steps call for: each kind said once, NaN once per streak."""

    def __init__(self, precision: str) -> None:
        self.precision = precision
        self.told: set[str] = set()
        self.nonfinite = 0  # non-finite losses in a row; the monitor resets it on a finite one
        self.counting = False  # count_flops=True: the first step's FLOPs are being counted

    def after(
        self, v: StepValues, skipped: bool, scaled: bool, finite: bool, flops_known: bool
    ) -> list[ev.Event]:
        out: list[ev.Event] = []
        if skipped and self._once("skipped-step"):
            out.append(
                ev.WarningEvent(
                    code="skipped-step",
                    step=v.step,
                    message=(
                        f"GradScaler skipped step {v.step}: gradients held inf/NaN; loss scale "
                        f"{v.scale_before:g} -> {v.scale:g}. A few early skips are normal while "
                        "the scale settles."
                    ),
                )
            )
        if skipped and v.scale < 1.0 <= v.scale_before:
            out.append(
                ev.WarningEvent(
                    code="scale-collapse",
                    step=v.step,
                    message=(
                        f"Loss scale fell below 1 ({v.scale:g}) at step {v.step}: gradients "
                        "overflow even unscaled. Look for inf/NaN in the forward pass or lower "
                        "the learning rate."
                    ),
                )
            )
        if not flops_known and self._once("flops-unknown"):
            out.append(ev.WarningEvent(code="flops-unknown", message=self._flops_unknown()))
        if not finite:
            self.nonfinite += 1
            if (not scaled and self.nonfinite == 1) or self.nonfinite == MAX_NONFINITE_WITH_SCALER:
                out.append(
                    ev.ErrorEvent(kind="nan", message=self.nan_message(v, scaled), step=v.step)
                )
        return out

    def _flops_unknown(self) -> str:
        if self.counting:  # asked for, and counted nothing: asking again would not help
            return (
                "No TFLOP/s or MFU: count_flops=True counted no FLOPs in the first step (torch "
                "counts matrix multiplies, convolutions and attention, and this step ran none "
                "of them). Pass flops_per_step= with a count of your own for these figures."
            )
        return (
            "No TFLOP/s or MFU: the FLOPs of a step are unknown. Pass "
            "flops_per_step= or count_flops=True to ampscope.watch()."
        )

    def bad_loss(self, step: int, problem: str) -> ev.WarningEvent | None:
        """``mon.step(loss)`` got what is no loss (``problem`` says what): said once a kind."""
        if not self._once(f"loss-unreadable {problem.split(' (')[0]}"):
            return None
        return ev.WarningEvent(
            code="loss-unreadable",
            step=step,
            message=(
                f"Step {step}'s loss is {problem}: mon.step(loss) takes a tensor or a real "
                "number (int, float). The step is recorded without a loss, as are later "
                "steps given one like it; your loop goes on."
            ),
        )

    def bad_figure(
        self, step: int, name: str, problem: str, tensor_figures: tuple[str, ...]
    ) -> ev.WarningEvent | None:
        """``mon.step(name=...)`` got what is no number: said once a figure and kind."""
        if not self._once(f"figure-unreadable {name} {problem.split(' (')[0]}"):
            return None
        takes = "a one-element tensor or a real number" if name in tensor_figures else "a number"
        if name in ("tokens", "samples"):  # counts
            takes += " of 0 or more"
        return ev.WarningEvent(
            code="figure-unreadable",
            step=step,
            message=(
                f"Step {step}'s {name}= is {problem}: mon.step({name}=) takes {takes}. The "
                f"step is recorded without it, as are later steps given one like it; your "
                "loop goes on."
            ),
        )

    def not_scalar(self, step: int, shape: tuple[int, ...]) -> ev.WarningEvent | None:
        if not self._once("loss-not-scalar"):
            return None
        count = math.prod(shape)
        return ev.WarningEvent(
            code="loss-not-scalar",
            step=step,
            message=(
                f"Step {step}'s loss is a tensor of shape {tuple(shape)}, not a scalar: "
                f"ampscope records the mean of its {count:,} elements, at this step and later "
                "ones. Pass the reduced loss (loss.mean(), or what backward() was called on)."
            ),
        )

    def nan_message(self, v: StepValues, scaled: bool) -> str:
        if scaled:
            return (
                f"Loss has been {v.loss} for {self.nonfinite} steps in a row (to step {v.step}): "
                "the GradScaler skips them but is not recovering. Your loop goes on; ampscope "
                "only records this. Lower the learning rate or look for inf/NaN in the forward "
                "pass."
            )
        if v.loss is not None and math.isnan(v.loss) and self.precision in WIDE_FORMATS:
            return (
                f"Loss became nan at step {v.step}: the loss itself is NaN. This is no range "
                f"issue ({self.precision} without a low-precision autocast): something computed "
                "NaN, such as 0/0, inf - inf, the log or sqrt of a negative number, or NaN in "
                "the data or the weights. Your loop goes on; ampscope only records this. "
                "torch.autograd.set_detect_anomaly(True) names the operation that made it."
            )
        hint = (
            "Pure fp16 has no master weights or loss scaling; use autocast with a GradScaler."
            if self.precision == "fp16"
            else range_advice(self.precision)
        )
        return (
            f"Loss became {v.loss} at step {v.step}: the numbers left the format's range. "
            f"Your loop goes on; ampscope only records this. {hint}"
        )

    def _once(self, key: str) -> bool:
        if key in self.told:
            return False
        self.told.add(key)
        return True


def outcome(error: BaseException | None, signum: int | None) -> tuple[ev.DoneStatus, str | None]:
    """The ``done`` status and error message for a run that ends with ``error`` (or none).

    After SIGTERM or SIGINT any ending is a stop: trainers turn the signal into their own
    exception (Lightning's SIGTERMException) or into a clean return.
    """
    if signum is not None or isinstance(error, KeyboardInterrupt):
        return "stopped", None
    if isinstance(error, GeneratorExit):  # a loop in a generator, whose reader stopped early
        return "ok", None
    if isinstance(error, SystemExit):
        if error.code in (0, None):
            return "ok", None
        code = error.code if isinstance(error.code, int) else 1  # Python prints a message, exits 1
        return (
            "failed",
            f"the script ended with {exit_call(error.code)}: exit code {value_text(code, 40)}",
        )
    if error is not None:
        return "failed", f"{type(error).__name__}: {exception_text(error)}"
    return "ok", None


def error_event(error: BaseException, step: int) -> ev.ErrorEvent:
    text = cut("".join(traceback.format_exception(type(error), error, error.__traceback__)))
    message = f"{type(error).__name__}: {exception_text(error)}"
    kind = "oom" if type(error).__name__ == "OutOfMemoryError" else "exception"
    return ev.ErrorEvent(kind=kind, message=message, step=step, traceback=text)  # type: ignore[arg-type]


def default_name() -> str:
    """The script's name (``train`` for ``python train.py``), else 'watch'."""
    script = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] not in ("", "-c", "-") else ""
    return script or "watch"
