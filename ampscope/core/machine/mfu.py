"""MFU, and the invariant each MFU figure checks before it is shown.

MFU is a run's model TFLOP/s over a peak: the datasheet's (``hello.peak_tflops``) or what this
machine reached in ``ampscope doctor --bench`` (``hello.measured_tflops``, kept by
``ampscope.core.machine.check``). Both must be finite positive numbers, or there is no figure.
A share above 100 % is no MFU: the run went faster than its peak, so the peak is not one. Against
the measured peak that means the kept check is too low (a busy machine, or shapes it did not
time): measure again. Against the datasheet it means the peak or the FLOP count is wrong. The
words say which, in the run's summary, ``bench``'s table, the Run view's card and the warning a
run records before its ``done``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ampscope.core.events import DoneEvent, HelloEvent

RUN_CHECK = "ampscope doctor --bench"
# The least a peak (TFLOP/s) or a bandwidth (GB/s) can be: a million operations or bytes a
# second. The slowest real figure is four orders of magnitude above it (fp16 without fp16
# units on a CPU, two threads beside other jobs: 0.1 GFLOP/s); a kept 1e-300 is a damaged file.
LEAST_FIGURE = 1e-6


def positive(value: object, least: float = 0.0) -> float | None:
    """``value`` as a finite float above ``least`` (and above 0), else None: text, NaN, inf,
    zero, a negative, a number too large for a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) and number > 0 and number >= least else None


def share(tflops: float | None, peak: float | None, world_size: int = 1) -> float | None:
    """A run's TFLOP/s as a share of ``world_size`` devices' peak: MFU. None unless both are
    finite positive numbers and the peak is one (a NaN, negative or 1e-300 peak read from a
    damaged file gives none). Called every step: no more than a few comparisons."""
    if tflops is None or peak is None:
        return None
    try:
        done, top = float(tflops), float(peak)
    except (TypeError, ValueError, OverflowError):
        return None
    if not (done > 0 and top >= LEAST_FIGURE and math.isfinite(done + top)):
        return None
    return done / (top * max(1, world_size))


def of_measured(tflops: float | None, measured: float | None, world_size: int = 1) -> float | None:
    """MFU against this machine's measured peak rather than the datasheet's."""
    return share(tflops, measured, world_size)


def times(ratio: float) -> str:
    """'1.7x', '17x', '16,600x': never an exponent."""
    return f"{ratio:.2g}x" if ratio < 10 else f"{ratio:,.0f}x"


def over_datasheet(mfu: float) -> str:
    return f"over the datasheet peak ({times(mfu)}): check peak_tflops and the FLOP count"


def over_measured(mfu: float) -> str:
    return f"over the measured peak ({times(mfu)}): run {RUN_CHECK} again"


def fmt_mfu(mfu: float | None, mfu_measured: float | None, digits: int = 1) -> str:
    """'33.0% · 41% of measured', '41% of measured' (no datasheet: a CPU), '33.0%' or '-'; a
    share above 100 % says what it means instead of a percentage."""
    said = None
    if (datasheet := positive(mfu)) is not None:
        said = f"{datasheet * 100:.{digits}f}%" if datasheet <= 1 else over_datasheet(datasheet)
    measured = None
    if (against := positive(mfu_measured)) is not None:
        measured = f"{against * 100:.0f}% of measured" if against <= 1 else over_measured(against)
    return " · ".join(part for part in (said, measured) if part) or "-"


def card_share(mfu: float | None) -> str | None:
    """The Run view's card, 22 columns: '41%' or 'over peak', None without a figure."""
    value = positive(mfu)
    if value is None:
        return None
    return f"{value * 100:.0f}%" if value <= 1 else "over peak"


def above_peak_warnings(done: DoneEvent, hello: HelloEvent | None) -> list[tuple[str, str]]:
    """(code, message) for each MFU of a finished run above 100 %: what it means, what to do.
    The engine records them before ``done``."""
    said: list[tuple[str, str]] = []
    rate = positive(done.tflops)
    if rate is None or hello is None:
        return said
    if (datasheet := positive(done.mfu)) is not None and datasheet > 1:
        said.append(
            (
                "mfu-above-peak",
                f"this run's {rate:.3g} TFLOP/s is {times(datasheet)} its datasheet peak: no "
                "device exceeds its datasheet, so the peak (peak_tflops) or the FLOP count "
                "(flops_per_step) is wrong; MFU is not shown as a percentage",
            )
        )
    peak = positive(hello.measured_tflops, LEAST_FIGURE)
    measured = positive(done.mfu_measured)
    if measured is not None and measured > 1 and peak is not None:
        devices = f" x {hello.world_size} devices" if hello.world_size > 1 else ""
        said.append(
            (
                "mfu-above-measured",
                f"this run's {rate:.3g} TFLOP/s beat the kept {hello.compute_dtype} machine "
                f"check ({peak:.3g} TFLOP/s{devices}, {times(measured)}): that check is not this "
                f"machine's peak (a busy machine, or shapes it did not time); run {RUN_CHECK} "
                "again to measure it",
            )
        )
    return said
