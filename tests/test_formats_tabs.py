"""The Formats screen: changing tab from the tab bar hands the focus to the tab's content."""

from __future__ import annotations

import pytest
from textual.widgets import OptionList, Static, Tabs

from ampscope.tui.app import AmpscopeApp
from ampscope.tui.screens.formats import FormatsScreen
from ampscope.tui.screens.presets import PresetsScreen
from tests import helpers
from tests.helpers import shown, wait_for


@pytest.mark.ui
def test_right_on_the_tab_bar_then_down_and_enter_runs_a_demo(tmp_path) -> None:
    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await shown(pilot, app, PresetsScreen)
            await app.push_screen(FormatsScreen())
            screen = await shown(pilot, app, FormatsScreen)
            await pilot.pause()
            for _ in range(2):  # Values -> Formats -> Demos, from the tab bar each time
                screen.query_one(Tabs).focus()
                await pilot.pause()
                await pilot.press("right")
                await pilot.pause()
            demos = screen.query_one("#demo-list", OptionList)
            assert await wait_for(pilot, lambda: app.focused is demos, 5)
            await pilot.press("down", "enter")
            text = screen.query_one("#demo-text", Static)
            assert await wait_for(pilot, lambda: str(text.render()).strip() != "", 5)
            assert "tab bar" in FormatsScreen.HELP

    helpers.run(go())
