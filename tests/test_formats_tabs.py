"""The Formats screen: each tab has a key, and each tab hands the focus to its content with the
first row lit, as a presenter expects."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable, Input, OptionList, Static, TabbedContent, Tabs

from ampscope.tui.app import AmpscopeApp
from ampscope.tui.screens.formats import FormatsScreen
from ampscope.tui.screens.presets import PresetsScreen
from tests import helpers
from tests.helpers import screen_capture, shown, wait_for


def footer(app) -> str:
    return screen_capture(app, "formats")[0].splitlines()[-1]


@pytest.mark.ui
@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
def test_each_tab_has_a_key_and_lights_its_first_row(tmp_path, size) -> None:
    """From the Presets list: f opens the screen with the value field focused; esc leaves it
    (the footer then names the tab keys); f shows the Formats table with its first row lit;
    d the Demos list with its first demo lit and shown, down the next; v goes back to the
    field. No shift+tab, no arrows on the tab bar."""

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=size) as pilot:
            await shown(pilot, app, PresetsScreen)
            await pilot.press("f")
            screen = await shown(pilot, app, FormatsScreen)
            tabs = screen.query_one("#formats-tabs", TabbedContent)
            assert await wait_for(pilot, lambda: isinstance(app.focused, Input), 5)
            await pilot.press("escape")  # out of the field: the letters are keys again
            await pilot.pause()
            assert all(k in footer(app) for k in ("v Values", "f Formats", "d Demos")), footer(app)

            await pilot.press("f")
            facts = screen.query_one("#facts-table", DataTable)
            assert await wait_for(pilot, lambda: app.focused is facts, 5)
            assert tabs.active == "tab-facts" and facts.cursor_type == "row"
            assert facts.cursor_row == 0 and facts.row_count > 0
            # what the lecture points at fits 80 columns: fp16's smallest subnormal, the range
            heads = [str(c.label) for c in facts.columns.values()]
            assert {"max", "min normal", "min subn.", "eps", "decades"} <= set(heads), heads
            fp16 = facts.get_row_at(4)
            assert fp16[0] == "fp16" and "5.96e-08" in fp16 and "12.04" in fp16
            note = str(screen.query_one("#facts-note", Static).render())
            hidden = "digits" if size[0] == 80 else "past the range"  # said, never just missing
            assert f"columns hidden: {hidden}" in note, note

            await pilot.press("d")
            demos = screen.query_one("#demo-list", OptionList)
            assert await wait_for(pilot, lambda: app.focused is demos, 5)
            assert tabs.active == "tab-demos" and demos.highlighted == 0
            text = screen.query_one("#demo-text", Static)
            assert await wait_for(pilot, lambda: "65504" in str(text.render()), 5)  # fp16-overflow
            await pilot.press("down")
            assert await wait_for(pilot, lambda: "subnormal" in str(text.render()), 5)

            await pilot.press("v")
            assert await wait_for(pilot, lambda: isinstance(app.focused, Input), 5)
            assert tabs.active == "tab-values"

    helpers.run(go())


@pytest.mark.ui
def test_a_click_or_arrow_on_the_tab_bar_still_hands_the_focus_to_the_tab(tmp_path) -> None:
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

    helpers.run(go())
