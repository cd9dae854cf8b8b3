"""The one store of a run's steps (and of its system samples): named columns in ring buffers.

Each event's fields are kept once, a column each, ``maxlen`` rows deep, so memory stays flat
however long a run is. The cards read the last few values of a column; a plot copies two
whole columns (a C-level copy of each ring, never a Python loop over events), and what it
must know of them (values missing, steps in order) is found by C-level passes too.
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
    0.0 where no axis could tell it from 0. It runs for each figure of each event: the
    usual case (a float or int in range) is one test."""
    kind = value.__class__
    if (kind is float or kind is int) and (
        PLOT_TINY <= value <= PLOT_MAX or -PLOT_MAX <= value <= -PLOT_TINY or value == 0  # type: ignore[operator]
    ):
        return value
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
    """Named columns of one length, each a ring of ``maxlen`` values (None where missing)."""

    def __init__(self, names: Sequence[str], maxlen: int) -> None:
        self.names = tuple(names)
        self.maxlen = maxlen
        self.rings: tuple[deque, ...] = tuple(deque(maxlen=maxlen) for _ in self.names)
        self._where = {name: i for i, name in enumerate(self.names)}
        self.added = 0  # rows ever added (the rings forget)
        self._ascending: dict[str, tuple[int, bool]] = {}  # name: (added, answer)

    def add(self, *values: object) -> None:
        """One row, a value a column in ``names``' order (it runs for every event: one
        C-level pass, no Python step per column)."""
        if len(values) != len(self.rings):
            raise ValueError(f"{len(values)} values for {len(self.rings)} columns")
        any(map(deque.append, self.rings, values))  # append returns None: every ring gets one
        self.added += 1

    def __len__(self) -> int:
        return len(self.rings[0])

    def __getitem__(self, name: str) -> deque:
        """The column ``name``, oldest value first (read it, never change it)."""
        return self.rings[self._where[name]]

    def ascending(self, name: str) -> bool:
        """The kept values of ``name`` are all there and never go down (steps, seconds: a
        chart then finds each pixel column's points by bisection). Found out once per row
        added, however many plots ask."""
        known = self._ascending.get(name)
        if known is not None and known[0] == self.added:
            return known[1]
        values = list(self[name])
        try:
            answer = values == sorted(values)  # C-level: a sorted list is one run to sort
        except TypeError:  # a None among them
            answer = False
        self._ascending[name] = (self.added, answer)
        return answer

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
        """The (x, y) pairs where both are present, as two lists (for the plotted columns,
        whose values are numbers or None)."""
        xs, ys = list(self[x]), list(self[y])
        whole_x = _numbers(xs)
        if whole_x and _numbers(ys):
            return xs, ys
        kept = list(map(operator.is_not, ys, repeat(None)) if whole_x else map(_both, xs, ys))
        return list(compress(xs, kept)), list(compress(ys, kept))


def _numbers(values: list) -> bool:
    """No None among ``values`` (numbers otherwise): a C-level sum, which a None stops."""
    try:
        sum(values)
    except TypeError:
        return False
    return True


def _present(value: object) -> bool:
    return value is not None


def _both(x: object, y: object) -> bool:
    return x is not None and y is not None
