"""The dashboard's number-format explorer and memory planner screens."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from ampscope.cli.main import main
from ampscope.core.units import fmt_bytes
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.screens.formats import VALUE_COLUMNS, FormatsScreen
from ampscope.tui.screens.memory import MemoryScreen
from ampscope.tui.screens.presets import PresetsScreen
from ampscope.tui.widgets.key_bar import KeyBar
from tests.helpers import SIZE, run, screen_capture, select_preset, shown, text, wait_for


def cells(table, column: int | str) -> list[str]:
    """A column's cells, by index or by header (the memory plan shows what fits, in its order)."""
    if isinstance(column, str):
        column = [str(c.label) for c in table.columns.values()].index(column)
    return [str(table.get_row_at(i)[column]) for i in range(table.row_count)]


@pytest.mark.ui
def test_format_explorer_shows_overflow_underflow_and_the_demos(tmp_path: Path) -> None:
    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await shown(pilot, app, PresetsScreen)
            await pilot.press("f")
            screen = await shown(pilot, app, FormatsScreen)
            box = screen.query_one("#formats-input")
            table = screen.query_one("#formats-table")
            assert await wait_for(pilot, lambda: table.row_count > 0, 5)
            box.value = "65520, 1e-8"
            await pilot.press("enter")
            assert await wait_for(pilot, lambda: {"65520", "1e-8"} == set(cells(table, 0)), 5)
            rows = {(r[0], r[1]): r for r in (table.get_row_at(i) for i in range(table.row_count))}
            # each cell sits under its own header
            heads = [str(c.label) for c in table.columns.values()]
            stored, flags = (heads.index(h) for h in ("stored", "flags"))
            assert heads == list(VALUE_COLUMNS)
            assert rows[("65520", "fp16")][stored] == "inf"
            assert "overflow" in str(rows[("65520", "fp16")][flags])
            assert rows[("1e-8", "fp16")][stored] == "0"
            assert "underflow" in str(rows[("1e-8", "fp16")][flags])
            assert rows[("1e-8", "bf16")][stored] != "0"
            # the highlighted row's bits, spelled out under the table
            fp16 = list(rows).index(("1e-8", "fp16"))
            table.move_cursor(row=fp16)
            assert await wait_for(
                pilot, lambda: "0|00000|0000000000" in text(screen, "#formats-bits")
            )
            assert "1e-8 as fp16" in text(screen, "#formats-bits")
            box.value = "1 + banana"
            await pilot.press("enter")
            assert await wait_for(pilot, lambda: "banana" in text(screen, "#formats-error"), 5)
            demos = screen.query_one("#demo-list")
            demos.highlighted = 0
            demos.action_select()
            assert await wait_for(pilot, lambda: "65504" in text(screen, "#demo-text"), 5)
            # esc says what it does: out of the field first, then back
            screen.query_one("#formats-tabs").active = "tab-values"
            box.focus()
            await pilot.pause()
            keys = screen.query_one(KeyBar).plain
            assert "esc Done editing" in keys and "Back" not in keys
            await pilot.press("escape")
            assert screen.focused is table and "esc Back" in screen.query_one(KeyBar).plain
            await pilot.press("escape")
            await shown(pilot, app, PresetsScreen)

    run(go())


@pytest.mark.ui
def test_memory_planner_from_a_preset_and_from_a_count(tmp_path: Path) -> None:
    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=(200, 40)) as pilot:  # wide: every column shows
            presets = await shown(pilot, app, PresetsScreen)
            select_preset(app, "fp32")
            assert await wait_for(pilot, lambda: getattr(presets.current, "name", "") == "fp32")
            await pilot.press("p")
            screen = await shown(pilot, app, MemoryScreen)
            table = screen.query_one("#memory-table")
            assert await wait_for(pilot, lambda: "preset fp32" in text(screen, "#memory-title"))
            assert all(a != "-" for a in cells(table, "activ."))  # a transformer shape
            assert all(a != "-" for a in cells(table, "logits"))  # and the loss's logits
            # The same figures as `ampscope memory --preset fp32` (its GPU size).
            train = dict(zip(cells(table, "regime"), cells(table, "TRAIN"), strict=True))
            assert train["fp32"] == fmt_bytes(cli_train_total("fp32", "fp32"))
            assert "SDPA flash" in text(screen, "#memory-title")
            params = screen.query_one("#memory-params")
            params.value = "7B"
            await pilot.press("enter")
            assert await wait_for(pilot, lambda: "7B parameters" in text(screen, "#memory-title"))
            bpp = dict(zip(cells(table, "regime"), cells(table, "B/param"), strict=True))
            assert bpp["fp32"] == "16/4" and bpp["pure bf16"] == "8/2"
            params.value = "banana"
            await pilot.press("enter")
            assert await wait_for(pilot, lambda: "banana" in text(screen, "#memory-error"), 5)

    run(go())


def cli_train_total(preset: str, regime: str) -> int:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["memory", "--preset", preset, "--json"]) == 0
    return next(r for r in json.loads(out.getvalue())["regimes"] if r["regime"] == regime)[
        "train_total"
    ]


@pytest.mark.ui
def test_the_memory_plan_shows_every_column_at_120x40_and_scrolls_to_them_at_80x24(
    tmp_path: Path,
) -> None:
    """casts, activations and logits are most of the total: never silently cut."""
    heads = ["casts", "activ.", "logits"]

    async def go(size: tuple[int, int]) -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=size) as pilot:
            await shown(pilot, app, PresetsScreen)
            select_preset(app, "fp32")
            await pilot.press("p")
            screen = await shown(pilot, app, MemoryScreen)
            assert await wait_for(pilot, lambda: "preset fp32" in text(screen, "#memory-title"))
            table = screen.query_one("#memory-table")
            table.focus()
            await pilot.pause()
            header = screen_text(app)
            more = screen.query_one("#memory-more")
            if size == (120, 40):
                assert all(h in header for h in heads) and not more.display
                assert cells(table, "TRAIN")[0] == "19.1G"  # compact: the sizes' units shortened
                return
            assert more.display and "→ master, optim., casts, activ., logits" in text(
                screen, "#memory-more"
            )
            assert not any(h in header for h in heads)
            for _ in range(12):
                await pilot.press("right")
            await pilot.pause()
            scrolled = screen_text(app)
            assert all(h in scrolled for h in heads) and "regime" in scrolled  # regime stays
            assert "← B/param, TRAIN, INFER, smallest GPU" in text(screen, "#memory-more")

    run(go((120, 40)))
    run(go((80, 24)))


def screen_text(app) -> str:
    """The table's header line as the screen shows it."""
    return next(line for line in screen_capture(app, "memory")[0].splitlines() if "regime" in line)
