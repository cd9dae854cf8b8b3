"""The speed verdict on simulated benches with a known truth, and the t quantiles it rests on."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ampscope.core.comparison import significance
from tests.helpers import ROOT, RUN_SIGMA, verdict_rate

TRIALS = 4000
REPEATS = (1, 2, 3, 5, 10)


def t_cdf(x: float, df: int, intervals: int = 4000) -> float:
    """Student's t distribution function by Simpson's rule on its density (an independent check)."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def density(t: float) -> float:
        return c * (1 + t * t / df) ** (-(df + 1) / 2)

    h = x / intervals
    inner = sum((4 if i % 2 else 2) * density(i * h) for i in range(1, intervals))
    return 0.5 + h / 3 * (density(0.0) + inner + density(x))


@pytest.mark.unit
@pytest.mark.parametrize("df", [*range(1, 31), 31, 40, 60, 120, 1000])
def test_t_quantiles_match_the_t_distribution(df: int) -> None:
    assert t_cdf(significance.t_quantile_975(df), df) == pytest.approx(0.975, abs=2e-4)


@pytest.mark.unit
def test_fewer_than_three_repeats_give_no_verdict() -> None:
    assert significance.speed_up([100.0], [50.0]) is None
    assert significance.speed_up([100.0, 101.0], [50.0, 50.5]) is None
    assert significance.speed_up([100.0, None, 99.0, 98.0], [50.0, 49.0, None, 51.0]) is None
    tested = significance.speed_up([100.0, 101.0, 99.0], [50.0, 50.5, 49.5])
    assert tested is not None and tested.significant and tested.ratio == pytest.approx(2.0)
    same = significance.speed_up([100.0, 101.0, 99.0], [100.0, 101.0, 99.0])
    assert same is not None and not same.significant and same.ratio == 1.0


def rate_table() -> list[tuple[int, float, float]]:
    """(repeats, false-positive rate on identical presets, power on a true 2-sigma speed-up)."""
    return [
        (r, verdict_rate(r, 0.0, TRIALS, seed=1), verdict_rate(r, 2 * RUN_SIGMA, TRIALS, seed=2))
        for r in REPEATS
    ]


def readme_rows(table: list[tuple[int, float, float]]) -> list[str]:
    return [
        f"| {r} | {fp:.1%} | {power:.0%} |"
        if r >= significance.MIN_REPEATS
        else f"| {r} | {fp:.0%} (no verdict) | {power:.0%} (no verdict) |"
        for r, fp, power in table
    ]


@pytest.mark.slow  # 4,000 simulated benches a cell: tens of seconds, out of the quick tier
def test_false_positives_stay_under_five_percent_and_power_rises_with_repeats() -> None:
    """4,000 simulated benches per cell, each through row_from_runs and compare.

    Identical presets: the rule may call a difference at most 5 % of the time (the nominal
    rate of a 95 % interval; one or two repeats never call one). A preset truly faster by
    twice the run-to-run spread: found more often the more repeats are run. The README's
    table is this one, so it cannot drift from what the code does.
    """
    table = rate_table()
    for repeats, false_positives, _ in table:
        assert false_positives <= 0.05, (repeats, false_positives)
        if repeats < significance.MIN_REPEATS:
            assert false_positives == 0.0
    powers = [power for repeats, _, power in table if repeats >= significance.MIN_REPEATS]
    assert powers == sorted(powers) and powers[-1] > 0.9, powers
    readme = (Path(ROOT) / "docs" / "accuracy.md").read_text()
    for line in readme_rows(table):
        assert line in readme, f"docs/accuracy.md lacks the measured row {line!r}"
