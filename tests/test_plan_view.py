"""The plan screen, with a stand-in for ``ampscope plan`` (tests/data/fake_plan.py: no torch,
a fixed answer, or a refusal, a crash, a wait): reached from Presets and Numerics, its rows at
80x24 and 120x40, a fault said in the screen, enter trains the plan, no child left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ampscope.tui.app import AmpscopeApp
from ampscope.tui.model.plan_process import PlanRequest
from ampscope.tui.model.run_state import RunState
from ampscope.tui.screens.help import key_rows
from ampscope.tui.screens.numerics import NumericsScreen
from ampscope.tui.screens.plan import PlanScreen
from ampscope.tui.screens.presets import PresetsScreen
from ampscope.tui.screens.run import RunScreen
from ampscope.tui.widgets.key_bar import KeyBar
from tests.helpers import (
    FakeEngine,
    assert_snapshot,
    engine_env,
    run,
    shown,
    text,
    wait_for,
    wait_gone,
)
from tests.snapshot_runs import FrozenSource, gpu_run

FAKE = Path(__file__).parent / "data" / "fake_plan.py"
MODEL = "models/tiny_llama.py:make"
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


def fake(mode: str) -> tuple[str, ...]:
    return (sys.executable, str(FAKE), mode)


def plan_app(mode: str = "answer", model: str | None = MODEL) -> AmpscopeApp:
    """The dashboard as ``ampscope --model MODEL`` starts it, its plans run by the stand-in."""

    overrides = [f"workload.model='{model}'"] if model else []
    app = AmpscopeApp(runs_dir=Path("runs"), extra_overrides=overrides)
    app.plan_program = fake(mode)
    return app


async def settle(pilot) -> None:
    for _ in range(3):
        await pilot.pause()


async def planned(pilot, screen: PlanScreen) -> None:
    assert await wait_for(pilot, lambda: screen.plan is not None or screen.fault is not None, 30)
    await settle(pilot)


def footer(app) -> str:
    return app.screen.query_one(KeyBar).plain


@pytest.mark.subprocess
@pytest.mark.parametrize("size", SIZES)
def test_l_on_presets_plans_the_model_and_enter_trains_the_plan(size) -> None:
    started: list[FakeEngine] = []

    def engine(preset, overrides, runs_dir, on_event) -> FakeEngine:
        started.append(FakeEngine(preset, overrides, runs_dir, on_event))
        return started[-1]

    async def go() -> None:
        app = plan_app()
        async with app.run_test(size=size) as pilot:
            await shown(pilot, app, PresetsScreen)
            await pilot.press("l")
            screen = await shown(pilot, app, PlanScreen)
            assert screen.request == PlanRequest("fp8", MODEL)
            await planned(pilot, screen)
            said = assert_snapshot(app, f"plan-{size[0]}x{size[1]}")
            assert f"Layer plan · fp8 for {MODEL} · NVIDIA H100 80GB HBM3" in said
            summary = text(screen, "#plan-summary")
            assert summary.startswith("speed-ups from the roofline model · ")
            assert "11 of 17 layers in fp8" in summary and "plans/tiny-llama-fp8" in summary
            table = screen.query_one("#plan-table")
            names = [str(table.get_row_at(r)[0]) for r in range(table.row_count)]
            assert len(set(names)) == 17 and "lm_head" in names  # told apart, at 80 too
            assert footer(app).startswith("\u23ce Train the plan")
            # the outlier layer: the chosen recipe and its reason, under the table
            table.move_cursor(row=6)
            await settle(pilot)
            detail = text(screen, "#plan-detail")
            assert "model.layers.0.mlp.down_proj (Linear) · M 8192, K 5632, N 2048" in detail
            assert "tensorwise input 61% (does not fit)" in detail
            assert "one token's outlier sets the tensorwise scale" in detail
            await pilot.press("o")  # fastest first; the highlighted layer stays highlighted
            await settle(pilot)
            assert str(table.get_row_at(0)[0]) == "lm_head" and table.cursor_row != 6
            assert screen.highlighted == 6
            app.run_manager._start_engine = engine
            await pilot.press("enter")
            await shown(pilot, app, RunScreen)
            assert [e.preset for e in started] == ["plans/tiny-llama-fp8/plan.toml"]
            assert f"workload.model='{MODEL}'" in started[0].overrides  # as a preset run

    run(go())


@pytest.mark.subprocess
def test_l_on_numerics_plans_that_runs_model_and_t_switches_the_target() -> None:
    state = RunState(
        label="mine",
        launch={"name": "mine", "precision": "amp-fp16", "workload": {"model": MODEL}},
    )

    async def go() -> None:
        app = plan_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await shown(pilot, app, PresetsScreen)
            app.push_screen(NumericsScreen(FrozenSource(state)))
            await shown(pilot, app, NumericsScreen)
            await pilot.press("l")  # the view shows fp16: the fp16 plan
            screen = await shown(pilot, app, PlanScreen)
            await planned(pilot, screen)
            assert screen.plan is not None and screen.plan.target == "fp16"
            assert "2 of 3 layers in fp16 · fp32: 1" in text(screen, "#plan-summary")
            assert "roofline" not in text(screen, "#plan-summary")  # fp16 predicts no speed
            assert "no GPU named" not in text(screen, "#plan-title")
            assert "Target: fp16" in footer(app)
            await pilot.press("t")
            await planned(pilot, screen)
            assert screen.plan is not None and screen.plan.target == "fp8"
            assert "Target: fp8" in footer(app)
            await pilot.press("escape")
            await shown(pilot, app, NumericsScreen)

    run(go())


@pytest.mark.subprocess
def test_a_refusal_a_crash_and_no_plan_are_said_in_the_screen(tmp_path: Path) -> None:
    evil = "[red]evil[/] [/x]\x1b[2J"
    shown_as = "[red]evil[/] [/x]\\x1b[2J"
    data = json.loads((FAKE.parent / "plan-fp8.json").read_text())
    data["gpu"] = evil
    data["layers"][0].update(name=evil, reason=evil)
    answer = tmp_path / "evil.json"
    answer.write_text(json.dumps(data))
    request = PlanRequest("fp8", MODEL)

    async def go() -> None:
        app = plan_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await shown(pilot, app, PresetsScreen)
            for mode, said in (
                ("refuse", ["ampscope plan refused", f"ampscope: --model {MODEL}: the file"]),
                ("crash", ["failed (exit code 1)", "RuntimeError: CUDA error: an illegal"]),
                ("garbage", ["No plan to show", "not JSON", "Loading checkpoint shards"]),
            ):
                app.push_screen(PlanScreen(request, fake(mode)))
                screen = await shown(pilot, app, PlanScreen)
                await planned(pilot, screen)
                progress = text(screen, "#plan-progress")
                assert all(words in progress for words in said), progress
                await pilot.press("enter")  # nothing to train: said, and the screen stays
                await settle(pilot)
                assert app.screen is screen and "there is no plan" in footer_note(app)
                await pilot.press("escape")
                await shown(pilot, app, PresetsScreen)
            app.push_screen(PlanScreen(request, fake(f"answer={answer}")))
            screen = await shown(pilot, app, PlanScreen)
            await planned(pilot, screen)
            assert shown_as in text(screen, "#plan-title")
            assert str(screen.query_one("#plan-table").get_row_at(0)[0]) == shown_as
            assert text(screen, "#plan-detail").splitlines()[1] == shown_as  # the reason

    run(go())


def footer_note(app) -> str:
    """The notices the app shows now, as one text."""
    return " ".join(str(n.message) for n in app._notifications)


@pytest.mark.subprocess
def test_leaving_planning_again_or_quitting_ends_the_plan_and_its_group() -> None:
    request = PlanRequest("fp8", MODEL)
    pids: list[int] = []

    async def started(pilot, screen: PlanScreen) -> int:
        def said() -> bool:
            return screen.planning is not None and any(
                "measuring" in x for x in screen.planning.progress
            )

        assert await wait_for(pilot, said, 20)
        pid = screen.planning.pid
        assert pid is not None and os.getpgid(pid) == pid  # a process group of its own
        pids.append(pid)
        return pid

    async def go() -> None:
        app = plan_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await shown(pilot, app, PresetsScreen)
            app.push_screen(PlanScreen(request, fake("wait")))
            screen = await shown(pilot, app, PlanScreen)
            first = await started(pilot, screen)
            await settle(pilot)
            progress = text(screen, "#plan-progress")
            assert "planning: ampscope plan fp8 --model" in progress and "measuring" in progress
            train = next(k for k in app.screen.query_one(KeyBar).shown if "Train" in k.description)
            assert not train.enabled  # shown, dimmed, until there is a plan
            await pilot.press("r")  # plan again: the first one goes
            assert await wait_for(pilot, lambda: screen.planning.pid not in (None, first), 20)
            assert wait_gone(first, 10)
            await started(pilot, screen)
            await pilot.press("escape")  # leaving: it goes
            await shown(pilot, app, PresetsScreen)
            assert wait_gone(pids[-1], 10)
            app.push_screen(PlanScreen(request, fake("wait")))
            await started(pilot, await shown(pilot, app, PlanScreen))
        # the dashboard closed with a plan running: it went with it

    run(go())
    assert wait_gone(pids[-1], 10)


KILLED_PARENT = """
import asyncio, sys
from ampscope.tui.model.plan_process import PlanRequest, PlanRun

