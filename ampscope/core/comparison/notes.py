"""What ``ampscope bench`` says under its table about time itself: which clock timed the
steps, and, where the spread between repeats is what keeps a speed verdict back, that it is
and what would narrow it (the CPU clock on a shared CPU machine, more repeats, fewer
threads). Torch- and textual-free, beside ``comparison``, which renders the table.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Literal

from ampscope.core import records
from ampscope.core.comparison import Row, row_from_runs
from ampscope.core.units import fmt_ms

Clock = Literal["wall", "cpu"]

CLOCK_WORDS = {
    "wall": "wall clock (each step's elapsed time)",
    "cpu": "CPU clock (each step's process CPU time, all threads: --clock cpu)",
}
SPREAD_BLOCKS = 1.2
"""A speed-up interval this many times wide (high / low) that still holds 1.0 says the
repeats disagree, not that the presets run alike: the bench says so, and what would help."""


def row_by_clock(preset: str, runs: Sequence[records.RunRecord], clock: Clock) -> Row:
    """``comparison.row_from_runs``, its step times (the median, the spread between repeats,
    each run's median for the speed verdict) by ``clock``: ``cpu`` takes each run's
    ``done.cpu_ms_median``, which runs on a CPU device record."""
    row = row_from_runs(preset, runs)
    row.clock = clock
    if clock == "cpu":
        row.run_medians = [
            r.done.cpu_ms_median if r.done is not None and wall is not None else None
            for r, wall in zip(runs, row.run_medians, strict=True)
        ]
        got = [m for m in row.run_medians if m is not None]
        row.step_ms = statistics.median(got) if got else None
        row.spread_lo, row.spread_hi = (min(got), max(got)) if len(got) > 1 else (None, None)
    return row


def clock_note(clock: str) -> str:
    return f"step time: {CLOCK_WORDS[clock]}, the median of each run's timed steps."


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
