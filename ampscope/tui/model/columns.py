"""What the plots draw, kept column by column: a redraw copies lists instead of picking tuples.

A plot redraw reads every kept point of each of its series; from a ring of event tuples that
is a Python loop per series and redraw, from a ring per field it is a C-level copy.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

STEP_COLUMNS = ("step", "t", "step_ms", "loss", "log2_scale", "alloc", "resv", "grad_zero_pct")
"""Per step event. ``loss`` is None when not finite; ``log2_scale`` None without a scaler."""
SYS_COLUMNS = ("t", "gpu", "cpu", "engine_cores", "device_used", "device_total")
"""Per sys event. ``engine_cores``: the engine process's CPU in cores (100 % = 1)."""


class Columns:
    """Named columns of one length, each a ring of ``maxlen`` values (None where missing)."""

    def __init__(self, names: Sequence[str], maxlen: int) -> None:
        self.rings: tuple[deque[object], ...] = tuple(deque(maxlen=maxlen) for _ in names)
        self.by_name = dict(zip(names, self.rings, strict=True))

    def add(self, *values: object) -> None:
        for ring, value in zip(self.rings, values, strict=True):
            ring.append(value)

    def __len__(self) -> int:
        return len(self.rings[0])

    def series(self, x: str, y: str) -> tuple[list, list]:
        """The (x, y) pairs whose y is present, as two lists."""
        xs, ys = self.by_name[x], self.by_name[y]
        if None not in ys:
            return list(xs), list(ys)
        kept = [(a, b) for a, b in zip(xs, ys, strict=True) if b is not None]
        return [a for a, _ in kept], [b for _, b in kept]
