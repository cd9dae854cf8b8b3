"""benchmarks/overhead.py fails (a FAIL line, exit 1) when the reported step times leave the
host's work between steps out of the loop's wall time, as a step timed from its own start did."""

from __future__ import annotations

import sys

import pytest

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import overhead  # noqa: E402


@pytest.mark.unit
def test_step_times_that_cover_the_loop_pass() -> None:
    assert overhead.coverage_problems(0.9996, 0.993) == []


@pytest.mark.unit
@pytest.mark.parametrize(
    ("block", "loop", "says"),
    [
        (0.988, 0.999, "step_ms covers 98.8% of the engine loop's wall time (at least 99.5%)"),
        (0.93, 0.999, "step_ms covers 93.0%"),  # a launch-bound GPU model, timed from step start
        (0.999, 0.95, "engine.loop.train: step_ms covers 95.0% of its wall time (at least 98%)"),
    ],
)
def test_host_work_outside_the_step_time_is_a_failure(block: float, loop: float, says: str) -> None:
    problems = overhead.coverage_problems(block, loop)
    assert len(problems) == 1 and says in problems[0], problems
    assert "host work between steps falls outside the step time" in problems[0]


@pytest.mark.slow
def test_the_benchmark_exits_1_on_a_coverage_failure(monkeypatch, capsys) -> None:
    """main's end: the FAIL lines, then exit 1 (the figures come from the loops it times)."""
    monkeypatch.setattr(overhead, "print_ratios", lambda per_step, covered: 0.95)
    monkeypatch.setattr(overhead, "print_loop_coverage", lambda setup, writer, steps: 0.999)
    monkeypatch.setattr(overhead, "print_emission_cost", lambda writer, sink: None)
    tiny = ["--set", "device='cpu'", "--set", "workload.width=16", "--set", "batch_size=4"]
    argv = ["overhead.py", "mlp-demo", *tiny, "--blocks", "1", "--block-steps", "1"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_:
        overhead.main()
    assert exit_.value.code == 1
    assert "FAIL step_ms covers 95.0%" in capsys.readouterr().out
