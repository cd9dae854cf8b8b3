"""Every screen at 80x24 (an SSH window) and 120x40, from fixed data, against its snapshot.

``AMPSCOPE_UPDATE_SNAPSHOTS=1 python -m pytest tests/test_snapshots.py`` rewrites them; each
new one is looked at (``rsvg-convert tests/snapshots/NAME.svg -o NAME.png``) before it is
committed: every number has a unit and nothing is cut mid-word. Besides the comparison, each
test checks what a newcomer must see at that size.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ampscope.core import records
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.model.replay import RecordSource
from ampscope.tui.screens.compare import CompareScreen
from ampscope.tui.screens.dialogs import ConfirmDialog, TooSmallScreen
from ampscope.tui.screens.formats import FormatsScreen
from ampscope.tui.screens.help import HelpScreen
from ampscope.tui.screens.history import HistoryScreen
from ampscope.tui.screens.memory import MemoryScreen
from ampscope.tui.screens.presets import PresetsScreen
from ampscope.tui.screens.profile import ProfileScreen
from ampscope.tui.screens.run import RunScreen
from ampscope.tui.screens.save import SaveDialog
from ampscope.tui.screens.waiting import WaitingScreen
from ampscope.tui.widgets.key_bar import KeyBar
from ampscope.tui.widgets.plots import RunPlot
from tests.helpers import assert_snapshot, run, screen_capture, shown, wait_for
from tests.snapshot_runs import (
    FrozenSource,
    gpu_profile,
    gpu_run,
    underflow_run,
    write_history,
    write_profiled_runs,
    write_underflow_pair,
)

pytestmark = pytest.mark.ui

SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((120, 40), id="120x40")]


@pytest.fixture(autouse=True)
def _fixed_world(tmp_path: Path, monkeypatch) -> Path:
    """The same paths, clock zone and (absent) user files on every machine."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", "/home/you/.config")
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield tmp_path
    monkeypatch.delenv("TZ")
    time.tzset()


def app_for(**options) -> AmpscopeApp:
    return AmpscopeApp(runs_dir=Path("runs"), **options)


async def settle(pilot) -> None:
    for _ in range(3):
        await pilot.pause()


def footer(app) -> str:
    return app.screen.query_one(KeyBar).plain


def name(scene: str, size: tuple[int, int]) -> str:
    return f"{scene}-{size[0]}x{size[1]}"


@pytest.mark.parametrize("size", SIZES)
def test_presets(size) -> None:
    async def go() -> None:
        app = app_for()
        async with app.run_test(size=size) as pilot:
            screen = await shown(pilot, app, PresetsScreen)
            await settle(pilot)
            text = assert_snapshot(app, name("presets", size))
            keys = footer(app)
            assert keys.startswith("r Run") and "q Quit" in keys and "? Help" in keys
            assert "compile-reduce-overhead" in text  # whole, never wrapped
            screen.query_one("#field-steps").focus()  # typing: letters go to the field
            await settle(pilot)
            assert_snapshot(app, name("presets-editing", size))
            keys = footer(app)
            assert "^q Quit" in keys and "esc Done editing" in keys and "f1 Help" in keys

    run(go())


@pytest.mark.parametrize("size", SIZES)
def test_run_view_of_a_live_gpu_run(size) -> None:
    async def go() -> None:
        app = app_for()
        async with app.run_test(size=size) as pilot:
            await shown(pilot, app, PresetsScreen)
            screen = app.open_run(FrozenSource(gpu_run()))
            await shown(pilot, app, RunScreen)
            plots = list(screen.query(RunPlot))
            assert await wait_for(pilot, lambda: all(p.strips for p in plots), 5)
            await settle(pilot)
            text = assert_snapshot(app, name("run-gpu", size))
            titles = [p.title for p in plots]
            assert all(titles), titles  # every plot says what it shows, loss included
            assert "GPU 96%" in text or "GPU 9" in text
            keys = footer(app)
            assert keys.startswith("s Stop") and "q Quit" in keys and "? Help" in keys

    run(go())


