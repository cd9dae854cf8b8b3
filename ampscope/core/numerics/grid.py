"""The Numerics view's heatmap as numbers: layers (repeated blocks grouped) x sampled steps.

No textual here: the view colours these cells; tests read them directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ampscope.core import events as ev
from ampscope.core.numerics import ModuleNumerics, TensorNumerics, group_names, headroom_bits
from ampscope.core.numerics.event import OUTPUT, PARAMETER, in_model

METRICS = {
    "overflow": "overflow share",
    "underflow": "underflow share",
    "headroom": "headroom in bits to the format's largest value",
}
PASSES = (("activation", "out"), ("gradient", "grad"))


@dataclass
class GridRow:
    label: str  # a module or a group of repeated ones: blocks.0-11.attn.proj; or a parameter
    members: list[str]  # the modules
    pass_label: str  # "out" or "grad"
    cells: list[float | None]  # one a sampled step; None: not measured there
    first_nonfinite: int | None = None  # the column where this row held the first inf/NaN
    parameter: str | None = None  # the row of this parameter's gradient (its name in a module)


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


def _tensor(m: ModuleNumerics | None, side: str) -> TensorNumerics | None:
    """A module's outputs ("activation"), their gradient ("gradient"), or the gradient of
    its parameter ``side[1:]`` (side ".bias")."""
    if m is None:
        return None
    if side.startswith("."):
        return m.parameters.get(side[1:])
    return m.activation if side == "activation" else m.gradient


def build_grid(
    events: Sequence[ev.NumericsEvent], key: str, metric: str
) -> tuple[list[int], list[GridRow]]:
    """The steps (columns) and rows for ``events``; a group's cell is its worst member's. A
    module's parameters' gradients have rows of their own, after its outputs'."""
    events = sorted(events, key=lambda e: e.step)  # a rerun skipped step may land late
    names: dict[str, dict[str, None]] = {}  # module -> its parameters, in order
    places: dict[str, int | None] = {}
    for e in events:
        for m in e.modules:
            names.setdefault(m.name, {}).update(dict.fromkeys(m.parameters))
            places.setdefault(m.name, m.order)
    # in the model's order, whatever step a module first ran at
    names = dict(sorted(names.items(), key=lambda kv: in_model(places[kv[0]])))
    tables = [{m.name: m for m in e.modules} for e in events]
    first = next((e.first_nonfinite for e in events if e.first_nonfinite), None)
    steps = [e.step for e in events]
    rows = []
    for label, members in group_names(list(names)):
        parameters = dict.fromkeys(p for n in members for p in names[n])
        sides = [*PASSES, *((f".{p}", "grad") for p in parameters)]
        for side, pass_label in sides:
            cells = [
                _worst([cell_value(_tensor(t.get(n), side), key, metric) for n in members], metric)
                for t in tables
            ]
            if all(c is None for c in cells):
                continue
            parameter = side[1:] if side.startswith(".") else None
            shown = label if parameter is None else ".".join(n for n in (label, parameter) if n)
            row = GridRow(shown, members, pass_label, cells, parameter=parameter)
            if first and first.module in members and _marks(first, side) and first.step in steps:
                row.first_nonfinite = steps.index(first.step)
            rows.append(row)
    return steps, rows


def _marks(first: ev.FirstNonfinite, side: str) -> bool:
    """Whether the row of ``side`` holds the first inf/NaN (a module's own code's is no row's)."""
    if first.source == PARAMETER:
        return side == f".{first.parameter}"
    if first.source != OUTPUT:
        return False
    return side == ("activation" if first.pass_ == "forward" else "gradient")
