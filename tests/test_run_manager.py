"""The dashboard's run manager without Textual or processes: starting, stopping, restarting, sweeps, detach."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from ampscope.core import comparison, presets, records
from ampscope.tui.model.run_manager import LiveRun, RunManager
from ampscope.tui.model.source import PAUSE, RESTART, STOP
from tests.helpers import (
    ROOT,
    FakeEngine,
    FakeListener,
    done,
    engine_env,
    hello,
    step,
    write_finished_record,
)

WAIT_S = 5.0
"""Only a guard against a hang: every wait below ends on a condition."""


class Engines:
    """The engine factory a run manager is given: makes FakeEngines and keeps them, in order."""

    def __init__(self, **behaviour) -> None:
        self.made: list[FakeEngine] = []
        self.behaviour = behaviour
        self.for_preset: dict[str, dict] = {}

    def __call__(self, preset, overrides, runs_dir, on_event) -> FakeEngine:
        kwargs = {**self.behaviour, **self.for_preset.get(preset, {})}
        engine = FakeEngine(preset, overrides, runs_dir, on_event, **kwargs)
        self.made.append(engine)
        return engine


def manager_with(tmp_path: Path, engines: Engines, **kwargs) -> tuple[RunManager, FakeListener]:
    listener = FakeListener()
    return RunManager(listener, tmp_path, start_engine=engines, **kwargs), listener


async def ended(run: LiveRun) -> None:
    await asyncio.wait_for(run.ended.wait(), WAIT_S)


@pytest.mark.unit
def test_a_run_is_shown_before_it_speaks_and_ends_with_its_done(tmp_path: Path) -> None:
    async def go() -> None:
        engines = Engines()
        manager, listener = manager_with(tmp_path, engines, extra_overrides=["device='cpu'"])
        run = await manager.start_run("fp32", ["steps=3"])
        assert run is not None and listener.started == [run] and manager.current is run
        (engine,) = engines.made
        assert engine.preset == "fp32" and engine.overrides == ["steps=3", "device='cpu'"]
        # the header knows the preset before the engine says hello
        assert run.state.label == "fp32" and run.state.config["precision"] == "fp32"
        assert run.state.total_steps == 3
        assert run.allows(STOP) is True and run.allows(RESTART) is True
        assert run.allows(PAUSE) is False
        for item in (hello(), step(0), step(1), step(2), done("ok", 3)):
            engine.on_event(item)
        engine.finish(0)
        await ended(run)
        assert run.state.status == "done" and run.state.exit_code == 0
        assert run.allows(STOP) is None  # shown, disabled: nothing left to stop
        assert listener.told == []

    asyncio.run(go())


@pytest.mark.unit
def test_starting_a_run_stops_the_one_running(tmp_path: Path) -> None:
    async def go() -> None:
        engines = Engines()
        manager, listener = manager_with(tmp_path, engines)
        first = await manager.start_run("fp32")
        second = await manager.start_run("mlp-demo")
        assert first is not None and second is not None
        assert engines.made[0].stop_requested and first.state.status == "stopped"
        assert first.state.done is not None and first.state.done.status == "stopped"
        assert manager.current is second and listener.started == [first, second]
        assert engines.made[1].running

    asyncio.run(go())


@pytest.mark.unit
def test_a_stop_the_engine_does_not_answer_still_ends_the_run(tmp_path: Path) -> None:
    async def go() -> None:
        engines = Engines(writes_done_on_stop=False)
        manager, _ = manager_with(tmp_path, engines)
        run = await manager.start_run("fp32")
        assert run is not None
        await run.stop()
        assert run.state.status == "stopped" and run.state.exit_code == -15
        assert any("engine stopped (exit code -15)" in e.text for e in run.state.log)
        await manager.stop_run()  # nothing runs: nothing happens
        assert run.state.exit_code == -15

    asyncio.run(go())


@pytest.mark.unit
def test_a_crash_without_an_error_event_shows_stderr(tmp_path: Path) -> None:
    async def go() -> None:
        engines = Engines()
        manager, _ = manager_with(tmp_path, engines)
        run = await manager.start_run("fp32")
        assert run is not None
        engines.made[0].stderr_tail = ["Traceback (most recent call last):", "ImportError: boom"]
        engines.made[0].finish(1)
        await ended(run)
        assert run.state.status == "failed" and "code 1" in (run.state.error or "")
        assert any("ImportError: boom" in e.text for e in run.state.log)

    asyncio.run(go())


@pytest.mark.unit
def test_restart_runs_the_same_preset_and_overrides_again(tmp_path: Path) -> None:
    async def go() -> None:
        engines = Engines()
        manager, listener = manager_with(tmp_path, engines, extra_overrides=["device='cpu'"])
        first = await manager.start_run("fp32", ["steps=7"])
        assert first is not None
        await first.restart()
        assert len(listener.started) == 2
        again = listener.started[1]
        assert again is manager.current and again is not first
        assert engines.made[1].preset == "fp32"
        assert engines.made[1].overrides == engines.made[0].overrides == ["steps=7", "device='cpu'"]
        assert first.state.status == "stopped" and again.state.total_steps == 7

    asyncio.run(go())


@pytest.mark.unit
def test_an_edited_preset_runs_from_a_temporary_copy_removed_on_close(tmp_path: Path) -> None:
    async def go() -> None:
        engines = Engines()
        manager, _ = manager_with(tmp_path, engines)
        edited = msgspec.structs.replace(presets.load_preset("fp32"), steps=11)
        await manager.start_edited_run(edited)
        path = Path(engines.made[0].preset)
        assert path.name == "fp32-edited.toml"
        copy = presets.load_preset(str(path))
        assert copy.steps == 11 and copy.name == "fp32-edited"
        assert manager.state is not None and manager.state.label == "fp32-edited"
        await manager.close()
        assert engines.made[0].killed and not path.exists()

    asyncio.run(go())


@pytest.mark.unit
def test_close_kills_a_running_engine_and_starts_nothing_after(tmp_path: Path) -> None:
    async def go() -> None:
        engines = Engines()
        manager, _ = manager_with(tmp_path, engines)
        run = await manager.start_run("fp32")
        assert run is not None
        await manager.close()
        assert engines.made[0].killed and run.ended.is_set()
        assert run.state.exit_code == -9
        assert await manager.start_run("fp32") is None and len(engines.made) == 1

    asyncio.run(go())


@pytest.mark.unit
def test_read_only_starts_nothing(tmp_path: Path) -> None:
    async def go() -> None:
        launched: list = []
        engines = Engines()
        listener = FakeListener()
        manager = RunManager(
            listener,
            tmp_path,
            read_only=True,
            start_engine=engines,
            launch=lambda *a: launched.append(a) or (tmp_path, 1),
        )
        assert await manager.start_run("fp32") is None
        assert await manager.start_run("fp32", detach=True) is None
        await manager.start_sweep(["fp32", "bf16"])
        assert engines.made == [] and launched == [] and listener.started == []

    asyncio.run(go())


@pytest.mark.unit
def test_a_failure_in_the_background_is_told(tmp_path: Path) -> None:
    async def go() -> None:
        engines = Engines(fails_with=RuntimeError("pipe broke"))
        manager, listener = manager_with(tmp_path, engines)
        await manager.start_run("fp32")
        for _ in range(10):  # the follow task ends in a step or two of the loop
            if listener.told:
                break
            await asyncio.sleep(0)
        assert listener.told == [("RuntimeError: pipe broke", True, "Run failed")]

    asyncio.run(go())


# --------------------------------------------------------------------------- detached


@pytest.mark.unit
def test_a_detached_start_is_told_and_followed(tmp_path: Path) -> None:
    async def go() -> None:
        launched: list = []
        run_dir = tmp_path / "20260101T000000Z-fp32"

        def launch(preset, overrides, runs_dir):
            launched.append((preset, overrides, runs_dir))
            return run_dir, 4242

        engines = Engines()
        listener = FakeListener()
        manager = RunManager(
            listener, tmp_path, extra_overrides=["steps=9"], start_engine=engines, launch=launch
        )
        running = await manager.start_run("fp32")
        assert await manager.start_run("mlp-demo", detach=True) is None
        assert launched == [("mlp-demo", ["steps=9"], tmp_path)]
        assert listener.detached == [run_dir] and len(engines.made) == 1
        assert running is not None and running.state.status == "stopped"  # one run at a time
        (message, error, _title) = listener.told[-1]
        assert not error and run_dir.name in message and "pid 4242" in message
        await running.restart()  # the run shown, not the detached one started since
        assert [e.preset for e in engines.made] == ["fp32", "fp32"] and len(launched) == 1

    asyncio.run(go())


@pytest.mark.unit
def test_a_detached_start_that_fails_is_told_and_nothing_runs(tmp_path: Path) -> None:
    def launch(preset, overrides, runs_dir):
        return presets.load_preset(preset, overrides), 0  # raises: no such preset

    async def go() -> None:
        listener = FakeListener()
        manager = RunManager(listener, tmp_path, start_engine=Engines(), launch=launch)
        await manager.start_run("no-such-preset", detach=True)
        assert listener.detached == [] and manager.current is None
        ((message, error, title),) = listener.told
        assert error and title == "Not started" and "no-such-preset" in message

    asyncio.run(go())


# --------------------------------------------------------------------------- sweeps


class SweepEngines(Engines):
    """Each engine writes its record, says hello with its folder and exits at once."""

    def __init__(self, root: Path, ms: dict[str, float]) -> None:
        super().__init__()
        self.root, self.ms = root, ms

    def __call__(self, preset, overrides, runs_dir, on_event) -> FakeEngine:
        run_dir = write_finished_record(self.root, preset, self.ms[preset])
        record = records.load_run(run_dir)
        engine = FakeEngine(preset, overrides, runs_dir, on_event, events=record.events)
        engine.exit_at_once = 0
        self.made.append(engine)
        return engine


@pytest.mark.unit
def test_a_sweep_runs_in_order_and_ends_compared(tmp_path: Path) -> None:
    async def go() -> None:
        engines = SweepEngines(tmp_path, {"bf16": 5.0, "fp32": 10.0, "mlp-demo": 2.0})
        manager, listener = manager_with(tmp_path, engines)
        await manager.start_sweep(["bf16", "fp32", "mlp-demo"])
        await asyncio.wait_for(listener.compared_event.wait(), WAIT_S)
        assert [e.preset for e in engines.made] == ["bf16", "fp32", "mlp-demo"]
        notes = [run.state.queue_note for run in listener.started]
        assert notes == ["sweep 1/3", "sweep 2/3", "sweep 3/3"]
        # fp32 is the baseline when it is in the sweep, wherever it is in the queue
        assert listener.compared == [(["bf16", "fp32", "mlp-demo"], "fp32")]
        assert manager.sweep is None
        (sweep_dir,) = tmp_path.glob("*-sweep*")
        data = json.loads((sweep_dir / comparison.SWEEP_FILE).read_text())
        assert data["order"] == ["bf16", "fp32", "mlp-demo"]

    asyncio.run(go())


@pytest.mark.unit
def test_a_sweep_under_a_runs_folder_whose_path_is_not_utf8_ends_compared(tmp_path: Path) -> None:
    """Before: each hello names its folder with the bytes that are not UTF-8 escaped (\\xe9),
    no such folder was found, and the sweep ended with no comparison and an empty sweep.json."""
    root = Path(os.fsdecode(bytes(tmp_path) + b"/r\xe9s"))
    root.mkdir()

    async def go() -> None:
        engines = SweepEngines(root, {"bf16": 5.0, "fp32": 10.0})
        manager, listener = manager_with(root, engines)
        await manager.start_sweep(["bf16", "fp32"])
        await asyncio.wait_for(listener.compared_event.wait(), WAIT_S)
        assert listener.compared == [(["bf16", "fp32"], "fp32")]
        (sweep_dir,) = root.glob("*-sweep*")
        data = json.loads((sweep_dir / comparison.SWEEP_FILE).read_text())
        assert sorted(row["preset"] for row in data["rows"]) == ["bf16", "fp32"]

    asyncio.run(go())


@pytest.mark.unit
def test_a_sweep_runs_a_preset_as_edited_on_the_form(tmp_path: Path) -> None:
    async def go() -> None:
        engines = Engines()
        manager, listener = manager_with(tmp_path, engines)
        edited = presets.load_preset("mlp-demo", ["steps=60", "lr=0.01"])
        await manager.start_sweep([edited, "fp32"])
        (first,) = engines.made
        ran = presets.load_preset(first.preset)  # the temporary TOML the engine was given
        assert (ran.name, ran.steps, ran.lr) == ("mlp-demo-edited", 60, 0.01)
        assert listener.started[0].state.label == "mlp-demo-edited"
        assert listener.started[0].state.queue_note == "sweep 1/2"
        assert manager.sweep is not None and manager.sweep.names == ["mlp-demo-edited", "fp32"]
        await listener.started[0].stop()

    asyncio.run(go())


@pytest.mark.unit
def test_stopping_a_sweep_run_cancels_the_rest(tmp_path: Path) -> None:
    async def go() -> None:
        engines = Engines()
        manager, listener = manager_with(tmp_path, engines)
        await manager.start_sweep(["fp32", "bf16", "fp16"])
        first = listener.started[0]
        await first.stop()
        await ended(first)
        assert manager.sweep is None and len(engines.made) == 1
        assert ("Sweep cancelled after 1 of 3.", False, "") in listener.told
        assert listener.compared == []

    asyncio.run(go())


@pytest.mark.unit
def test_a_run_the_user_starts_cancels_a_queued_sweep(tmp_path: Path) -> None:
    async def go() -> None:
        engines = Engines()
        manager, listener = manager_with(tmp_path, engines)
        await manager.start_sweep(["fp32", "bf16"])
        mine = await manager.start_run("mlp-demo")
        assert mine is not None and manager.sweep is None and mine.state.queue_note is None
        assert [e.preset for e in engines.made] == ["fp32", "mlp-demo"]
        assert all("Sweep cancelled" not in m for m, _, _ in listener.told)

    asyncio.run(go())


@pytest.mark.subprocess
def test_the_run_manager_needs_neither_textual_nor_torch() -> None:
    code = "import sys, ampscope.tui.model.run_manager; print(' '.join(sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=engine_env(), capture_output=True, text=True
    )
    loaded = {m.split(".")[0] for m in out.stdout.split()}
    assert "ampscope" in loaded, out.stderr
    assert not loaded & {"textual", "rich", "torch"}
