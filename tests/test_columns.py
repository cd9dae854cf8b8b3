"""The dashboard's one store of steps: named columns in rings, read by name."""

from __future__ import annotations

import math

import pytest

from ampscope.tui.model.columns import PLOT_MAX, Columns, plot_value

pytestmark = pytest.mark.unit


def test_a_row_lands_in_each_named_column_and_the_oldest_goes() -> None:
    kept = Columns(("step", "ms"), maxlen=3)
    for i in range(5):
        kept.add(i, 10.0 + i)
    assert len(kept) == 3 and kept.added == 5
    assert list(kept["step"]) == [2, 3, 4] and list(kept["ms"]) == [12.0, 13.0, 14.0]
    assert kept.last("ms", 2) == [13.0, 14.0] and kept.last("ms", 9) == [12.0, 13.0, 14.0]
    with pytest.raises(ValueError):
        kept.add(1.0)  # a value short: refused, never silently shifted


def test_a_series_leaves_out_the_rows_missing_either_value() -> None:
    kept = Columns(("step", "loss", "t"), maxlen=8)
    for i, loss, t in [(0, 1.0, 0.1), (1, None, 0.2), (2, 0.5, None), (3, 0.25, 0.4)]:
        kept.add(i, loss, t)
    assert kept.series("step", "loss") == ([0, 2, 3], [1.0, 0.5, 0.25])
    assert kept.series("t", "loss") == ([0.1, 0.4], [1.0, 0.25])
    assert kept.series("step", "t") == ([0, 1, 3], [0.1, 0.2, 0.4])


def test_the_recent_values_skip_the_missing_and_the_rows_left_out() -> None:
    kept = Columns(("ms", "profiled"), maxlen=8)
    for ms, profiled in [(10.0, False), (99.0, True), (None, False), (11.0, False)]:
        kept.add(ms, profiled)
    assert kept.recent("ms", 5) == [11.0, 99.0, 10.0]  # newest first
    assert kept.recent("ms", 5, unless="profiled") == [11.0, 10.0]
    assert kept.recent("ms", 1) == [11.0]


def test_steps_in_order_are_known_as_such_until_one_goes_back_or_is_missing() -> None:
    kept = Columns(("step",), maxlen=4)
    for i in range(6):
        kept.add(i)
    assert kept.ascending("step")
    kept.add(2)  # a step back (a restart written into the same record)
    assert not kept.ascending("step")
    for i in range(3, 6):
        kept.add(i)  # [2, 3, 4, 5]: the step back has left the ring
    assert kept.ascending("step")
    kept.add(None)
    assert not kept.ascending("step")


def test_a_plot_value_is_what_a_plot_can_draw() -> None:
    assert plot_value(12.5) == 12.5 and plot_value(3) == 3 and plot_value(0) == 0
    assert plot_value(-2.0) == -2.0 and plot_value(PLOT_MAX) == PLOT_MAX
    for undrawable in (None, math.inf, -math.inf, math.nan, 1e308, -1e16, "x"):
        assert plot_value(undrawable) is None  # type: ignore[arg-type]
    assert plot_value(1e-300) == 0.0 and plot_value(-5e-324) == 0.0  # no axis tells it from 0
    assert plot_value(2**62) is None  # bytes no axis spans