@pytest.mark.parametrize("size", SIZES)
def test_profile_of_a_live_gpu_run(size) -> None:
    async def go() -> None:
        app = app_for()
        async with app.run_test(size=size) as pilot:
            await shown(pilot, app, PresetsScreen)
            state = gpu_run()
            state.ingest(gpu_profile())
            app.open_run(FrozenSource(state))
            await shown(pilot, app, RunScreen)
            app.push_screen(ProfileScreen(FrozenSource(state)))
            await shown(pilot, app, ProfileScreen)
            await settle(pilot)
            text = assert_snapshot(app, name("profile", size))
            assert "matmul (fp16)" in text and "43%" in text and "idle (no kernel)" in text
            assert "torch.compile" in text  # what would help most
            assert "esc Back" in footer(app)

    run(go())


@pytest.mark.parametrize("size", SIZES)
def test_run_view_of_the_underflow_demo(size) -> None:
    async def go() -> None:
        app = app_for()
        async with app.run_test(size=size) as pilot:
            await shown(pilot, app, PresetsScreen)
            screen = app.open_run(FrozenSource(underflow_run(), live=False))
            await shown(pilot, app, RunScreen)
            plots = list(screen.query(RunPlot))
            assert await wait_for(pilot, lambda: all(p.strips for p in plots), 5)
            await settle(pilot)
            text = assert_snapshot(app, name("run-underflow", size))
            assert "Grad zeros" in text and "45.0%" in text
            loss = screen.query_one("#plot-loss", RunPlot)
            assert "zeros" in loss.title
            memory = screen.query_one("#plot-mem", RunPlot)
            assert "325.5" not in memory.text and "0.02" not in memory.text  # no fake cliff

    run(go())


@pytest.mark.parametrize("size", SIZES)
def test_replay_of_a_finished_record_offers_no_engine_keys(size, tmp_path: Path) -> None:
    (record, *_rest) = write_history(tmp_path / "runs")

    async def go() -> None:
        app = app_for()
        async with app.run_test(size=size) as pilot:
            await shown(pilot, app, PresetsScreen)
            app.open_run(RecordSource.load(record))
            screen = await shown(pilot, app, RunScreen)
            await settle(pilot)
            assert_snapshot(app, name("run-record", size))
            # a record without host samples: its plot says so rather than stay blank
            assert "none recorded" in screen.query_one("#plot-util", RunPlot).text
            keys = footer(app)
            assert "Stop" not in keys and "Restart" not in keys and "esc Back" in keys

    run(go())


@pytest.mark.parametrize("size", SIZES)
def test_history_and_compare(size, tmp_path: Path) -> None:
    write_history(tmp_path / "runs")

    async def go() -> None:
        app = app_for()
        async with app.run_test(size=size) as pilot:
            await shown(pilot, app, PresetsScreen)
            await pilot.press("h")
            history = await shown(pilot, app, HistoryScreen)
            await settle(pilot)
            text = assert_snapshot(app, name("history", size))
            assert "History · 4 runs in runs" in text and "Runs in runs" not in text
            table = history.query_one("#history-table")
            await pilot.press("home")
            assert table.cursor_row == 0
            await pilot.press("end")
            assert table.cursor_row == 3
            await pilot.press("home")
            await pilot.press("space", "space", "space", "space", "c")
            compare = await shown(pilot, app, CompareScreen)
            assert compare.baseline == "fp32"
            await settle(pilot)
            assert_snapshot(app, name("compare", size))
            stopped = next(r for r in compare.rows if r.preset == "amp-fp16")
            assert stopped.status == "stopped" and stopped.step_ms is not None

    run(go())


