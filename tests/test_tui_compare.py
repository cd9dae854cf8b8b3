"""Sweeps queued from the dashboard and the Compare screen."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from textual.widgets import Input

from ampscope.core import comparison, records
from ampscope.core.comparison import significance
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.screens.compare import FIT_ORDER, CompareScreen, column_order, compare_help
from ampscope.tui.screens.history import HistoryScreen
from ampscope.tui.screens.preset_form import field_id
from ampscope.tui.screens.presets import PresetsScreen
from ampscope.tui.widgets.overlay_plot import OverlayPlot
from tests.helpers import FAST, SIZE, run, select_preset, shown, wait_for

SHORT = [*FAST, "steps=6", "warmup_steps=2"]


@pytest.mark.subprocess
def test_a_queued_sweep_runs_in_order_and_ends_in_the_compare_screen(tmp_path: Path) -> None:
    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path, extra_overrides=SHORT)
        async with app.run_test(size=SIZE) as pilot:
            presets = await shown(pilot, app, PresetsScreen)
            select_preset(app, "fp32")
            await pilot.press("m")
            select_preset(app, "mlp-demo")  # marked as edited on the form: lr 0.02
            await pilot.pause()
            presets.query_one("#" + field_id("lr"), Input).value = "0.02"
            await pilot.pause()
            await pilot.press("m")
            assert "mlp-demo (lr 0.02)" in str(presets.query_one("#preset-status").render())
            await pilot.press("x", "x")  # 3 repeats (the default) -> 5 -> 1: one run each
            assert "1 run each" in str(presets.query_one("#preset-status").render())
            await pilot.press("w")
            assert await wait_for(pilot, lambda: app.run_manager.state is not None, 10)
            # the header says which run of the sweep it is (at load, the short first may be over)
            assert re.search(r"sweep [12]/2", app.run_manager.state.header())
            screen = await shown(pilot, app, CompareScreen, 120)
            table = screen.query_one("#compare-table")
            assert await wait_for(pilot, lambda: table.row_count == 2, 5)
            assert [r.preset for r in screen.rows] == ["fp32", "mlp-demo-edited"]
            assert screen.rows[0].speedup == 1.0  # fp32 is the baseline
            plot = screen.query_one("#compare-loss", OverlayPlot)
            assert [label for label, _, _ in plot.series] == ["fp32", "mlp-demo-edited"]
            assert all(len(xs) == 6 for _, xs, _ in plot.series)
            # b makes the highlighted row the baseline
            table.move_cursor(row=1)
            await pilot.press("b")
            assert screen.baseline == "mlp-demo-edited"
            assert next(r for r in screen.rows if r.preset == "mlp-demo-edited").speedup == 1.0
            (sweep,) = tmp_path.glob("*-sweep")
            data = json.loads((sweep / comparison.SWEEP_FILE).read_text())
            assert data["order"] == ["fp32", "mlp-demo-edited"] and len(data["rows"]) == 2
            edited = next(r for r in records.list_runs(tmp_path) if r.name.endswith("-edited"))
            assert edited.hello is not None and edited.hello.config["lr"] == 0.02

    run(go())


@pytest.mark.subprocess
def test_compare_marked_runs_from_the_history_and_sort(recorded_runs: Path) -> None:
    assert len(records.list_runs(recorded_runs)) == 2

    async def go() -> None:
        app = AmpscopeApp(runs_dir=recorded_runs)
        async with app.run_test(size=SIZE) as pilot:
            await shown(pilot, app, PresetsScreen)
            await pilot.press("h")
            history = await shown(pilot, app, HistoryScreen)
            assert await wait_for(pilot, lambda: len(history.paths) == 2, 5)
            await pilot.press("c")  # nothing marked, no sweep: a hint, no screen
            await pilot.pause()
            assert app.screen is history
            await pilot.press("space", "space", "c")
            screen = await shown(pilot, app, CompareScreen)
            assert [r.preset for r in screen.rows] == ["mlp-demo#1", "mlp-demo#2"]
            await pilot.press("o")  # sort by step time
            assert "sorted by step time" in str(screen.query_one("#compare-title").render())
            times = [r.step_ms for r in screen.rows]
            assert times == sorted(times)

    run(go())


@pytest.mark.unit
def test_compares_help_states_the_rule_that_significance_applies() -> None:
    assert compare_help(significance.LEVEL, significance.MIN_REPEATS) == CompareScreen.HELP
    assert "95 % confidence interval" in CompareScreen.HELP
    other = compare_help(0.9, 5)  # the level and the repeats are taken, not written in
    assert "90 % confidence interval" in other and "fewer than 5 repeats" in other
    assert "repeats 5 or more" in other and "--repeats 5'" in other
    assert "95" not in other and "3" not in other


@pytest.mark.unit
def test_columns_that_differ_come_first_the_demonstrations_figures_ahead() -> None:
    """The preset, then what differs (grad zeros, skipped, final loss before the rest), then
    the columns equal in every row, which are named as such; a lone run keeps FIT_ORDER."""
    heads = [title for title, _ in comparison.COLUMNS]
    same = {h: "x" for h in heads}
    a = dict(same, preset="a", speedup="1.00x", **{"grad zeros": "0.4%", "final loss": "0.26"})
    b = dict(same, preset="b", speedup="1.20x", **{"grad zeros": "85%", "final loss": "0.76"})
    order, equal = column_order(heads, [[a[h] for h in heads], [b[h] for h in heads]])
    shown = [heads[i] for i in order]
    assert shown[:4] == ["preset", "grad zeros", "final loss", "speedup"]
    assert sorted(shown) == sorted(heads) and "skipped" in equal and "speedup" not in equal
    assert set(shown[4:]) == set(equal)
    alone, none_equal = column_order(heads, [[a[h] for h in heads]])
    assert [heads[i] for i in alone] == list(FIT_ORDER) and none_equal == []
