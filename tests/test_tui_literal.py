"""Every string a user or a record supplies is shown literally on every screen: never read as
markup (``[/]`` used to crash the dashboard), never written to the terminal raw (an escape
sequence could retitle the window)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from textual.widgets import Input

from ampscope.core import events as ev
from ampscope.core import records
from ampscope.core.presets import to_toml, user_presets_dir, validate
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.model.follow import AttachSource
from ampscope.tui.model.replay import ReplaySource
from ampscope.tui.screens.compare import CompareScreen
from ampscope.tui.screens.history import HistoryScreen
from ampscope.tui.screens.memory import MemoryScreen
from ampscope.tui.screens.numerics import NumericsScreen
from ampscope.tui.screens.preset_form import field_id
from ampscope.tui.screens.presets import PresetsScreen
from ampscope.tui.screens.profile import ProfileScreen
from ampscope.tui.screens.run import RunScreen
from tests.helpers import (
    SIZE,
    FakeEngine,
    done,
    hello,
    run,
    save_dialog_for,
    select_preset,
    shown,
    step,
    terminal_output,
    text,
    wait_for,
)

# (as written, as it must be shown)
CORPUS = [
    ("[/]", "[/]"),
    ("[bold]x", "[bold]x"),
    ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),
    ("[red]evil[/] [/x]\x1b[2J", "[red]evil[/] [/x]\\x1b[2J"),
    ("[$x] C:\\dir\\ x[", "[$x] C:\\dir\\ x["),  # what markup escapes get wrong
]
RAW_FORBIDDEN = ("\x1b]0;", "\x07", "\x1b[2J")


def write_user_preset(name: str) -> None:
    folder = user_presets_dir()
    folder.mkdir(parents=True, exist_ok=True)
    preset = validate(
        {
            "name": name,
            "description": f"about {name}\nsecond line",
            "workload": {"kind": "mlp"},
            "device": "cpu",
            "steps": 3,
        }
    )
    (folder / "evil.toml").write_text(to_toml(preset))


def write_record(root: Path, stamp: str, name: str, ms: float) -> Path:
    run_dir = root / f"{stamp}-evil"
    run_dir.mkdir(parents=True)
    events = [hello(preset=name, run_dir=str(run_dir)), step(0, ms), step(1, ms)]
    events.append(ev.WarningEvent(code="odd", message=f"warned {name}", step=1, t=1.1))
    events += [step(2, ms), done("ok", 3)]
    (run_dir / records.EVENTS_FILE).write_bytes(b"".join(ev.encode(e) for e in events))
    return run_dir


def write_live_record(root: Path, name: str, pid: int) -> Path:
    run_dir = root / "20260101T000009Z-live"
    run_dir.mkdir(parents=True)
    (run_dir / records.CONFIG_FILE).write_text(json.dumps({"name": name}))
    events = [ev.PhaseEvent(phase="setup", state="start"), step(0)]
    (run_dir / records.EVENTS_FILE).write_bytes(b"".join(ev.encode(e) for e in events))
    records.write_live(run_dir, pid)
    return run_dir


def assert_literal(app, shown_as: str) -> None:
    """The screen shows ``shown_as`` and sends the terminal none of the raw sequences."""
    plain, raw = terminal_output(app)
    assert shown_as in plain, f"{shown_as!r} not on {type(app.screen).__name__}:\n{plain}"
    for sequence in RAW_FORBIDDEN:
        assert sequence not in raw, f"{sequence!r} reached the terminal"


async def presets_and_form(app, pilot, name: str, shown_as: str) -> None:
    presets = await shown(pilot, app, PresetsScreen)
    select_preset(app, name)
    assert await wait_for(pilot, lambda: getattr(presets.current, "name", "") == name)
    await pilot.pause()
    assert_literal(app, shown_as)  # the list and the description
    header, about = text(presets, "#preset-description").split("\n", 1)
    assert header.startswith(f"{shown_as}  (user: ") and about.startswith(f"about {shown_as}")
    # typed into the form: refused as a value, shown as typed
    for key in ("steps", "device", "lr"):
        presets.query_one("#" + field_id(key)).value = name
        await pilot.pause()
    assert presets.draft.preset is None and presets.draft.problem
    presets.query_one("#" + field_id("device")).value = "cpu"
    presets.query_one("#" + field_id("lr")).value = "1e-3"
    presets.query_one("#" + field_id("steps")).value = "9" * 5000  # pasted
    await pilot.pause()
    error = text(presets, "#preset-error")
    assert "steps" in error and "too long" in error and presets.draft.preset is None
    presets.query_one("#" + field_id("steps")).value = "3"
    assert await wait_for(pilot, lambda: presets.draft.preset is not None)


async def palette_and_memory(app, pilot, shown_as: str) -> None:
    await pilot.press("ctrl+p")
    await pilot.pause(0.3)
    app.screen.query_one(Input).value = shown_as  # matches this preset alone
    await pilot.pause(0.5)
    assert_literal(app, f"Run preset {shown_as}")
    assert_literal(app, f"about {shown_as}")
    await pilot.press("escape")
    await shown(pilot, app, PresetsScreen)
    await pilot.press("p")  # the memory planner, for the highlighted preset
    await shown(pilot, app, MemoryScreen)
    assert await wait_for(pilot, lambda: shown_as in terminal_output(app)[0], 5)
    assert_literal(app, f"preset {shown_as}")
    await pilot.press("escape", "escape")  # out of the parameters field, then back
    await shown(pilot, app, PresetsScreen)


async def a_run_of_it(app, pilot, name: str, shown_as: str) -> None:
    """Run the (edited) preset with a fake engine that fails at once: the Run view."""

    def fake_engine(preset, overrides, runs_dir, on_event) -> FakeEngine:
        events = [hello(preset=name), ev.ErrorEvent(kind="exception", message=f"boom {name}")]
        return FakeEngine(preset, overrides, runs_dir, on_event, events=events, exit_at_once=1)

    app.run_manager._start_engine = fake_engine
    await pilot.press("r")
    screen = await shown(pilot, app, RunScreen)
    assert await wait_for(pilot, lambda: screen.state.finished)
    await pilot.pause(0.6)
    assert shown_as in text(screen, "#run-header")
    assert f"boom {shown_as}" in text(screen, "#run-error")
    assert_literal(app, f"boom {shown_as}")
    await pilot.press("escape")
    await shown(pilot, app, PresetsScreen)


async def history_and_compare(app, pilot, shown_as: str) -> None:
    await pilot.press("h")
    history = await shown(pilot, app, HistoryScreen)
    assert await wait_for(pilot, lambda: history.query_one("#history-table").row_count)
    assert_literal(app, shown_as)
    await pilot.press("enter")
    screen = await shown(pilot, app, RunScreen)
    assert await wait_for(pilot, lambda: screen.state.done is not None)
    await pilot.pause(0.6)
    assert_literal(app, f"warned {shown_as}")
    await pilot.press("escape")
    await shown(pilot, app, HistoryScreen)
    await pilot.press("space", "space", "c")
    await shown(pilot, app, CompareScreen)
    await pilot.pause(0.3)
    assert_literal(app, shown_as)
    await pilot.press("escape")
    await shown(pilot, app, HistoryScreen)


async def replay_and_attach(app, pilot, record: Path, live: Path, shown_as: str) -> None:
    replay = app.open_run(ReplaySource.load(record, 100))
    assert await wait_for(pilot, lambda: replay.source.at_end)
    # drawn on the view's next redraw, a moment later on a loaded machine
    assert await wait_for(pilot, lambda: f"warned {shown_as}" in terminal_output(app)[0], 30)
    assert_literal(app, f"warned {shown_as}")
    app.pop_screen()
    attached = app.open_run(AttachSource(live))
    assert await wait_for(pilot, lambda: attached.state.step_count == 1)
    await pilot.pause(0.6)
    assert shown_as in text(attached, "#run-header")
    assert_literal(app, shown_as)


@pytest.mark.subprocess  # a 'sleep' stands for the engine of the live record
@pytest.mark.parametrize(("name", "shown_as"), CORPUS)
def test_user_and_record_text_is_shown_literally_on_every_screen(
    name: str, shown_as: str, tmp_path: Path
) -> None:
    write_user_preset(name)
    record = write_record(tmp_path, "20260101T000001Z", name, 10.0)
    write_record(tmp_path, "20260101T000002Z", name, 20.0)
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    live = write_live_record(tmp_path / "live", name, sleeper.pid)

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await presets_and_form(app, pilot, name, shown_as)
            await palette_and_memory(app, pilot, shown_as)
            await a_run_of_it(app, pilot, name, shown_as)
            await history_and_compare(app, pilot, shown_as)
            await replay_and_attach(app, pilot, record, live, shown_as)

    try:
        run(go())
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.ui
def test_a_path_with_brackets_in_the_save_dialog_shows_as_written(tmp_path: Path, monkeypatch):
    home = tmp_path / "[red]home[/]"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            dialog = await save_dialog_for(pilot, app, "fp32")
            await pilot.pause()
            assert text(dialog, "#save-where").endswith(f"{home}/ampscope/presets")

    run(go())


@pytest.mark.ui
@pytest.mark.parametrize(("name", "shown_as"), CORPUS)
def test_compare_names_the_model_its_runs_share_as_written(
    name: str, shown_as: str, tmp_path: Path
) -> None:
    """The title's ``model X``: a model's (a workload kind's) name as a record gives it."""
    runs = []
    for i in range(2):
        run_dir = tmp_path / f"2026010{i}T000000Z-x"
        run_dir.mkdir()
        config = {"precision": "fp32", "steps": 3, "device": "cpu", "workload": {"kind": name}}
        events = [hello(preset=f"p{i}", config=config), step(0), step(1), done("ok", 2)]
        (run_dir / records.EVENTS_FILE).write_bytes(b"".join(ev.encode(e) for e in events))
        runs.append(records.load_run(run_dir))

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await shown(pilot, app, PresetsScreen)
            app.push_screen(CompareScreen(runs))
            screen = await shown(pilot, app, CompareScreen)
            await pilot.pause()
            assert text(screen, "#compare-title").startswith(f"2 runs · model {shown_as} · ")
            assert_literal(app, shown_as)

    run(go())


def write_measured_record(root: Path, name: str) -> Path:
    """A finished record whose profile and numerics name a format and a class ``name``."""
    from ampscope.core.numerics.event import FormatShare, ModuleNumerics, TensorNumerics

    run_dir = root / "20260101T000003Z-measured"
    run_dir.mkdir(parents=True)
    out = TensorNumerics(
        numel=10,
        amax=3.0,
        min_nonzero=1e-3,
        nonfinite=1,
        formats={"fp16": FormatShare(overflow=0.1, underflow=0.0)},
        dtype=name,
    )
    numerics = ev.NumericsEvent(
        step=1,
        loss_scale=None,
        modules=[ModuleNumerics(name="head", kind="Linear", order=0, activation=out)],
        modules_total=1,
    )
    profile = ev.ProfileEvent(
        step=1,
        steps=1,
        step_ms=10.0,
        timing="cpu",
        classes={"matmul": 0.6, name: 0.4},
        dtypes={"matmul": {name: 1.0}},
        top_ops=[ev.ProfileOp(name="aten::mm", kind="matmul", share=0.6, calls=2)],
    )
    events = [hello(run_dir=str(run_dir)), step(0), step(1), numerics, profile, done("ok", 2)]
    (run_dir / records.EVENTS_FILE).write_bytes(b"".join(ev.encode(e) for e in events))
    return run_dir


@pytest.mark.ui
@pytest.mark.parametrize(("name", "shown_as"), CORPUS)
def test_profile_and_numerics_name_a_records_formats_as_written(
    name: str, shown_as: str, tmp_path: Path
) -> None:
    """A profile's classes and formats, and the format a layer's inf/NaN were computed in, as a
    record names them: the Profile view's bars and the Numerics view's verdict drew them raw."""
    record = write_measured_record(tmp_path, name)

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await shown(pilot, app, PresetsScreen)
            screen = app.open_run(ReplaySource.load(record, 1000))
            assert await wait_for(pilot, lambda: screen.state.done is not None)
            await pilot.press("p")
            profile = await shown(pilot, app, ProfileScreen)
            await pilot.pause()
            body = text(profile, "#profile-body")
            assert f"matmul ({shown_as[:12]}" in body and f"\n{shown_as[:26]}" in body
            assert_literal(app, f"matmul ({shown_as[:12]}")
            await pilot.press("escape")
            await shown(pilot, app, RunScreen)
            await pilot.press("n")
            numerics = await shown(pilot, app, NumericsScreen)
            await pilot.pause()
            assert f"computed in {shown_as}" in text(numerics, "#numerics-verdict")
            assert_literal(app, f"computed in {shown_as}")

    run(go())
