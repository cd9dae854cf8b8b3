"""Compare's step-time plot: a first step that compiled does not flatten the others."""

from __future__ import annotations

from pathlib import Path

import pytest

from ampscope.core import events as ev
from ampscope.core import records
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.model.figures import clip_outliers_across
from ampscope.tui.screens.compare import CompareScreen
from ampscope.tui.screens.presets import PresetsScreen
from ampscope.tui.widgets.overlay_plot import OverlayPlot
from tests.helpers import done, hello, run, shown, step, wait_for


def record(root: Path, preset: str, first: float, rest: float) -> records.RunRecord:
    run_dir = records.new_run_dir(root, preset)
    events: list[ev.Event] = [hello(preset=preset, run_dir=str(run_dir))]
    events += [step(i, first if i == 0 else rest) for i in range(12)]
    events.append(done("ok", 12))
    (run_dir / records.EVENTS_FILE).write_bytes(b"".join(ev.encode(e) for e in events))
    return records.load_run(run_dir)


@pytest.mark.unit
def test_the_ceiling_is_four_times_the_slowest_runs_median() -> None:
    series = [("a", [0, 1, 2, 3], [9000.0, 10.0, 10.0, 10.0]), ("b", [0, 1, 2, 3], [30.0] * 4)]
    clipped, ceiling, count = clip_outliers_across(series)
    assert ceiling == 120.0 and count == 1  # b's steady 30 ms is never cut
    assert clipped[0][2] == [120.0, 10.0, 10.0, 10.0] and clipped[1][2] == [30.0] * 4
    assert clip_outliers_across([("a", [0, 1, 2], [10.0, 11.0, 12.0])])[1:] == (None, 0)


@pytest.mark.ui
def test_compare_clips_compile_steps_and_says_so(tmp_path: Path) -> None:
    runs = [
        record(tmp_path, "compile-default", 25_000.0, 40.0),
        record(tmp_path, "amp-bf16", 900.0, 50.0),
    ]

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await shown(pilot, app, PresetsScreen)
            await app.push_screen(CompareScreen(runs))
            compare = await shown(pilot, app, CompareScreen)
            plot = compare.query_one("#compare-step", OverlayPlot)
            assert await wait_for(pilot, lambda: "▲" in plot.text, 5), plot.text
            assert "ms / step · 2 clipped ▲: ▞ compile-default ⢕ amp-bf16" in plot.text
            assert "25000" not in plot.text and "20000" not in plot.text  # the axis stays low
            loss = compare.query_one("#compare-loss", OverlayPlot)
            assert "▲" not in loss.text  # losses are never clipped

    run(go())
