"""The one store of a run's steps (and of its system samples): named columns in ring buffers.

Each event's fields are kept once, a column each, ``maxlen`` rows deep, so memory stays flat
however long a run is. The cards read the last few values of a column; a plot copies two
whole columns (a C-level copy of each ring, never a Python loop over events). What a plot
needs to know about a column before it draws (does it miss values, does it only go up) is
counted as rows come and go, so that a redraw does not scan the column to find out.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Iterator, Sequence
from itertools import compress, islice, repeat

PLOT_MAX = 1e15
"""Larger magnitudes (1e308 from a record, inf) are left out of plots: an axis that must span
them has no ticks to show, and no step time, loss or MiB figure gets there."""
PLOT_TINY = 1e-12
"""Smaller magnitudes are drawn as 0: no axis label can tell them apart from it."""


def plot_value(value: float | None) -> float | None:
    """``value`` as a plot draws it: None where no plot can (not finite, beyond PLOT_MAX),
    0.0 where no axis could tell it from 0."""
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if not -PLOT_MAX <= value <= PLOT_MAX:  # NaN fails this too
        return None
    return 0.0 if -PLOT_TINY < value < PLOT_TINY else value


STEP_COLUMNS = (
    "step",
    "t",
    "step_ms",
    "profiled",
    "data_ms",
    "samples_per_s",
    "tokens_per_s",
    "tflops",
    "mfu",
    "loss",
    "log2_scale",
    "alloc",
    "resv",
    "grad_zero_pct",
)
"""Per step event. The plotted ones (step, t, step_ms, loss, log2_scale, alloc, resv,
grad_zero_pct) hold ``plot_value``s: None where a plot cannot draw the event's figure (a
non-finite loss, no scaler). The rest hold the event's own values, for the cards."""
SYS_COLUMNS = ("t", "gpu", "cpu", "engine_cores", "device_used", "device_total")
"""Per sys event, every one a ``plot_value``. ``engine_cores``: the engine process's CPU in
cores (100 % = 1)."""


class Columns:
    """Named columns of one length, each a ring of ``maxlen`` values (None where missing).

    ``ordered`` names the columns plots draw against (steps, seconds): for those it is known
    at any time whether the kept values only go up.
    """

    def __init__(self, names: Sequence[str], maxlen: int, ordered: Sequence[str] = ()) -> None:
        self.names = tuple(names)
        self.maxlen = maxlen
        self.rings: tuple[deque, ...] = tuple(deque(maxlen=maxlen) for _ in self.names)
        self._where = {name: i for i, name in enumerate(self.names)}
        self._missing = [0] * len(self.names)  # None values each ring holds
        self._ordered = tuple(self._where[name] for name in ordered)
        self._descents = [0] * len(self.names)  # places where a value is below the one before

    def add(self, *values: object) -> None:
        rings, missing = self.rings, self._missing
        if len(rings[0]) == self.maxlen:  # full: the oldest row goes
            for i in self._ordered:
                ring = rings[i]
                if _descends(ring[0], ring[1]):
                    self._descents[i] -= 1
            for i, ring in enumerate(rings):
                if ring[0] is None:
                    missing[i] -= 1
        for i in self._ordered:
            ring = rings[i]
            if ring and _descends(ring[-1], values[i]):
                self._descents[i] += 1
        for i, (ring, value) in enumerate(zip(rings, values, strict=True)):
            if value is None:
                missing[i] += 1
            ring.append(value)

    def __len__(self) -> int:
        return len(self.rings[0])

    def __getitem__(self, name: str) -> deque:
        """The column ``name``, oldest value first (read it, never change it)."""
        return self.rings[self._where[name]]

    def missing(self, name: str) -> int:
        """How many of the kept rows have no value in ``name``."""
        return self._missing[self._where[name]]

    def ascending(self, name: str) -> bool:
        """The kept values of ``name`` (an ``ordered`` column) never go down."""
        i = self._where[name]
        return self._missing[i] == 0 and self._descents[i] == 0

    def last(self, name: str, n: int) -> list:
        """The last ``n`` values of ``name`` (None included), oldest first."""
        values = list(islice(reversed(self[name]), n))
        values.reverse()
        return values

    def recent(self, name: str, n: int, unless: str | None = None) -> list:
        """The last ``n`` present values of ``name``, newest first, leaving out the rows whose
        ``unless`` column is true."""
        values: Iterator = reversed(self[name])
        if unless is not None:
            values = compress(values, map(operator.not_, reversed(self[unless])))
        return list(islice(filter(_present, values), n))

    def series(self, x: str, y: str) -> tuple[list, list]:
        """The (x, y) pairs where both are present, as two lists."""
        xs, ys = self[x], self[y]
        if not self.missing(x) and not self.missing(y):
            return list(xs), list(ys)
        if self.missing(x):
            kept = list(map(_both, xs, ys))
        else:
            kept = list(map(operator.is_not, ys, repeat(None)))
        return list(compress(xs, kept)), list(compress(ys, kept))


def _present(value: object) -> bool:
    return value is not None


def _both(x: object, y: object) -> bool:
    return x is not None and y is not None


def _descends(before: object, after: object) -> bool:
    return before is not None and after is not None and after < before  # type: ignore[operator]
