"""Records of watched loops in the dashboard: History lists them, Compare takes them, and
a finished one replays."""

from __future__ import annotations

from pathlib import Path

import pytest

import ampscope
from tests.helpers import tiny_model
from tests.test_watch import train

pytestmark = pytest.mark.ui


def test_history_compare_and_replay_take_watched_runs(tmp_path: Path) -> None:
    from ampscope.tui.app import AmpscopeApp
    from ampscope.tui.screens.compare import CompareScreen
    from ampscope.tui.screens.history import HistoryScreen
    from ampscope.tui.screens.run import RunScreen
    from tests.helpers import SIZE, run, wait_for

    for name in ("mine-a", "mine-b"):
        model, opt = tiny_model()
        with ampscope.watch(model, opt, name=name, runs_dir=tmp_path, steps=6) as mon:
            train(mon, model, opt, steps=6)

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await pilot.press("h")
            await pilot.pause(0.3)
            assert isinstance(app.screen, HistoryScreen)
            table = app.screen.query_one("#history-table")
            rows = [table.get_row_at(i) for i in range(2)]
            assert sorted(str(r[0]).strip() for r in rows) == ["mine-a", "mine-b"]
            assert [str(r[2]) for r in rows] == ["ok", "ok"]  # preset, model, state
            await pilot.press("space", "down", "space", "c")
            await pilot.pause(0.5)
            compare = app.screen
            assert isinstance(compare, CompareScreen)
            assert sorted(r.preset for r in compare.rows) == ["mine-a", "mine-b"]
            assert all(r.status == "ok" and r.step_ms for r in compare.rows)
            await pilot.press("escape")
            await pilot.pause(0.2)
            await pilot.press("enter")  # a finished record: replayed
            await pilot.pause(0.5)
            screen = app.screen
            assert isinstance(screen, RunScreen) and screen.state.read_only
            assert await wait_for(pilot, lambda: screen.state.step_count == 6, 20)
            header = screen.state.header()
            assert "mine-" in header and "fp32" in header and "compile off" in header

    run(go())
