"""The Presets form's rows draw their field's name themselves (ampscope/tui/widgets/form_row.py):
what a user can do with a name is what a label let them do."""

from __future__ import annotations

from pathlib import Path

import pytest

from ampscope.tui.app import AmpscopeApp
from ampscope.tui.screens.preset_form import field_id
from ampscope.tui.screens.presets import PresetsScreen
from tests.helpers import run, shown

pytestmark = pytest.mark.ui


def test_a_mouse_selects_the_names_of_the_fields_as_text(tmp_path: Path) -> None:
    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await shown(pilot, app, PresetsScreen)
            row = screen.query_one("#" + field_id("steps")).parent
            x, y = row.region.x, row.region.y
            await pilot.mouse_down(offset=(x, y))
            await pilot.hover(offset=(x + 5, y + 1))  # to the next row's fifth cell
            await pilot.mouse_up(offset=(x + 5, y + 1))
            await pilot.pause()
            assert app.screen.get_selected_text() == "steps\nbatch"

    run(go())
