"""At 80 columns, a table that cannot show every column says which ones it left out."""

from __future__ import annotations

from pathlib import Path

import pytest

from ampscope.core import records
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.screens.compare import CompareScreen
from ampscope.tui.screens.history import HistoryScreen
from ampscope.tui.screens.presets import PresetsScreen
from tests.helpers import history_of, run, shown, text, wait_for, write_finished_record

LONG = "a-preset-with-a-longer-name"


@pytest.mark.ui
def test_history_and_compare_at_80_columns_say_that_final_loss_is_hidden(tmp_path: Path) -> None:
    for ms in (10.0, 5.0):
        write_finished_record(tmp_path, LONG, ms)

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await shown(pilot, app, PresetsScreen)
            app.show_history()
            history = await shown(pilot, app, HistoryScreen)
            assert await wait_for(pilot, lambda: len(history.paths) == 2, 5)
            heads = [str(c.label) for c in history.query_one("#history-table").columns.values()]
            assert "final loss" not in heads
            assert "columns hidden: median step, final loss" in text(history, "#history-title")
            runs = [records.load_run(p) for p in history.paths.values()]
            app.push_screen(CompareScreen(runs))
            compare = await shown(pilot, app, CompareScreen)
            await pilot.pause()
            # Compare keeps every column, what differs first, and scrolls sideways to the rest
            heads = [str(c.label) for c in compare.query_one("#compare-table").columns.values()]
            assert heads[:2] == ["preset", "speedup"]  # the one figure that differs comes first
            assert len(heads) == len(set(heads)) == 15
            assert "→ " in text(compare, "#compare-title")
            assert "(←/→)" in text(compare, "#compare-title")
        # wide enough, nothing is hidden and nothing is said
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=(200, 40)) as pilot:
            await shown(pilot, app, PresetsScreen)
            app.show_history()
            history = await shown(pilot, app, HistoryScreen)
            assert await wait_for(pilot, lambda: len(history.paths) == 2, 5)
            assert "hidden" not in text(history, "#history-title")

    run(go())


@pytest.mark.ui
def test_a_long_preset_name_leaves_room_for_the_runs_state_at_120_columns(
    tmp_path: Path,
) -> None:
    """Before: a 100-character preset name took the row, and History hid the state column."""
    name = "x" * 100
    write_finished_record(tmp_path, name)

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            _history, table = await history_of(pilot, app, 1)
            heads = [str(c.label) for c in table.columns.values()]
            assert "state" in heads
            cell = str(table.get_row_at(0)[0])
            assert cell.strip().startswith("xxxx") and cell.endswith("…") and len(cell) <= 34

    run(go())


@pytest.mark.ui
def test_compare_scrolls_a_whole_column_a_press_beside_a_long_cell(tmp_path: Path) -> None:
    """At 80 columns, right and left scrolled a character a press: beside a long cell that
    was dozens of presses for one column. Each press now lands on a column's start."""
    from textual.widgets import DataTable

    from ampscope.tui.widgets.tables import column_scroll

    for ms in (10.0, 5.0):
        write_finished_record(tmp_path, LONG + "-" + "x" * 40, ms)

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await shown(pilot, app, PresetsScreen)
            runs = [records.load_run(p) for p in sorted(tmp_path.iterdir())]
            app.push_screen(CompareScreen(runs))
            compare = await shown(pilot, app, CompareScreen)
            await pilot.pause()
            table = compare.query_one(DataTable)
            starts = {sum(compare.widths[1:i]) for i in range(1, len(compare.widths))}
            seen = [table.scroll_x]
            for _ in range(3):
                await pilot.press("right")
                await pilot.pause()
                seen.append(table.scroll_x)
            assert seen[1] == compare.widths[1] and seen[2] == sum(compare.widths[1:3])
            assert all(x in starts or x == table.max_scroll_x for x in seen), seen
            await pilot.press("left")
            await pilot.pause()
            assert table.scroll_x == seen[2]
            assert "←" in text(compare, "#compare-title")  # the title follows the scroll

    run(go())
    assert column_scroll([10, 4, 6, 8], 0, 1) == 4 and column_scroll([10, 4, 6, 8], 5, 1) == 10
    assert column_scroll([10, 4, 6, 8], 5, -1) == 4 and column_scroll([10, 4, 6, 8], 0, -1) == 0
