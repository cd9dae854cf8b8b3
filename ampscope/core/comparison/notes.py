"""What ``ampscope bench`` does about time itself: rows timed by the clock asked for (the
wall's or the CPU's), and, where the spread between repeats is what keeps a speed verdict
back, a note that says so and what would narrow it (the CPU clock on a shared CPU machine,
more repeats, fewer threads). Torch- and textual-free, beside ``comparison``, which renders
the table and names the clock in its legend.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Literal

from ampscope.core import events as ev
from ampscope.core import records
from ampscope.core.comparison import Row, row_from_runs, set_rates
from ampscope.core.units import fmt_ms

Clock = Literal["wall", "cpu"]

SPREAD_BLOCKS = 1.2
"""A speed-up interval this many times wide (high / low) that still holds 1.0 says the
repeats disagree, not that the presets run alike: the bench says so, and what would help."""


def row_by_clock(preset: str, runs: Sequence[records.RunRecord], clock: Clock) -> Row:
    """``comparison.row_from_runs`` with every timed figure by ``clock``: ``cpu`` takes each
    run's ``done.cpu_ms_median`` (which runs on a CPU device record), aggregates them as the
    wall clock's are (the geometric mean, as the speed-up averages the logs of paired
    ratios), and puts the rates per CPU second; the wall clock's figures stay beside them
    (``wall_ms``) so that the verdict can tell when the two clocks disagree."""
    row = row_from_runs(preset, runs)
    row.clock = clock
    if clock == "cpu":
        row.wall_ms, row.wall_run_medians = row.step_ms, row.run_medians
        row.run_medians = [
            r.done.cpu_ms_median if r.done is not None and wall is not None else None
            for r, wall in zip(runs, row.wall_run_medians, strict=True)
        ]
        got = [m for m in row.run_medians if m is not None and m > 0]
        row.step_ms = statistics.geometric_mean(got) if got else None
        row.spread_lo, row.spread_hi = (min(got), max(got)) if len(got) > 1 else (None, None)
        timed = [r for r, m in zip(runs, row.run_medians, strict=True) if m is not None and m > 0]
        set_rates(row, timed, row.step_ms)
        row.mfu = row.mfu_measured = None  # a CPU second counts every thread: no share of a peak
    return row


def spread_blocks(row: Row) -> bool:
    """No verdict because the repeats disagree: the interval holds 1.0 and is wide."""
    low, high = row.speedup_low, row.speedup_high
    if row.significant is not False or low is None or high is None or low <= 0:
        return False
    return high / low >= SPREAD_BLOCKS


def spread_notes(rows: list[Row], baseline: str, on_cpu: bool) -> list[str]:
    """Where the spread between repeats is what keeps a verdict back: say so, with the
    repeats' range, and what would narrow it on this clock and device."""
    blocked = [r for r in rows if spread_blocks(r)]
    if not blocked:
        return []
    base = next((r for r in rows if r.preset == baseline), None)
    ranges = []
    for row in [r for r in (base, *blocked) if r is not None]:
        if row.spread_lo is not None and row.spread_hi is not None:
            ranges.append(f"{row.preset} {fmt_ms(row.spread_lo)}-{fmt_ms(row.spread_hi)}")
    clock = blocked[0].clock
    cpu_device = on_cpu
    helps = []
    if clock == "wall" and cpu_device:
        helps.append(
            "--clock cpu (each step's process CPU time: other tenants' load hardly moves it)"
        )
    helps.append("more --repeats")
    if cpu_device:
        helps.append("fewer threads (OMP_NUM_THREADS=1 on a shared machine)")
    else:
        helps.append("a GPU nothing else is using")
    names = ", ".join(r.preset for r in blocked)
    return [
        f"No speed verdict for {names}: the repeats spread too widely to tell "
        f"(step time across repeats: {'; '.join(ranges)})."
        if ranges
        else f"No speed verdict for {names}: the repeats spread too widely to tell.",
        "What would help: " + ", ".join(helps) + ".",
    ]


RUN_SPREAD = 2.0
"""A run whose slow steps (p90) take this many times its fast ones (p10) or more has no
steady step time: its median is one point of a wide spread."""


def run_spread_note(done: ev.DoneEvent) -> str | None:
    """What ``ampscope run`` says under its summary when the steps spread too widely for the
    median to stand for them (a compiled run once printed 801 ms, p10-p90 65 ms-1.16 s, beside
    36 ms eager: a class learned 'compile is 22x slower'), as bench does for its repeats."""
    low, high, median = done.step_ms_p10, done.step_ms_p90, done.step_ms_median
    if not low or not high or median is None or high / low < RUN_SPREAD:
        return None
    return (
        f"The step times spread widely (p10-p90 {fmt_ms(low)}-{fmt_ms(high)}, {high / low:.1f}x "
        f"apart): the median of {fmt_ms(median)} is not a steady step time, so do not quote or "
        "compare it alone. Recompiles, a busy machine or a stalling data loader spread steps; "
        f"ampscope bench (repeated, interleaved runs) says whether one preset is faster."
    )