async def main():
    planning = PlanRun(PlanRequest("fp8", "m.py:make"), (sys.executable, sys.argv[1], "wait"))
    running = asyncio.ensure_future(planning.run())
    while planning.pid is None:
        await asyncio.sleep(0.01)
    print(planning.pid, flush=True)
    await running

asyncio.run(main())
"""


@pytest.mark.subprocess
def test_a_plan_ends_when_the_dashboard_is_killed_outright() -> None:
    """SIGKILL gives the dashboard no last word: the kernel tells its plan to stop."""
    dashboard = subprocess.Popen(
        [sys.executable, "-c", KILLED_PARENT, str(FAKE)],
        stdout=subprocess.PIPE,
        text=True,
        env=engine_env(),
    )
    try:
        plan = int(dashboard.stdout.readline())
        assert not wait_gone(plan, 0.5)  # it waits, in a session of its own
    finally:
        dashboard.kill()
        dashboard.wait()
    assert wait_gone(plan, 10)


@pytest.mark.ui
def test_l_says_why_not_where_there_is_no_model_of_the_users() -> None:
    async def go() -> None:
        app = plan_app(model=None)
        async with app.run_test(size=(120, 40)) as pilot:
            await shown(pilot, app, PresetsScreen)
            await pilot.press("l")
            await settle(pilot)
            assert isinstance(app.screen, PresetsScreen)
            assert "it plans your own model: start with --model FILE:FN" in footer_note(app)
            numerics = NumericsScreen(FrozenSource(gpu_run()))
            app.push_screen(numerics)
            await shown(pilot, app, NumericsScreen)
            await pilot.press("l")
            await settle(pilot)
            assert isinstance(app.screen, NumericsScreen) and "Layer plan" not in footer(app)
            rows = {ids: note for _keys, _does, note, ids in key_rows(numerics)}
            assert (
                rows["numerics.plan"]
                == "not here: this run trains a built-in model; a plan is of your own (--model)"
            )

    run(go())


@pytest.mark.subprocess
def test_keys_typed_in_one_burst_sort_with_the_layer_they_highlighted() -> None:
    """Before: 'down down o' typed at once reached o before the table's highlight messages:
    the sort kept the layer highlighted before the downs, and the detail under the table
    named the layer the cursor left."""
    from textual import events

    async def go() -> None:
        app = plan_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await shown(pilot, app, PresetsScreen)
            await pilot.press("l")
            screen = await shown(pilot, app, PlanScreen)
            await planned(pilot, screen)
            table = screen.query_one("#plan-table")
            reached = str(table.get_row_at(2)[0])
            for name, character in (("down", None), ("down", None), ("o", "o")):
                app.post_message(events.Key(name, character))
            assert await wait_for(pilot, lambda: screen.sort == 1, 10)
            await settle(pilot)
            assert str(table.get_row_at(table.cursor_row)[0]) == reached
            detail = text(screen, "#plan-detail").replace("\n", " ")
            assert reached in detail, (reached, detail)

    run(go())
