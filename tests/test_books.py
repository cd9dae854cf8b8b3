"""A run's books (``core.records.tally``): the summary's figures by the one rule, exact for
short runs, within a stated accuracy for long ones, in memory that does not grow with the run."""

from __future__ import annotations

import math
import random
import statistics
import tracemalloc

import numpy as np
import pytest

from ampscope.core.records import distribution, summary
from ampscope.core.records.distribution import Distribution, merged
from ampscope.core.records.tally import SETTLE_EVERY, StepTally

pytestmark = pytest.mark.unit


def exact_figures(values: list[float]) -> tuple[float, float, float]:
    """Median, p10 and p90 as the summary takes them from every value."""
    ordered = sorted(values)
    n = len(ordered)
    return statistics.median(ordered), ordered[int(0.1 * n)], ordered[min(n - 1, int(0.9 * n))]


def test_the_timed_steps_are_the_summarys_rule_for_any_run() -> None:
    """The tally keeps steps by kind and chooses the kinds at the end: for runs of every length,
    warm-up, compile, profile and gradient-zero pattern it times exactly the steps
    ``summary.timed_steps`` names."""
    rng = random.Random(7)
    for _ in range(400):
        count, warmup = rng.randrange(0, 12), rng.randrange(0, 5)
        compiled = rng.random() < 0.3
        instrumented = {i for i in range(count) if rng.random() < 0.3}
        profiled = {i for i in range(count) if rng.random() < 0.2}
        times = [round(rng.uniform(1, 100), 3) for _ in range(count)]
        tally = StepTally(warmup, compiled)
        for i, ms in enumerate(times):
            tally.add(i, ms, 1.0, False, instrumented=i in instrumented, profiled=i in profiled)
        kept = summary.timed_steps(count, warmup, compiled, instrumented, profiled)
        assert tally.timed().exact == sorted(times[i] for i in kept), (count, warmup, compiled)


def test_a_short_run_gives_the_exact_figures() -> None:
    rng = random.Random(1)
    times = [rng.lognormvariate(math.log(20), 0.3) for _ in range(5000)]
    tally = StepTally(warmup_steps=0)
    for i, ms in enumerate(times):
        tally.add(i, ms, 2.0, False, cpu_ms=ms / 2)
    done = tally.done("ok", 1e9, None, samples=8)
    assert (done.step_ms_median, done.step_ms_p10, done.step_ms_p90) == exact_figures(times)
    assert done.cpu_ms_median == statistics.median(t / 2 for t in times)
    assert done.step_ms_mean == pytest.approx(statistics.fmean(times), rel=1e-12)
    assert done.samples_per_s == 8 * 1000 / done.step_ms_median


def test_a_long_run_is_within_the_stated_accuracy_of_the_exact_figures() -> None:
    """Simulated step times with a known truth: 300,000 steps whose second part runs three
    times slower (a later sample that differs) and a few stalls. The figures read from the
    buckets lie within ``ACCURACY`` of the exact order statistics of the same values."""
    rng = np.random.default_rng(3)
    times = np.concatenate(
        [rng.lognormal(math.log(10), 0.1, 120_000), rng.lognormal(math.log(30), 0.05, 180_000)]
    )
    times[::5000] = 2000.0  # a stall now and then
    tally = StepTally(warmup_steps=5)
    for i, ms in enumerate(times.tolist()):
        tally.add(i, ms, 1.0, False, samples=64)
    timed = times[5:].tolist()
    median, p10, p90 = exact_figures(timed)
    done = tally.done("ok", None, None)
    assert done.step_ms_median == pytest.approx(median, rel=distribution.ACCURACY)
    assert done.step_ms_p10 == pytest.approx(p10, rel=distribution.ACCURACY)
    assert done.step_ms_p90 == pytest.approx(p90, rel=distribution.ACCURACY)
    assert done.step_ms_median > 20  # the slower part is most of the run: the median moved
    assert done.step_ms_mean == pytest.approx(statistics.fmean(timed), rel=1e-9)  # a sum: exact
    assert done.samples_per_s == pytest.approx(64 * 1000 / done.step_ms_median, rel=1e-12)


def test_a_figure_the_same_every_step_stays_exact_in_buckets() -> None:
    figure = Distribution()
    for _ in range(3 * distribution.EXACT_VALUES):
        figure.add(8.0)
        figure.settle()
    assert not figure.exact
    shown = merged([figure])
    assert (shown.median(), shown.quantile(0.1), shown.quantile(0.9)) == (8.0, 8.0, 8.0)


