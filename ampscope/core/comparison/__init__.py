"""Run comparison: bench rows, verdicts and sweep records, built from run records.

Shared by ``ampscope bench`` and the dashboard's Compare screen, so both show one table.
A speed difference is called only from repeated, interleaved runs (``significance``), and
only between runs of the same workload, sizes, batch, steps, device and number of processes:
anything else is marked not comparable instead of being read as a precision effect. Torch-
and textual-free.

Its modules:

    table.py         the table: rows from run records, speed-ups, verdicts, text, CSV, JSON
    significance.py  a confidence interval on a speed-up: is one preset really faster
    notes.py         rows by the clock bench was asked for, and a spread that blocks a verdict
"""

from __future__ import annotations

from ampscope.core.comparison.table import (
    CLOCK_WORDS,
    CLOCKS_DISAGREE,
    COLUMNS,
    CPU_HEADS,
    DEFAULT_BASELINE,
    LECTURE_SWEEP,
    OFF_CPU,
    SETUP_FIELDS,
    SWEEP_FILE,
    Row,
    cells,
    clocks_disagree,
    compare,
    interleaved,
    legend,
    off_cpu,
    render,
    row_from_runs,
    set_rates,
    setup_of,
    text_table,
    verdicts,
    write_sweep,
)

__all__ = [
    "CLOCKS_DISAGREE",
    "CLOCK_WORDS",
    "COLUMNS",
    "CPU_HEADS",
    "DEFAULT_BASELINE",
    "LECTURE_SWEEP",
    "OFF_CPU",
    "Row",
    "SETUP_FIELDS",
    "SWEEP_FILE",
    "cells",
    "clocks_disagree",
    "compare",
    "interleaved",
    "legend",
    "off_cpu",
    "render",
    "row_from_runs",
    "set_rates",
    "setup_of",
    "text_table",
    "verdicts",
    "write_sweep",
]