@pytest.mark.parametrize("size", SIZES)
def test_compare_diffs_each_runs_last_profile_against_the_baselines(size, tmp_path: Path) -> None:
    paths = write_profiled_runs(tmp_path / "runs")

    async def go() -> None:
        app = app_for()
        async with app.run_test(size=size) as pilot:
            await shown(pilot, app, PresetsScreen)
            app.push_screen(CompareScreen([records.load_run(p) for p in paths]))
            compare = await shown(pilot, app, CompareScreen)
            await settle(pilot)
            text = assert_snapshot(app, name("compare-profile", size))
            # fp32's later profile (12.0 ms a step), not its first (15.0 ms)
            assert "fp32 \u2192 amp-bf16, 12.0 \u2192 7.00 ms/step: matmul \u221268 %" in text
            assert "No profile: amp-fp16 ('ampscope profile amp-fp16' or p in a live" in text
            assert "q Quit" in footer(app)  # nothing pushed off the bottom
            compare.query_one("#compare-table").move_cursor(row=1)
            await pilot.press("b")  # amp-bf16 is the baseline: the diff turns round
            await settle(pilot)
            profile = str(compare.query_one("#compare-profile").render())
            assert "amp-bf16 \u2192 fp32, 7.00 \u2192 12.0 ms/step: matmul +217 %" in profile

    run(go())


@pytest.mark.parametrize("size", SIZES)
def test_format_explorer_and_memory_plan(size) -> None:
    async def go() -> None:
        app = app_for()
        async with app.run_test(size=size) as pilot:
            await shown(pilot, app, PresetsScreen)
            await pilot.press("f")
            formats = await shown(pilot, app, FormatsScreen)
            table = formats.query_one("#formats-table")
            assert await wait_for(pilot, lambda: table.row_count > 0, 10)
            table.focus()
            await settle(pilot)
            text = assert_snapshot(app, name("formats-values", size))
            assert "65504 as fp64, bits" in text  # at 80 columns too
            await pilot.press("f")  # the Formats tab's key
            await settle(pilot)
            assert_snapshot(app, name("formats-facts", size))
            await pilot.press("escape")
            await shown(pilot, app, PresetsScreen)
            await pilot.press("p")
            memory = await shown(pilot, app, MemoryScreen)
            memory.query_one("#memory-table").focus()
            await settle(pilot)
            text = assert_snapshot(app, name("memory", size))
            assert "TRAIN" in text and "INFER" in text and "smallest GPU" in text  # at 80 too

    run(go())


@pytest.mark.parametrize("size", SIZES)
def test_help_confirm_and_save(size) -> None:
    async def go() -> None:
        app = app_for()
        async with app.run_test(size=size) as pilot:
            await shown(pilot, app, PresetsScreen)
            await pilot.press("question_mark")
            await shown(pilot, app, HelpScreen)
            await settle(pilot)
            text = assert_snapshot(app, name("help-presets", size))
            assert "presets.run" in text  # the id a keys.toml line uses
            await pilot.press("escape")
            await shown(pilot, app, PresetsScreen)
            app.push_screen(
                ConfirmDialog(
                    "fp32 is running at step 120. Starting amp-bf16 stops it (its record keeps "
                    "what it did so far). Stop it?",
                    yes="Stop it and start",
                )
            )
            await shown(pilot, app, ConfirmDialog)
            await settle(pilot)
            assert_snapshot(app, name("confirm", size))
            await pilot.press("n")
            await shown(pilot, app, PresetsScreen)
            await pilot.press("s")
            await shown(pilot, app, SaveDialog)
            await settle(pilot)
            assert_snapshot(app, name("save", size))

    run(go())


@pytest.mark.parametrize("size", SIZES)
def test_served_viewer_waiting(size) -> None:
    async def go() -> None:
        app = app_for(read_only=True, follow_live=True)
        async with app.run_test(size=size) as pilot:
            await shown(pilot, app, WaitingScreen)
            await settle(pilot)
            assert_snapshot(app, name("viewer-waiting", size))

    run(go())


