"""Whether a figure of the machine check held still: the best of several rounds, and how far
the median round fell below it.

On a shared machine a matmul's rate moves with whatever else runs: on a 2-core box beside
other jobs, two threads of one matmul ran 0.1 to 190 GFLOP/s from one moment to the next. As
the MAMF finder does, ``ampscope doctor --bench`` (``ampscope.engine.machine.bench``)
therefore times every figure in ``ROUNDS`` rounds spread over its whole run (each round
measures every format once), keeps the best round (a peak is what nothing beats) and says how
far the median round lay below it. When that spread is above ``STEADY_SPREAD``, the machine
was too busy to measure: the figure is shown with its spread, and is not kept as the
machine's peak (``ampscope.core.machine.check.measured_peak`` serves none).

Plain functions over figures, so the verdict is tested with simulated rounds.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

ROUNDS = 5
MIN_ROUNDS = 3  # fewer cannot tell a steady figure from a lucky one
STEADY_SPREAD = 0.15


def spread(rounds: Sequence[float]) -> float | None:
    """How far the median round lies below the best, 0 to 1; None without a round."""
    if not rounds:
        return None
    best = max(rounds)
    # each round as a share of the best, so two rounds near the float limit (a hand-edited
    # file) average to a share, never to inf: the spread stays within 0 to 1
    return 1.0 - statistics.median(r / best for r in rounds) if best > 0 else 1.0


def steady(rounds: Sequence[float]) -> bool:
    """Enough rounds, and the median within ``STEADY_SPREAD`` of the best."""
    gap = spread(rounds)
    return len(rounds) >= MIN_ROUNDS and gap is not None and gap <= STEADY_SPREAD


def trusted(rounds: Sequence[float]) -> bool:
    """A figure to read runs against: a steady one, or one kept before the check took rounds
    (an older file: its spread is not known, and a run that beats it says so)."""
    return not rounds or steady(rounds)


def pct(fraction: float) -> str:
    return f"{fraction * 100:.0f} %"


def rounds_text(rounds: Sequence[float]) -> str:
    """'5 rounds, median 4 % below the best', or '' for a figure without rounds."""
    gap = spread(rounds)
    if gap is None:
        return ""
    if len(rounds) == 1:
        return "1 round"
    return f"{len(rounds)} rounds, median {pct(gap)} below the best"


def busy_verdict(
    unsteady: Sequence[tuple[str, Sequence[float]]],
    load_average: float | None,
    contention: str | None = None,
) -> str | None:
    """One sentence for a check the machine was too busy for: ``contention`` (other processes
    held the CPUs it needed, in words) and the figures whose rounds disagreed, ``(what,
    rounds)`` each. None when every figure held still and nothing contended."""
    if not unsteady and contention is None:
        return None
    load = f" (load average {load_average:.1f})" if load_average is not None else ""
    rest = "run ampscope doctor --bench again when it is quieter"
    counts = {len(rounds) for _, rounds in unsteady}
    if unsteady and max(counts) < MIN_ROUNDS:  # the rounds did not fit in the check's time
        fitted = max(counts)
        disagreed = (
            f"only {fitted} round{'s' if fitted != 1 else ''} fitted in the check's time, too "
            "few to tell a steady figure from a lucky one"
        )
    else:
        parts: list[str] = []
        for what, rounds in unsteady:
            gap = pct(spread(rounds) or 0.0)
            detail = (
                f"only {len(rounds)} round{'s' if len(rounds) != 1 else ''}"
                if len(rounds) < MIN_ROUNDS
                else f"median round {gap} below the best"
                if not parts
                else gap
            )
            parts.append(f"{what} ({detail})")
        named = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else "".join(parts)
        disagreed = (
            f"the rounds of {named} disagreed by more than {pct(STEADY_SPREAD)}" if parts else ""
        )
    if contention is not None:
        said = contention + load + (f", and {disagreed}" if disagreed else "")
        return (
            f"the machine was too busy to measure: {said}. Every figure here is the busy "
            f"machine's and none is kept as its peak; {rest}"
        )
    which = "it is" if len(unsteady) == 1 else "they are"
    return (
        f"the machine was too busy to measure: {disagreed}{load}; {which} not kept as this "
        f"machine's peak; {rest}"
    )
