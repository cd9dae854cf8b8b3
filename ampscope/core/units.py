"""Human-readable numbers, shared by the console and the dashboard.

Every formatter takes whatever a record holds: None, inf, NaN and absurd magnitudes come
out as text ("-", "inf", "nan"), never as an exception.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

# MFU's figures check their own invariant (a share above 100 % is no MFU): they live with the
# machine check, and are named here too for the formatters' callers.
from ampscope.core.machine.mfu import fmt_mfu as fmt_mfu
from ampscope.core.machine.mfu import of_measured as of_measured

if TYPE_CHECKING:
    from ampscope.core.events import DoneEvent


def _odd(x: float | None) -> str | None:
    """The text for a value no unit applies to, else None."""
    if x is None:
        return "-"
    try:
        x = float(x)
    except (TypeError, ValueError, OverflowError):
        return "?"
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return None


def fmt_ms(ms: float | None) -> str:
    if (odd := _odd(ms)) is not None:
        return odd
    assert ms is not None
    if ms < 0:  # no time is below zero: a hand-edited or damaged record, not a figure
        return "?"
    if ms >= 1000:
        return f"{ms / 1000:.3g} s" if ms >= 1e6 else f"{ms / 1000:.2f} s"
    if ms >= 10:
        return f"{ms:.1f} ms"
    if 0 < ms < 0.01:  # a step of a few microseconds (a watched loop with little work): not 0.00
        return f"{ms * 1000:.2f} \u00b5s"
    return f"{ms:.2f} ms"


def fmt_steps(n: object) -> str:
    """A count of steps: '-' when absent, '?' for one no run has (below zero, not a whole
    number: a hand-edited or damaged record)."""
    if n is None:
        return "-"
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        return "?"
    return str(n)


def fmt_num(x: float | None) -> str:
    if (odd := _odd(x)) is not None:
        return odd
    assert x is not None
    for limit, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= limit:
            return f"{x / limit:.3g}{suffix}"
    return f"{x:.3g}"


def fmt_loss(x: float | None) -> str:
    """A loss to four decimals: differences between precisions show in the third. From a
    million on (a diverging run), four significant digits: 1e+30, not 31 digits and '.0000'."""
    if (odd := _odd(x)) is not None:
        return odd
    assert x is not None
    return f"{x:.4g}" if abs(x) >= 1e6 else f"{x:.4f}"


def fmt_final_loss(loss: float | None, nonfinite: str | None, step: int | None) -> str:
    """A run's final loss as it was: "nan at step 1" when the run ended on a non-finite loss
    (``done.loss_nonfinite``; JSON writes the value itself as null), never an earlier finite one."""
    if nonfinite:
        return f"{nonfinite} at step {step}" if step is not None else nonfinite
    return fmt_loss(loss)


def fmt_done(e: DoneEvent) -> str:
    """A finished run in one line (the Run view's event log), the compile step's own peak
    memory included where the run compiled on a GPU."""
    compile_peak = e.mem_peak_compile
    return (
        f"run {e.status}: {fmt_steps(e.steps_done)} steps in {e.wall_s:.1f} s, median step of the run "
        f"{fmt_ms(e.step_ms_median)}, final loss "
        + fmt_final_loss(e.loss_final, e.loss_nonfinite, e.loss_final_step)
        + ("" if compile_peak is None else f", compile peak {fmt_bytes(compile_peak)}")
    )


def fmt_bytes(n: float | None) -> str:
    if (odd := _odd(n)) is not None:
        return odd
    assert n is not None
    for limit, suffix in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if abs(n) >= limit:
            return f"{_three_digits(n / limit)} {suffix}"
    return f"{int(n)} B"


def _three_digits(value: float) -> str:
    """1.5, 26.1, 327, 1010: three significant digits, never an exponent (1,000 to 1,023 of
    a unit come before the next unit)."""
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def fmt_time(seconds_since_epoch: float | None) -> str:
    """Local date and time as ``YYYY-MM-DD HH:MM:SS``; "-" for a time no clock can show."""
    if _odd(seconds_since_epoch) is not None:
        return "-"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(seconds_since_epoch)))  # type: ignore[arg-type]
    except (OverflowError, OSError, ValueError):
        return "-"