def test_a_terminal_too_small_is_told_so_and_the_dashboard_comes_back() -> None:
    async def go() -> None:
        app = app_for()
        async with app.run_test(size=(40, 12)) as pilot:
            await shown(pilot, app, TooSmallScreen)
            await settle(pilot)
            text = assert_snapshot(app, "too-small-40x12")
            assert "terminal too small (need 64x20" in text
            await pilot.resize_terminal(80, 24)
            await shown(pilot, app, PresetsScreen)

    run(go())


SCENES = (
    "presets",
    "presets-editing",
    "run-gpu",
    "run-underflow",
    "run-record",
    "profile",
    "history",
    "compare",
    "compare-profile",
    "compare-underflow",
    "formats-values",
    "formats-facts",
    "memory",
    "machine",  # tests/test_machine_view.py
    "help-presets",
    "confirm",
    "save",
    "viewer-waiting",
    "numerics",  # tests/test_numerics_view.py
    "numerics-bf16-underflow",
    "plan",  # tests/test_plan_view.py
)


def test_every_scene_has_its_snapshots_and_no_snapshot_is_stray() -> None:
    """A scene renamed or dropped leaves no snapshot behind; a new one needs both sizes."""
    folder = Path(__file__).parent / "snapshots"
    expected = {f"{scene}-{w}x{h}" for scene in SCENES for w, h in ((80, 24), (120, 40))}
    expected.add("too-small-40x12")
    assert {p.stem for p in folder.glob("*.txt")} == expected
    assert {p.stem for p in folder.glob("*.svg")} == expected


@pytest.mark.parametrize("size", SIZES)
def test_compare_shows_what_differs_first_and_scrolls_to_the_rest(size, tmp_path: Path) -> None:
    """The underflow demonstration's sweep: grad zeros, skipped steps and the final loss (where
    the two runs differ) come right after the preset at 80x24 as at 120x40; columns equal in
    both runs are last, named in the title, and right scrolls to them (the preset stays)."""
    paths = write_underflow_pair(tmp_path / "runs")

    async def go() -> None:
        app = app_for()
        async with app.run_test(size=size) as pilot:
            await shown(pilot, app, PresetsScreen)
            app.push_screen(CompareScreen([records.load_run(p) for p in paths]))
            compare = await shown(pilot, app, CompareScreen)
            await settle(pilot)
            text = assert_snapshot(app, name("compare-underflow", size))
            header = next(line for line in text.splitlines() if "preset" in line)
            assert header.split()[1:6] == ["preset", "grad", "zeros", "skipped", "final"], header
            assert "85.0%" in text and "0.4%" in text and "0.7600" in text
            title = str(compare.query_one("#compare-title").render())
            if size == (80, 24):
                assert "→ " in title and "(←/→)" in title, title
                table = compare.query_one("#compare-table")
                for _ in range(20):
                    await pilot.press("right")
                await settle(pilot)
                scrolled = screen_capture(app, "compare")[0]
                head = next(line for line in scrolled.splitlines() if "preset" in line)
                last = compare.heads[-1]  # the last column, one equal in both runs, in view
                assert head.rstrip().endswith(last) and table.scroll_x == table.max_scroll_x
                assert "← " in str(compare.query_one("#compare-title").render())

    run(go())


def test_a_focused_fields_cursor_holds_still_with_animations_off() -> None:
    """The save dialog's snapshot came out in other colours at load 10: its field's cursor had
    blinked off in the half-second the capture took to come."""

    async def go() -> None:
        app = app_for()
        async with app.run_test(size=(80, 24)) as pilot:
            await shown(pilot, app, PresetsScreen)
            await pilot.press("s")
            await shown(pilot, app, SaveDialog)
            await settle(pilot)
            focused = screen_capture(app, "save")
            await pilot.pause(1.2)  # past two half-second blinks
            assert screen_capture(app, "save") == focused

    run(go())