def test_values_spread_too_wide_for_the_buckets_coarsen_them_and_stay_bounded() -> None:
    """Ten decades of values: neighbours merge (each merge doubles the accuracy's bound), and
    the buckets never outnumber MAX_BUCKETS."""
    rng = np.random.default_rng(5)
    values = np.exp(rng.uniform(math.log(1e-3), math.log(1e7), 200_000))
    figure = Distribution()
    for v in values.tolist():
        figure.add(v)
        figure.settle()
    assert figure.buckets is not None and figure.buckets.level > 0
    assert figure.buckets.keys.size <= distribution.MAX_BUCKETS
    accuracy = math.tanh(math.atanh(distribution.ACCURACY) * 2**figure.buckets.level)
    assert merged([figure]).median() == pytest.approx(np.median(values), rel=accuracy)


def test_the_books_of_a_long_run_stay_within_a_fixed_size() -> None:
    """What the tally holds after 150,000 steps (steps, CPU times, several ranks) is bounded by
    its constants, not by the run: the values not yet folded and the buckets."""
    tally = StepTally(warmup_steps=2)
    for i in range(150_000):
        ms = 10.0 + (i % 97) * 0.01
        tally.add(
            i,
            ms,
            1.0,
            False,
            cpu_ms=ms * 0.9,
            instrumented=i % 10 == 0,
            ranks=[(ms, 1 << 20), (ms * 1.01, 2 << 20)],
        )
    figures = [
        figure
        for kind in tally.kinds.values()
        for figure in (kind.step_ms, kind.cpu_ms, kind.samples, kind.tokens, *kind.ranks)
    ]
    assert len(tally.kinds) == 4  # first, warm-up, and later steps with and without zeros
    for figure in figures:
        assert len(figure.values) < distribution.EXACT_VALUES + SETTLE_EVERY
        assert figure.buckets is None or figure.buckets.keys.size <= distribution.MAX_BUCKETS
    ranks = tally.rank_done()
    assert ranks is not None and [r.mem_peak for r in ranks] == [1 << 20, 2 << 20]
    assert ranks[1].step_ms_median == pytest.approx(
        1.01 * tally.done("ok", None, None).step_ms_median, rel=2 * distribution.ACCURACY
    )


def test_the_memory_the_tally_holds_stops_growing_with_the_run() -> None:
    """Measured, not assumed: what tracemalloc counts the tally holding after 74,000 more
    steps is bounded by its buffers of unfolded values (two figures here), where the lists it
    replaced held 80 bytes a step (5.9 MB)."""
    tally = StepTally(warmup_steps=5)
    tracemalloc.start()
    try:
        for i in range(66_000):  # past the first fold
            tally.add(i, 1.0 + (i % 13) * 0.1, 1.0, False, cpu_ms=1.0, memory=i)
        before, _ = tracemalloc.get_traced_memory()
        for i in range(66_000, 140_000):
            tally.add(i, 1.0 + (i % 13) * 0.1, 1.0, False, cpu_ms=1.0, memory=i)
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    buffers = 2 * (distribution.EXACT_VALUES + SETTLE_EVERY) * 8 * 1.2  # arrays over-allocate
    assert after - before < buffers < 2 << 20
    assert tally.steps_done == 140_000 and tally.mem_peak == 139_999


def test_cpu_time_is_given_only_when_every_timed_step_has_one() -> None:
    tally = StepTally(warmup_steps=0)
    tally.add(0, 10.0, 1.0, False, cpu_ms=9.0)
    tally.add(1, 10.0, 1.0, False)  # a step timed on a GPU: no CPU time
    assert tally.cpu_ms_median() is None and tally.done("ok", None, None).cpu_ms_median is None


def test_a_run_held_up_now_and_then_says_what_it_delivered_beside_its_median_rate() -> None:
    """Four runs on two cores: most steps take 1 ms, one in twenty waits 100 ms for a core.
    The median step's 8k samples/s is not what the run delivered: the summary says both."""
    from ampscope.cli.console import summary_table

    contended = StepTally(warmup_steps=0)
    steady = StepTally(warmup_steps=0)
    for i in range(1000):
        contended.add(i, 100.0 if i % 20 == 0 else 1.0, 1.0, False)
        steady.add(i, 1.0 + (i % 3) * 0.01, 1.0, False)
    done = contended.done("ok", None, None, samples=8)
    assert done.step_ms_median == 1.0 and done.step_ms_mean == pytest.approx(5.95)
    delivered = summary.delivered_samples_per_s(done)
    assert delivered == pytest.approx(8 * 1000 / 5.95)  # the samples over the time they took
    shown = summary_table(done)
    assert "  throughput           8k samples/s at the median step\n" in shown
    assert "  delivered            1.34k samples/s (mean step 5.95 ms: slower steps" in shown
    calm = steady.done("ok", None, None, samples=8)
    assert summary.delivered_samples_per_s(calm) is None
    assert "delivered" not in summary_table(calm)
