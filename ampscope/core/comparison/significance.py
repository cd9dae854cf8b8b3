"""Is one preset really faster than another? A confidence interval on the speed-up.

Step times inside one process are not independent evidence: clocks, caches, the allocator's
state and the compiled kernels are shared by every step of a run, so per-step spread says
nothing about how a second run would differ. The unit of evidence is a run. ``ampscope
bench --repeats K`` runs the presets interleaved (A B A B ...), so repeat k of every preset
saw the machine in about the same state. For each repeat the ratio of the two runs' median
step times is one observation of the speed-up; their logarithms are averaged and a t
interval (Student, K-1 degrees of freedom) is put around the mean. exp() of its ends is a
95 % confidence interval on the geometric-mean speed-up. A difference is called only when
that interval excludes 1.0; fewer than three repeats give no verdict at all.

Pairing by repeat cancels a machine that drifts (thermal, other tenants) over the sweep;
the logarithm makes "2x faster" and "2x slower" symmetric. tests/test_significance.py runs
the rule on simulated benches with a known truth (false positives and power).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

LEVEL = 0.95
MIN_REPEATS = 3

# Two-sided 95 % quantiles of Student's t (t_0.975) for 1..30 degrees of freedom, from the
# standard tables (e.g. NIST/SEMATECH e-Handbook, table 1.3.6.7.2); checked in the tests by
# integrating the t density.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
_Z975 = 1.959964


def t_quantile_975(df: int) -> float:
    """t_0.975 with ``df`` degrees of freedom; beyond the table, a Cornish-Fisher expansion."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, not {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass(frozen=True)
class SpeedUp:
    """How many times faster the other preset is than the baseline, with a 95 % interval."""

    ratio: float  # geometric mean over the paired repeats
    low: float
    high: float
    pairs: int

    @property
    def significant(self) -> bool:
        return not self.low <= 1.0 <= self.high


def paired_medians(
    base: Sequence[float | None], other: Sequence[float | None]
) -> list[tuple[float, float]]:
    """Repeat k of the baseline with repeat k of the other; a failed run drops its pair."""
    return [
        (b, o)
        for b, o in zip(base, other, strict=False)
        if b is not None and o is not None and b > 0 and o > 0
    ]


def speed_up(base: Sequence[float | None], other: Sequence[float | None]) -> SpeedUp | None:
    """The speed-up of ``other`` over ``base`` from per-run median step times, or None.

    None when fewer than :data:`MIN_REPEATS` repeats pair up: with one or two runs there is
    no estimate of run-to-run variation, so no verdict.
    """
    pairs = paired_medians(base, other)
    if len(pairs) < MIN_REPEATS:
        return None
    logs = [math.log(b / o) for b, o in pairs]
    mean = statistics.fmean(logs)
    half = t_quantile_975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return SpeedUp(math.exp(mean), math.exp(mean - half), math.exp(mean + half), len(pairs))
