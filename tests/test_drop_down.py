"""The Presets form's drop-downs (ampscope/tui/widgets/drop_down.py) work as Textual's
Select does, by keys and by mouse, though their lists are made only when first opened."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
from textual.widget import Widget
from textual.widgets import Select

from ampscope.core import presets as cfg
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.private_apis import SelectOverlay
from ampscope.tui.screens.preset_form import field_id
from ampscope.tui.screens.presets import PresetsScreen
from tests.helpers import run, select_preset, shown

pytestmark = pytest.mark.ui


def shown_choices(select: Select) -> list[str]:
    overlay = select.query_one(SelectOverlay)
    return [str(overlay.get_option_at_index(i).prompt) for i in range(overlay.option_count)]


def test_keys_open_a_drop_down_move_pick_and_escape_closes_it(tmp_path: Path) -> None:
    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await shown(pilot, app, PresetsScreen)
            select_preset(app, "fp32")
            await pilot.pause()
            precision = screen.query_one("#" + field_id("precision"), Select)
            assert not precision.query(SelectOverlay)  # not made for the first screen
            precision.focus()
            await pilot.press("enter")
            assert precision.expanded and isinstance(app.focused, SelectOverlay)
            assert precision.query_one(".up-arrow").styles.display == "block"  # open: \u25b2
            assert precision.query_one(".down-arrow").styles.display == "none"
            choices = shown_choices(precision)
            assert choices == list(typing.get_args(cfg.Precision))
            assert app.focused.highlighted == choices.index("fp32")  # the value, highlighted
            await pilot.press("down", "enter")
            picked = choices[choices.index("fp32") + 1]
            assert precision.value == picked and not precision.expanded
            assert app.focused is precision
            await pilot.press("space", "down", "escape")
            assert not precision.expanded and precision.value == picked  # escape picks nothing
            assert app.focused is precision
            assert "edited" in str(screen.query_one("#preset-status").render())

    run(go())


def test_a_click_opens_a_drop_down_and_a_click_on_a_choice_picks_it(tmp_path: Path) -> None:
    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await shown(pilot, app, PresetsScreen)
            select_preset(app, "fp32")
            await pilot.pause()
            compile_ = screen.query_one("#" + field_id("compile"), Select)
            assert compile_.value == "off"
            await pilot.click(compile_)
            assert compile_.expanded
            choices = shown_choices(compile_)
            assert choices[0] == "off" and len(choices) > 1
            overlay = compile_.query_one(SelectOverlay)
            await pilot.click(overlay, offset=(2, 1 + 1))  # border row, then the second choice
            assert compile_.value == choices[1] and not compile_.expanded
            assert compile_.query_one(".up-arrow").styles.display == "none"  # closed: \u25bc
            assert compile_.query_one(".down-arrow").styles.display == "block"

    run(go())


def drawn(app: AmpscopeApp, widget: Widget) -> list[tuple[str, str]]:
    """The cells of the screen's line where ``widget`` starts, across it: each character and
    its style (colours, bold, reverse) as sent to the terminal."""
    region = widget.region
    update = app.screen._compositor.render_update(full=True, screen_stack=app._background_screens)
    cells = [
        (character, str(segment.style))
        for strip in update.strips[region.y]
        for segment in strip
        for character in segment.text
    ]
    return cells[region.x : region.right]


def test_a_drop_down_looks_the_same_before_and_after_its_list_is_made(tmp_path: Path) -> None:
    """Until first opened a drop-down draws its value and arrow itself, without the widgets
    Textual's Select has for them: the same cells, focused or not, as those widgets draw."""

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await shown(pilot, app, PresetsScreen)
            select_preset(app, "amp-fp16")
            await pilot.pause()
            grad_scaler = screen.query_one("#" + field_id("grad_scaler"), Select)
            precision = screen.query_one("#" + field_id("precision"), Select)
            assert not precision.query("#label") and not precision.query(".arrow")
            before = drawn(app, precision)
            assert "".join(c for c, _ in before).split() == ["amp-fp16", "\u25bc"]
            precision.focus()
            await pilot.pause()
            focused_before = drawn(app, precision)
            assert focused_before != before  # a focused field is drawn lit
            await pilot.press("enter", "escape")  # opened and closed: the list is made
            assert precision.query("#label") and app.focused is precision
            await pilot.pause()
            assert drawn(app, precision) == focused_before
            grad_scaler.focus()
            await pilot.pause()
            assert drawn(app, precision) == before

    run(go())
