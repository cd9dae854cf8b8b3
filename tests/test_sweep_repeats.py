"""A sweep from the dashboard with repeats: interleaved runs, one row a preset, a verdict."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from ampscope.core import comparison, records
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.model.run_manager import RunManager
from ampscope.tui.screens.compare import CompareScreen
from ampscope.tui.screens.history import HistoryScreen
from ampscope.tui.screens.presets import PresetsScreen
from ampscope.tui.widgets.key_bar import KeyBar
from tests.helpers import (
    FakeEngine,
    FakeListener,
    run,
    select_preset,
    shown,
    text,
    wait_for,
    write_finished_record,
)

SMALL = (80, 24)
# median step times by preset, one a repeat: bf16 about twice as fast as fp32, with noise
MEDIANS = {"fp32": [10.0, 10.4, 9.8, 10.1, 10.2], "bf16": [5.1, 4.9, 5.3, 5.0, 5.2]}


class RecordingEngines:
    """Each engine writes its record (the next median of its preset), says hello and exits."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.made: list[str] = []

    def __call__(self, preset, overrides, runs_dir, on_event) -> FakeEngine:
        median = MEDIANS[preset][self.made.count(preset)]
        self.made.append(preset)
        record = records.load_run(write_finished_record(self.root, preset, median, median))
        return FakeEngine(preset, overrides, runs_dir, on_event, record.events, exit_at_once=0)


