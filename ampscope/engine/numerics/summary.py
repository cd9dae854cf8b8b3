"""Rows measured on the device, as the event's modules: every tensor of a module and pass
(tuple outputs, a module called twice in a step) summed into one entry."""

from __future__ import annotations

import math

from ampscope.core.numerics import FORMATS, FP8_KEYS, FormatShare, ModuleNumerics, TensorNumerics
from ampscope.engine.numerics.measure import (
    AMAX,
    MIN_NONZERO,
    NONFINITE,
    NUMEL,
    OVER,
    SCALED,
    UNDER,
    WIDTH,
)


def _merge(rows: list[list[float]]) -> TensorNumerics:
    total = [sum(r[c] for r in rows) for c in range(WIDTH)]
    numel = max(total[NUMEL], 1.0)
    amax = max(r[AMAX] for r in rows)
    low = min(r[MIN_NONZERO] for r in rows)
    formats = {
        key: FormatShare(
            overflow=total[OVER[key]] / numel,
            underflow=total[UNDER[key]] / numel,
            scaled_underflow=total[SCALED[key]] / numel if key in FP8_KEYS else None,
        )
        for key in FORMATS
    }
    return TensorNumerics(
        numel=int(total[NUMEL]),
        amax=amax if total[NONFINITE] < total[NUMEL] else None,
        min_nonzero=low if math.isfinite(low) else None,
        nonfinite=int(total[NONFINITE]),
        formats=formats,
    )


def module_numerics(
    names: list[str],
    kinds: list[str],
    owners: list[str],
    slots: list[tuple[int, str]],
    rows: list[list[float]],
    checks: list[float],
) -> tuple[list[ModuleNumerics], tuple[str, str] | None]:
    """The modules measured this step, in the model's order, and the first (module, pass)
    whose tensor held an inf or NaN, in the order the step computed them.

    ``slots`` name each row of ``rows`` (a module's output or output gradient) and each value
    of ``checks`` (a weight gradient's largest magnitude, pass "weight"), in that order;
    ``owners`` extends ``names`` with the modules that own parameters but are not measured.
    A weight gradient's inf counts as its owner's backward pass."""
    grouped: dict[tuple[int, str], list[list[float]]] = {}
    first = None
    rows_left, checks_left = iter(rows), iter(checks)
    for slot in slots:
        if slot[1] == "weight":
            largest = next(checks_left)
            if first is None and not math.isfinite(largest):
                first = (owners[slot[0]], "backward")
            continue
        row = next(rows_left)
        grouped.setdefault(slot, []).append(row)
        if first is None and row[NONFINITE] > 0:
            first = (owners[slot[0]], slot[1])
    out = []
    for index, name in enumerate(names):
        fwd, bwd = grouped.get((index, "forward")), grouped.get((index, "backward"))
        if fwd is None and bwd is None:
            continue  # not called this step
        out.append(
            ModuleNumerics(
                name=name,
                kind=kinds[index],
                activation=_merge(fwd) if fwd else None,
                gradient=_merge(bwd) if bwd else None,
            )
        )
    return out, first
