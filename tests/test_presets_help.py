"""The presets' help says what m does beyond marking: it moves to the next preset."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import OptionList

from ampscope.tui.app import AmpscopeApp
from ampscope.tui.screens.help import HelpScreen
from ampscope.tui.screens.presets import PresetsScreen
from tests.helpers import run, select_preset, shown, terminal_output

pytestmark = pytest.mark.ui


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
def test_the_help_says_m_marks_and_moves_down_as_it_does(size, tmp_path: Path) -> None:
    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=size) as pilot:
            screen = await shown(pilot, app, PresetsScreen)
            select_preset(app, "fp32")
            await pilot.pause(0.2)
            options = screen.query_one("#preset-list", OptionList)
            before = options.highlighted
            await pilot.press("m")
            await pilot.pause(0.2)
            assert "fp32" in screen.draft.marked and options.highlighted == before + 1
            await pilot.press("question_mark")
            help_screen = await shown(pilot, app, HelpScreen)
            (row,) = [r for r in help_screen.rows if r[3] == "presets.mark"]
            assert row[1] == "Mark for sweep (again: unmark), then move down to the next preset"
            help_screen.query_one("#help-box").scroll_to_widget(
                help_screen.query_one("#help-keys"), animate=False
            )
            await pilot.pause(0.2)
            text = " ".join(terminal_output(app)[0].split())
            assert "then move down to the" in text

    run(go())
