"""The dashboard's number-format explorer and memory planner screens."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from ampscope.cli.main import main
from ampscope.core.units import fmt_bytes
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.screens.formats import FormatsScreen
from ampscope.tui.screens.memory import MemoryScreen
from tests.helpers import SIZE, run, select_preset


def cells(table, column: int) -> list[str]:
    return [str(table.get_row_at(i)[column]) for i in range(table.row_count)]


def test_format_explorer_shows_overflow_underflow_and_the_demos(tmp_path: Path) -> None:
    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await pilot.press("f")
            await pilot.pause(0.3)
            screen = app.screen
            assert isinstance(screen, FormatsScreen)
            box = screen.query_one("#formats-input")
            box.value = "65520, 1e-8"
            await pilot.press("enter")
            await pilot.pause(0.2)
            table = screen.query_one("#formats-table")
            rows = {(r[0], r[1]): r for r in (table.get_row_at(i) for i in range(table.row_count))}
            assert rows[("65520", "fp16")][2] == "inf" and "overflow" in str(
                rows[("65520", "fp16")][3]
            )
            assert rows[("1e-8", "fp16")][2] == "0" and "underflow" in str(
                rows[("1e-8", "fp16")][3]
            )
            assert rows[("1e-8", "bf16")][2] != "0"
            box.value = "1 + banana"
            await pilot.press("enter")
            await pilot.pause(0.2)
            assert "banana" in str(screen.query_one("#formats-error").render())
            demos = screen.query_one("#demo-list")
            demos.highlighted = 0
            demos.action_select()
            await pilot.pause(0.2)
            assert "65504" in str(screen.query_one("#demo-text").render())

    run(go())


def test_memory_planner_from_a_preset_and_from_a_count(tmp_path: Path) -> None:
    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            select_preset(app, "fp32")
            await pilot.press("p")
            await pilot.pause(0.3)
            screen = app.screen
            assert isinstance(screen, MemoryScreen)
            table = screen.query_one("#memory-table")
            assert "preset fp32" in str(screen.query_one("#memory-title").render())
            assert all(a != "-" for a in cells(table, 7))  # a transformer shape: activations
            assert all(a != "-" for a in cells(table, 8))  # and the loss's logits
            # The same figures as `ampscope memory --preset fp32` (its GPU size).
            train = dict(zip(cells(table, 0), cells(table, 9), strict=True))
            assert train["fp32"] == fmt_bytes(cli_train_total("fp32", "fp32"))
            assert "SDPA flash" in str(screen.query_one("#memory-title").render())
            params = screen.query_one("#memory-params")
            params.value = "7B"
            await pilot.press("enter")
            await pilot.pause(0.2)
            bpp = dict(zip(cells(table, 0), cells(table, 1), strict=True))
            assert bpp["fp32"] == "16/4" and bpp["pure bf16"] == "8/2"
            params.value = "banana"
            await pilot.press("enter")
            await pilot.pause(0.2)
            assert "banana" in str(screen.query_one("#memory-error").render())

    run(go())


def cli_train_total(preset: str, regime: str) -> int:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["memory", "--preset", preset, "--json"]) == 0
    return next(r for r in json.loads(out.getvalue())["regimes"] if r["regime"] == regime)[
        "train_total"
    ]
