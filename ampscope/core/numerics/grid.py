"""The Numerics view's heatmap as numbers: layers (repeated blocks grouped) x sampled steps.

No textual here: the view colours these cells; tests read them directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ampscope.core import events as ev
from ampscope.core.numerics import TensorNumerics, group_names, headroom_bits

METRICS = {
    "overflow": "overflow share",
    "underflow": "underflow share",
    "headroom": "headroom in bits to the format's largest value",
}
PASSES = (("activation", "out"), ("gradient", "grad"))


@dataclass
class GridRow:
    label: str  # a module or a group of repeated ones: blocks.0-11.attn.proj
    members: list[str]
    pass_label: str  # "out" or "grad"
    cells: list[float | None]  # one a sampled step; None: not measured there
    first_nonfinite: int | None = None  # the column where this row held the first inf/NaN


def cell_value(t: TensorNumerics | None, key: str, metric: str) -> float | None:
    if t is None:
        return None
    if metric == "headroom":
        return headroom_bits(t.amax, key)
    share = t.formats.get(key)
    if share is None:
        return None
    return share.overflow if metric == "overflow" else share.underflow


def _worst(values: list[float | None], metric: str) -> float | None:
    seen = [v for v in values if v is not None]
    if not seen:
        return None
    return min(seen) if metric == "headroom" else max(seen)


def build_grid(
    events: Sequence[ev.NumericsEvent], key: str, metric: str
) -> tuple[list[int], list[GridRow]]:
    """The steps (columns) and rows for ``events``; a group's cell is its worst member's."""
    events = sorted(events, key=lambda e: e.step)  # a rerun skipped step may land late
    names: dict[str, None] = {}
    for e in events:
        for m in e.modules:
            names.setdefault(m.name, None)
    tables = [{m.name: m for m in e.modules} for e in events]
    first = next((e.first_nonfinite for e in events if e.first_nonfinite), None)
    rows = []
    for label, members in group_names(list(names)):
        for side, pass_label in PASSES:
            cells = [
                _worst(
                    [
                        cell_value(getattr(table[n], side) if n in table else None, key, metric)
                        for n in members
                    ],
                    metric,
                )
                for table in tables
            ]
            if all(c is None for c in cells):
                continue
            row = GridRow(label, members, pass_label, cells)
            wanted = "forward" if side == "activation" else "backward"
            if first and first.module in members and first.pass_ == wanted:
                steps = [e.step for e in events]
                row.first_nonfinite = steps.index(first.step) if first.step in steps else None
            rows.append(row)
    return [e.step for e in events], rows
