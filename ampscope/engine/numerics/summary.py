"""Rows measured on the device, as the event's modules: every tensor of a module and pass
(tuple outputs, a module called twice in a step) summed into one entry."""

from __future__ import annotations

import math

from ampscope.core.numerics import (
    DTYPE_LARGEST,
    FORMATS,
    FP8_KEYS,
    FormatShare,
    ModuleNumerics,
    TensorNumerics,
    overflows_in,
)
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


def _merge(rows: list[list[float]], dtypes: list[str]) -> TensorNumerics:
    """One module's pass: ``rows`` (its tensors, computed in ``dtypes``) summed. A tensor's
    inf and NaN values are the overflow of each format no wider than its own."""
    total = [sum(r[c] for r in rows) for c in range(WIDTH)]
    numel = max(total[NUMEL], 1.0)
    amax = max(r[AMAX] for r in rows)
    low = min(r[MIN_NONZERO] for r in rows)
    lost = {
        key: sum(r[NONFINITE] for r, d in zip(rows, dtypes, strict=True) if overflows_in(d, key))
        for key in FORMATS
    }
    formats = {
        key: FormatShare(
            overflow=(total[OVER[key]] + lost[key]) / numel,
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
        dtype=max(dtypes, key=lambda d: DTYPE_LARGEST.get(d, 0.0)),
    )


def module_numerics(
    names: list[str],
    kinds: list[str],
    owners: list[str],
    slots: list[tuple[int, str]],
    rows: list[list[float]],
    checks: list[float],
    dtypes: list[str],
) -> tuple[list[ModuleNumerics], tuple[str, str] | None]:
    """The modules measured this step, in the model's order, and the first (module, pass)
    whose tensor held an inf or NaN, in the order the step computed them.

    ``slots`` name each row of ``rows`` (a module's output or output gradient) and each value
    of ``checks`` (a weight gradient's largest magnitude, pass "weight"), in that order;
    ``owners`` extends ``names`` with the modules that own parameters but are not measured;
    ``dtypes`` names the format each row's tensor was computed in.
    A weight gradient's inf counts as its owner's backward pass."""
    grouped: dict[tuple[int, str], list[list[float]]] = {}
    formats: dict[tuple[int, str], list[str]] = {}
    first = None
    rows_left, checks_left, dtypes_left = iter(rows), iter(checks), iter(dtypes)
    for slot in slots:
        if slot[1] == "weight":
            largest = next(checks_left)
            if first is None and not math.isfinite(largest):
                first = (owners[slot[0]], "backward")
            continue
        row = next(rows_left)
        grouped.setdefault(slot, []).append(row)
        formats.setdefault(slot, []).append(next(dtypes_left))
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
                activation=_merge(fwd, formats[(index, "forward")]) if fwd else None,
                gradient=_merge(bwd, formats[(index, "backward")]) if bwd else None,
            )
        )
    return out, first