@pytest.mark.unit
def test_a_sweep_with_repeats_runs_interleaved_and_records_one_row_a_preset(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        engines = RecordingEngines(tmp_path)
        listener = FakeListener()
        manager = RunManager(listener, tmp_path, start_engine=engines)
        await manager.start_sweep(["bf16", "fp32"], repeats=3)
        await asyncio.wait_for(listener.compared_event.wait(), 5.0)
        assert engines.made == ["bf16", "fp32"] * 3  # ABAB, as 'ampscope bench --repeats'
        notes = [r.state.queue_note for r in listener.started]
        assert notes == [f"sweep {i}/6" for i in range(1, 7)]
        assert listener.repeated
        (sweep_dir,) = tmp_path.glob("*-sweep*")
        data = json.loads((sweep_dir / comparison.SWEEP_FILE).read_text())
        assert data["order"] == ["bf16", "fp32"] * 3
        assert [(r["preset"], r["runs"]) for r in data["rows"]] == [("bf16", 3), ("fp32", 3)]
        assert any("faster than fp32 (95% CI" in line for line in data["verdict"])

    run(go())


@pytest.mark.ui
def test_repeats_set_on_the_presets_screen_give_compare_a_speed_verdict(tmp_path: Path) -> None:
    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        engines = RecordingEngines(tmp_path)
        app.run_manager._start_engine = engines
        async with app.run_test(size=SMALL) as pilot:
            presets = await shown(pilot, app, PresetsScreen)
            assert "Repeats" not in presets.query_one(KeyBar).plain  # nothing marked yet
            for name in ("fp32", "bf16"):
                select_preset(app, name)
                await pilot.press("m")
            await pilot.pause()
            assert "x Repeats: 3" in presets.query_one(KeyBar).plain
            assert "3 runs each, interleaved" in text(presets, "#preset-status")
            await pilot.press("x")  # 3 -> 5
            await pilot.pause()
            assert "x Repeats: 5" in presets.query_one(KeyBar).plain
            assert "5 runs each, interleaved" in text(presets, "#preset-status")
            await pilot.press("w")
            screen = await shown(pilot, app, CompareScreen, 30)
            assert engines.made == ["fp32", "bf16"] * 5
            assert [(r.preset, r.runs) for r in screen.rows] == [("fp32", 5), ("bf16", 5)]
            verdict = text(screen, "#compare-verdict")
            assert "bf16: 2x faster than fp32 (95% CI" in verdict
            assert "untested" not in verdict
            assert "2 presets × 5 runs" in text(screen, "#compare-title")
            # the history's c (nothing marked) opens the same table from the sweep record
            app.show_history()
            await shown(pilot, app, HistoryScreen)
            await pilot.press("c")
            again = await shown(pilot, app, CompareScreen)
            assert [(r.preset, r.runs) for r in again.rows] == [("fp32", 5), ("bf16", 5)]
            assert await wait_for(pilot, lambda: "faster" in text(again, "#compare-verdict"), 5)

    run(go())


@pytest.mark.ui
def test_a_sweep_of_presets_that_train_different_models_keeps_its_baseline(
    tmp_path: Path,
) -> None:
    """Rows of different workloads are labelled 'PRESET MODEL'; the sweep's baseline, a
    preset's name, is still the row of that preset (1.00x, and the others measured or said
    not comparable against it), not 'no baseline' on every row."""
    from ampscope.core import events as ev
    from tests.helpers import done, hello, step

    runs = []
    for k in range(3):
        for preset, kind, ms in (("mlp-demo", "mlp", 5.0 + k * 0.1), ("fp32", "gpt", 9.0)):
            run_dir = records.new_run_dir(tmp_path, preset)
            config = {"precision": "fp32", "compile": "off", "steps": 4, "workload": {"kind": kind}}
            events = [hello(preset=preset, run_dir=str(run_dir), config=config)]
            events += [step(i, ms) for i in range(4)] + [done("ok", 4)]
            (run_dir / records.EVENTS_FILE).write_bytes(b"".join(ev.encode(e) for e in events))
            runs.append(records.load_run(run_dir))

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await shown(pilot, app, PresetsScreen)
            app.sweep_compared(runs, "fp32", repeated=True)
            screen = await shown(pilot, app, CompareScreen)
            await pilot.pause()
            assert screen.baseline == "fp32 gpt"
            assert "no baseline" not in text(screen, "#compare-verdict")

    run(go())


@pytest.mark.ui
def test_a_sweep_the_user_declines_to_start_keeps_its_marks(tmp_path: Path) -> None:
    """w while a run goes on asks first; 'no' keeps the run, and the marks too (they were
    lost: the presets had to be marked again)."""
    from ampscope.tui.screens.dialogs import ConfirmDialog
    from ampscope.tui.screens.run import RunScreen
    from tests.helpers import hello

    made: list[FakeEngine] = []

    def running_engine(preset, overrides, runs_dir, on_event) -> FakeEngine:
        made.append(FakeEngine(preset, overrides, runs_dir, on_event, [hello(preset=preset)]))
        return made[-1]

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        app.run_manager._start_engine = running_engine
        async with app.run_test(size=SMALL) as pilot:
            presets = await shown(pilot, app, PresetsScreen)
            select_preset(app, "mlp-demo")
            await pilot.press("r")
            await shown(pilot, app, RunScreen)
            await pilot.press("escape")
            await shown(pilot, app, PresetsScreen)
            for name in ("fp32", "bf16"):
                select_preset(app, name)
                await pilot.press("m")
            await pilot.press("w")
            await shown(pilot, app, ConfirmDialog)
            await pilot.press("n")
            await shown(pilot, app, PresetsScreen)
            assert len(made) == 1 and made[0].running  # the run goes on
            assert list(presets.draft.marked) == ["fp32", "bf16"]
            assert "3 runs each" in text(presets, "#preset-status")  # as before w
            assert await wait_for(
                pilot, lambda: "w Run sweep" in presets.query_one(KeyBar).plain, 5
            )
            await pilot.press("w")  # and the sweep can be asked for again, at once
            await shown(pilot, app, ConfirmDialog)
            await pilot.press("y")
            assert await wait_for(pilot, lambda: len(made) == 2 and made[1].preset == "fp32", 5)
            assert made[0].stop_requested and not presets.draft.marked

    run(go())
