"""One figure of every step (its time, its CPU time, its batch), in memory that does not grow
with the run: the values themselves while they are few, then logarithmic buckets.

The summary's figures are order statistics of the timed steps (median, p10, p90). Exact ones
need every value, and a run of ten million steps would hold 80 MB of them per figure. A
``Distribution`` keeps the values up to EXACT_VALUES (its figures are then exact), and past that
folds them into buckets whose edges lie a factor ``(1 + a) / (1 - a)`` apart, ``a`` being
ACCURACY: a quantile read from them is within ``a`` (relative) of the exact one, the
guarantee of DDSketch (Masson, Rim and Lee, VLDB 2019). Each bucket also keeps the smallest
and largest value it took, so a figure that is the same at every step (a batch of 8) comes
back exactly, and no figure lies outside the values seen. A distribution wider than
MAX_BUCKETS buckets (step times spread over more than some 60x) has every two neighbouring
buckets merged, which doubles ``a``: memory stays bounded whatever the values.

Values at or below zero share one bucket; NaN (a figure the step did not give) is left out.
Torch-free.
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections.abc import Iterable

import numpy as np

EXACT_VALUES = 1 << 16
"""Values kept as they are (512 kB); a distribution holding fewer gives exact figures."""
ACCURACY = 0.0005
"""Relative accuracy of a figure read from buckets, before any merging of neighbours."""
MAX_BUCKETS = 4096
"""Buckets kept at most (128 kB): beyond, neighbours merge and the accuracy halves."""

_LOG_GAMMA = math.log((1 + ACCURACY) / (1 - ACCURACY))
_LOW = np.int64(-(1 << 62))  # the bucket of values at or below zero
_HIGH = np.int64(1 << 62)  # the bucket of +inf


class Buckets:
    """Counts of values by logarithmic bucket, with each bucket's smallest and largest value.

    ``level``: how many times neighbours were merged (bucket width ``2**level`` base widths).
    """

    def __init__(self) -> None:
        self.level = 0
        self.keys = np.empty(0, dtype=np.int64)
        self.counts = np.empty(0, dtype=np.int64)
        self.low = np.empty(0, dtype=np.float64)
        self.high = np.empty(0, dtype=np.float64)

    def copy(self) -> Buckets:
        out = Buckets()
        out.level, out.keys, out.counts = self.level, self.keys.copy(), self.counts.copy()
        out.low, out.high = self.low.copy(), self.high.copy()
        return out

    def add(self, values: np.ndarray) -> None:
        """Fold ``values`` in (NaN left out)."""
        values = values[~np.isnan(values)]
        if not values.size:
            return
        keys = _keys(values, self.level)
        ones = np.ones(values.size, dtype=np.int64)
        self._merge(keys, ones, values, values)

    def merge(self, other: Buckets) -> None:
        """``other``'s counts added to these, at the coarser of the two levels."""
        other = other.copy()
        while other.level < self.level:
            other._coarsen()
        while self.level < other.level:
            self._coarsen()
        self._merge(other.keys, other.counts, other.low, other.high)

    def _merge(self, keys: np.ndarray, counts: np.ndarray, low: np.ndarray, high: np.ndarray):
        keys = np.concatenate([self.keys, keys])
        counts = np.concatenate([self.counts, counts])
        low = np.concatenate([self.low, low])
        high = np.concatenate([self.high, high])
        if not keys.size:
            return
        order = np.argsort(keys, kind="stable")
        keys, counts, low, high = keys[order], counts[order], low[order], high[order]
        starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
        self.keys = keys[starts]
        self.counts = np.add.reduceat(counts, starts)
        self.low = np.minimum.reduceat(low, starts)
        self.high = np.maximum.reduceat(high, starts)
        while self.keys.size > MAX_BUCKETS:
            self._coarsen()

    def _coarsen(self) -> None:
        """Every two neighbouring buckets become one: bucket ``k`` of the finer level lies in
        bucket ``ceil(k / 2)`` of the coarser."""
        self.level += 1
        plain = (self.keys != _LOW) & (self.keys != _HIGH)
        keys = self.keys.copy()
        keys[plain] = -((-keys[plain]) // 2)
        self.keys = np.empty(0, dtype=np.int64)
        counts, low, high = self.counts, self.low, self.high
        self.counts = np.empty(0, dtype=np.int64)
        self.low = np.empty(0, dtype=np.float64)
        self.high = np.empty(0, dtype=np.float64)
        self._merge(keys, counts, low, high)

    @property
    def count(self) -> int:
        return int(self.counts.sum())

    def at_ranks(self, ranks: Iterable[int]) -> list[float]:
        """The values at these ranks (0 = the smallest), each within the accuracy."""
        ends = np.cumsum(self.counts)
        width = _LOG_GAMMA * (1 << self.level)
        out = []
        for rank in ranks:
            i = int(np.searchsorted(ends, rank, side="right"))
            key, low, high = int(self.keys[i]), float(self.low[i]), float(self.high[i])
            if key in (_LOW, _HIGH) or low == high:
                out.append(low if key != _HIGH else high)
                continue
            middle = 2 * math.exp(key * width) / (math.exp(width) + 1)
            out.append(min(max(middle, low), high))
        return out


def _keys(values: np.ndarray, level: int) -> np.ndarray:
    """Each value's bucket: ``ceil(log(value) / width)`` for a positive finite value."""
    keys = np.full(values.size, _LOW, dtype=np.int64)
    positive = values > 0
    finite = positive & np.isfinite(values)
    width = _LOG_GAMMA * (1 << level)
    keys[finite] = np.ceil(np.log(values[finite]) / width).astype(np.int64)
    keys[positive & ~finite] = _HIGH
    return keys


class Distribution:
    """The values of one figure over some steps: exact while it holds under EXACT_VALUES."""

    __slots__ = ("add", "buckets", "dropped", "folded", "total", "values")

    def __init__(self) -> None:
        self.values = array("d")  # the values not yet folded into buckets
        self.add = self.values.append  # one value: the step's own cost, kept to one append
        self.buckets: Buckets | None = None
        self.total = 0.0  # the sum of the folded values
        self.folded = 0  # how many were folded
        self.dropped = 0  # NaN values met when folding (a figure not given)

    def settle(self) -> None:
        """Fold the values into buckets once there are EXACT_VALUES of them (the tally calls
        this every few thousand steps, so that ``add`` stays one append)."""
        if len(self.values) >= EXACT_VALUES:
            self._fold()

    def _fold(self) -> None:
        values = self.unfolded()
        del self.values[:]  # the same array: ``add`` appends to it
        known = values[~np.isnan(values)]
        self.total += float(known.sum())
        self.folded += known.size
        self.dropped += values.size - known.size
        buckets = self.buckets.copy() if self.buckets is not None else Buckets()
        buckets.add(known)
        self.buckets = buckets  # whole: a stop summing up from another thread reads old or new

    def unfolded(self) -> np.ndarray:
        """The values not yet in buckets, copied: a view of the array would make an ``add``
        from another thread (the run's loop, while a stop sums it up) fail to grow it."""
        return np.frombuffer(self.values.tobytes(), dtype=np.float64)

    @property
    def exact(self) -> bool:
        return self.buckets is None

    def __len__(self) -> int:
        """The values added (NaN among them)."""
        return self.folded + self.dropped + len(self.values)


def merged(parts: Iterable[Distribution]) -> Figures:
    """The figures of several distributions' values taken together."""
    parts = list(parts)
    if all(p.exact for p in parts):
        values = np.concatenate([np.empty(0)] + [p.unfolded() for p in parts])
        return Figures(np.sort(values[~np.isnan(values)]).tolist())
    buckets = Buckets()
    total = 0.0
    for part in parts:
        if part.buckets is not None:
            buckets.merge(part.buckets)
            total += part.total
        recent = part.unfolded()
        recent = recent[~np.isnan(recent)]
        total += float(recent.sum())
        buckets.add(recent)
    return Figures(buckets=buckets, total=total)


class Figures:
    """What the summary reads of a set of values: its count, sum, mean, median and percentiles.
    A percentile is the value at rank ``int(q * count)`` (0 the smallest), the median of an
    even count the mean of the middle two, as ``statistics.median`` has it."""

    def __init__(
        self,
        exact: list[float] | None = None,
        buckets: Buckets | None = None,
        total: float = 0.0,
    ) -> None:
        self.exact = exact  # sorted
        self.buckets = buckets
        self.count = len(exact) if exact is not None else buckets.count if buckets else 0
        self.total = math.fsum(exact) if exact is not None else total

    def __len__(self) -> int:
        return self.count

    def _at(self, *ranks: int) -> list[float]:
        if self.exact is not None:
            return [self.exact[r] for r in ranks]
        assert self.buckets is not None
        return self.buckets.at_ranks(ranks)

    def median(self) -> float | None:
        n = self.count
        if not n:
            return None
        if self.exact is not None:
            return statistics.median(self.exact)
        if n % 2:
            return self._at(n // 2)[0]
        below, above = self._at(n // 2 - 1, n // 2)
        return (below + above) / 2

    def quantile(self, q: float) -> float | None:
        """The value at rank ``int(q * count)`` (the last, for ``q`` = 1)."""
        if not self.count:
            return None
        return self._at(min(self.count - 1, int(q * self.count)))[0]

    def mean(self) -> float | None:
        return self.total / self.count if self.count else None
