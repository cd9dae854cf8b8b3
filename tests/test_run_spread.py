"""``ampscope run``'s summary says when its steps spread too widely for the median to stand
for them, as bench says when its repeats do."""

from __future__ import annotations

import io

import pytest

from ampscope.cli.console import ConsoleReporter
from tests.helpers import done

pytestmark = pytest.mark.unit


def summary_of(p10: float, median: float, p90: float) -> str:
    end = done()
    end.step_ms_p10, end.step_ms_median, end.step_ms_p90 = p10, median, p90
    result = io.StringIO()
    ConsoleReporter(out=io.StringIO(), result=result)(end)
    return result.getvalue()


def test_a_wide_spread_is_said_under_the_summary(monkeypatch) -> None:
    """A compiled run printed a median of 801 ms (p10-p90 65 ms-1.16 s) beside 36 ms eager,
    without a word: a class learned 'compile is 22x slower'."""
    monkeypatch.delenv("COLUMNS", raising=False)
    said = summary_of(65.0, 801.0, 1160.0)
    assert "801.0 ms" in said.split("The step times")[0]  # the summary's median, then the word
    assert (
        "The step times spread widely (p10-p90 65.0 ms-1.16 s, 17.8x apart): the median of "
        "801.0 ms is not a steady step time" in said
    )
    assert "ampscope bench" in said


def test_a_steady_run_gets_no_word_and_the_word_fits_the_terminal(monkeypatch) -> None:
    assert "spread widely" not in summary_of(35.0, 36.0, 41.0)
    monkeypatch.setenv("COLUMNS", "60")
    note = summary_of(65.0, 801.0, 1160.0).split("The step times", 1)[1]
    assert all(len(line) <= 60 for line in ("The step times" + note).splitlines())
