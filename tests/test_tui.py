"""The dashboard, headless: presets, a real CPU run, errors, quitting, hang-ups and keys."""

from __future__ import annotations

import contextlib
import gc
import math
import os
import signal
import time
import warnings
from pathlib import Path

import psutil
import pytest

from ampscope.core import presets
from ampscope.tui.app import AmpscopeApp, parse_autostart
from ampscope.tui.screens.history import HistoryScreen
from ampscope.tui.screens.preset_form import field_id
from ampscope.tui.screens.presets import PresetsScreen
from ampscope.tui.screens.run import RunScreen
from ampscope.tui.screens.save import SaveDialog
from ampscope.tui.widgets.event_log import EventLogView
from ampscope.tui.widgets.plots import RunPlot
from tests.helpers import (
    FAST,
    SIZE,
    FakeEngine,
    dashboard_on_a_terminal,
    done,
    gone,
    hello,
    history_of,
    run,
    select_preset,
    shown,
    step,
    text,
    wait_for,
    wait_gone,
    write_finished_record,
)

LONG = [*FAST, "steps=100000"]


# --------------------------------------------------------------------------- run state


@pytest.mark.unit
def test_parse_autostart() -> None:
    assert parse_autostart("fp32 workload.kind=mlp 'device=cpu'") == (
        "fp32",
        ["workload.kind=mlp", "device=cpu"],
    )
    assert parse_autostart("  ") is None


# --------------------------------------------------------------------------- the app


@pytest.mark.ui
def test_form_refuses_invalid_values_and_saves_a_user_preset(tmp_path: Path) -> None:
    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            screen = await shown(pilot, app, PresetsScreen)
            select_preset(app, "fp32")
            steps_input = screen.query_one("#" + field_id("steps"))
            assert await wait_for(pilot, lambda: getattr(screen.current, "name", "") == "fp32", 5)
            steps_input.value = "0"
            assert await wait_for(pilot, lambda: steps_input.has_class("-invalid"), 5)
            error = text(screen, "#preset-error")
            assert "steps" in error and ">= 1" in error
            await pilot.press("enter")  # refused: nothing starts
            await pilot.pause()
            assert app.run_manager.engine is None and isinstance(app.screen, PresetsScreen)
            steps_input.value = "7"
            screen.query_one("#" + field_id("lr")).value = "1e-4"
            assert await wait_for(pilot, lambda: screen.draft.preset is not None, 5)
            assert text(screen, "#preset-error") == ""
            assert screen.draft.is_edited and screen.draft.preset.steps == 7
            screen.query_one("#preset-list").focus()
            await pilot.press("s")
            dialog = await shown(pilot, app, SaveDialog)
            dialog.query_one("#save-name").value = "my-fp32"
            await pilot.press("enter")
            saved = presets.user_presets_dir() / "my-fp32.toml"
            assert await wait_for(pilot, saved.is_file, 5)
            loaded = presets.load_preset("my-fp32")
            assert loaded.steps == 7 and loaded.lr == 1e-4 and loaded.name == "my-fp32"
            assert await wait_for(pilot, lambda: "my-fp32" in [p.name for p in screen.presets])

    run(go())


@pytest.mark.subprocess
def test_live_run_plots_stop_and_history_replay(tmp_path: Path) -> None:
    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path, extra_overrides=LONG)
        async with app.run_test(size=SIZE) as pilot:
            await shown(pilot, app, PresetsScreen)
            select_preset(app, "fp32")
            await pilot.press("enter")
            screen = await shown(pilot, app, RunScreen)
            pid = app.run_manager.engine.pid
            assert pid is not None
            assert await wait_for(
                pilot,
                lambda: (
                    (app.run_manager.state.step or 0) >= 5
                    and all(
                        p.points_drawn > 0 for p in screen.query(RunPlot) if p.id != "plot-util"
                    )
                    and "training" in text(screen, "#run-header")
                ),
            ), "no steps in 60 s"
            header = text(screen, "#run-header")
            assert "fp32" in header and "cpu" in header and "training" in header
            assert screen.displayed_step is not None
            await pilot.press("s")
            assert await wait_for(pilot, lambda: app.run_manager.state.status == "stopped", 10)
            assert wait_gone(pid, 30)  # gone, not fast: its exit took over 5 s at load 10
            assert await wait_for(pilot, lambda: "stopped" in text(screen, "#run-header"), 5)
            assert (
                app.run_manager.state.done is not None
                and app.run_manager.state.done.status == "stopped"
            )
            # history: the run's record, replayed read-only in the same view
            await pilot.press("escape")
            history, table = await history_of(pilot, app, 1)
            row = [str(c).strip() for c in table.get_row_at(0)]
            assert [row[0], row[2]] == ["fp32", "stopped"]  # preset, (model,) state
            await pilot.press("enter")
            assert await wait_for(pilot, lambda: app.screen not in (history, screen), 5)
            replayed = app.screen
            assert isinstance(replayed, RunScreen) and replayed is not screen
            assert replayed.state.read_only and replayed.state.status == "stopped"
            assert replayed.state.step == app.run_manager.state.step
            await pilot.press("escape")
            await shown(pilot, app, HistoryScreen)

    run(go())


@pytest.mark.ui
def test_back_to_presets_then_a_second_run_shows_the_new_run(tmp_path: Path) -> None:
    """The screens' flow, with engines that end at once (the real engine reaching the Run view
    is the live-run test's): each run is shown, and ``r`` in the last one runs it again there."""

    def finished_engine(preset, overrides, runs_dir, on_event) -> FakeEngine:
        events = [hello(preset=preset), step(0), step(1), done(steps=2)]
        return FakeEngine(preset, overrides, runs_dir, on_event, events=events, exit_at_once=0)

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        app.run_manager._start_engine = finished_engine
        async with app.run_test(size=SIZE) as pilot:
            await shown(pilot, app, PresetsScreen)
            for name in ("fp32", "mlp-demo"):
                select_preset(app, name)
                await pilot.press("enter")
                assert await wait_for(pilot, lambda: app.run_manager.state.status == "done", 60)
                screen = await shown(pilot, app, RunScreen)

                def header(screen: RunScreen = screen) -> str:
                    return text(screen, "#run-header")

                assert await wait_for(pilot, lambda: "done" in header(), 5), header()
                assert name in header()
                await pilot.press("escape")
                await shown(pilot, app, PresetsScreen)
            # v shows the last run again; r there runs it again, in the same view
            await pilot.press("v")
            screen = await shown(pilot, app, RunScreen)
            finished = app.run_manager.state
            await pilot.press("r")
            assert await wait_for(pilot, lambda: app.run_manager.state is not finished, 10)
            assert await wait_for(pilot, lambda: app.run_manager.state.status == "done", 60)
            assert app.screen is screen and screen.state is app.run_manager.state
            assert "mlp-demo" in text(screen, "#run-header")

    run(go())


@pytest.mark.subprocess
def test_config_error_and_crash_are_shown_and_the_app_stays_up(tmp_path: Path) -> None:
    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path, extra_overrides=FAST)
        async with app.run_test(size=SIZE) as pilot:
            await shown(pilot, app, PresetsScreen)
            await app.run_manager.start_run("fp32", ["precision='fp8'"])
            assert await wait_for(pilot, lambda: app.run_manager.state.status == "failed", 20)
            screen = await shown(pilot, app, RunScreen)
            assert await wait_for(pilot, lambda: "fp8" in text(screen, "#run-error"), 5)
            log = screen.query_one(EventLogView)
            assert await wait_for(pilot, lambda: "[config]" in "\n".join(log.texts), 5)
            assert "fp8" in "\n".join(log.texts)
            # back, and run a preset that crashes at step 2
            await pilot.press("escape")
            await shown(pilot, app, PresetsScreen)
            await app.run_manager.start_run("fp32", ["steps=50", "debug.raise_at_step=2"])
            assert await wait_for(pilot, lambda: app.run_manager.state.exit_code is not None, 60)
            screen = await shown(pilot, app, RunScreen)
            assert await wait_for(pilot, lambda: "failed" in text(screen, "#run-header"), 5)
            assert app.is_running
            log_text = "\n".join(screen.query_one(EventLogView).texts)
            assert "exception" in log_text and "step" in log_text
            assert app.run_manager.state.error and "exception" in app.run_manager.state.error

    run(go())


@pytest.mark.subprocess
def test_quit_mid_run_leaves_no_engine(tmp_path: Path) -> None:
    pids: list[int] = []

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path, extra_overrides=LONG)
        async with app.run_test(size=SIZE) as pilot:
            await shown(pilot, app, PresetsScreen)
            await app.run_manager.start_run("fp32")
            pids.append(app.run_manager.engine.pid)
            assert await wait_for(pilot, lambda: (app.run_manager.state.step or 0) >= 2), "no steps"
            await pilot.press("q")

    run(go())
    assert pids and wait_gone(pids[0], 5)


@pytest.mark.subprocess
def test_hangup_kills_dashboard_and_engine(tmp_path: Path) -> None:
    term = dashboard_on_a_terminal(
        AMPSCOPE_AUTOSTART="fp32 workload.kind=mlp device=cpu steps=100000",
        AMPSCOPE_RUNS_DIR=str(tmp_path),
    )
    proc, master, output = term.proc, term.master, term.output
    os.close(term.slave)
    engine_pid = None
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and engine_pid is None:
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(proc.pid).children(recursive=True):
                    if "ampscope.engine" in child.cmdline():
                        engine_pid = child.pid
            time.sleep(0.2)
        assert engine_pid is not None, f"no engine started: {bytes(output[-2000:])!r}"
        time.sleep(1.0)
        proc.send_signal(signal.SIGHUP)
        os.close(master)  # the terminal is gone too
        master = -1
        assert proc.wait(timeout=10) == 129
        assert wait_gone(engine_pid, 10)
    finally:
        if proc.poll() is None:
            proc.kill()
        if engine_pid is not None and not gone(engine_pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(engine_pid, signal.SIGKILL)
        if master >= 0:
            os.close(master)


@pytest.mark.unit
@pytest.mark.parametrize(
    "argv",
    [
        ["--refresh", "9"],
        ["--refresh", "0.1", "attach"],
        ["--refresh", "nan", "replay"],
        ["--refresh", "fast"],
    ],
)
def test_refresh_out_of_range_exits_2_naming_the_range(argv: list[str], capsys) -> None:
    from ampscope.cli.main import main as cli_main

    with pytest.raises(SystemExit) as exit_:
        cli_main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--refresh" in err and "0.5 to 4 redraws a second" in err and argv[1] in err
    assert "Traceback" not in err


@pytest.mark.unit
def test_the_served_viewer_and_the_app_refuse_the_same_refresh(capsys) -> None:
    from ampscope.cli.serve.viewer import main as viewer_main
    from ampscope.core.presets.run_args import REFRESH_RANGE

    with pytest.raises(SystemExit) as exit_:
        viewer_main(["--refresh", "5"])
    assert exit_.value.code == 2 and "0.5 to 4" in capsys.readouterr().err
    low, high = REFRESH_RANGE
    assert AmpscopeApp(refresh_hz=low).refresh_hz == low
    assert AmpscopeApp(refresh_hz=high).refresh_hz == high
    for bad in (high + 0.5, low / 2, math.inf):
        with pytest.raises(ValueError, match="accepted: 0.5 to 4"):
            AmpscopeApp(refresh_hz=bad)


@pytest.mark.ui
def test_every_key_binding_has_an_id_a_keymap_can_move(tmp_path: Path) -> None:
    from textual.binding import Binding

    owners = [AmpscopeApp, *AmpscopeApp.SCREENS_WITH_KEYS]
    assert {PresetsScreen, RunScreen, HistoryScreen} <= set(owners)
    for owner in owners:
        bindings = [b for b in owner.BINDINGS if isinstance(b, Binding)]
        assert len(bindings) == len(owner.BINDINGS), owner
        for b in bindings:
            assert b.id, f"{owner.__name__}: {b.key} -> {b.action} has no id"
        # one id, one key: only the two faces of a toggle share theirs
        keys_by_id: dict[str, set[str]] = {}
        for b in bindings:
            keys_by_id.setdefault(b.id, set()).add(b.key)
        assert all(len(keys) == 1 for keys in keys_by_id.values()), owner

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            app.set_keymap({"presets.history": "y"})
            await pilot.pause()
            await pilot.press("h")
            await pilot.pause()
            assert isinstance(app.screen, PresetsScreen)
            await pilot.press("y")
            assert await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen), 5)

    run(go())


@pytest.mark.ui
def test_names_from_records_show_as_written_never_as_markup(tmp_path: Path) -> None:

    name = "[red]evil[/] [/x]\x1b[2J"
    shown_as = "[red]evil[/] [/x]\\x1b[2J"
    run_dir = write_finished_record(tmp_path, name)

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            history, table = await history_of(pilot, app, 1)
            assert str(table.get_row_at(0)[0]).strip() == shown_as
            await pilot.press("enter")
            screen = await shown(pilot, app, RunScreen)
            assert await wait_for(pilot, lambda: "done" in text(screen, "#run-header"), 5)
            assert shown_as in text(screen, "#run-header")
            log = screen.query_one(EventLogView)
            assert any(shown_as in line for line in log.texts)  # the hello line names it

    run(go())
    assert run_dir.is_dir()


@pytest.mark.ui
def test_a_feed_replaced_before_it_ran_leaves_no_coroutine_never_awaited(tmp_path: Path) -> None:
    """A restart then the next run show two sources in a row: the first feed is cancelled
    before it starts. It must not have been made a coroutine yet (a dropped one makes Python
    warn "coroutine ... was never awaited" into the user's terminal)."""
    from tests.test_tui_keys import SMALL, app_with_fake_engines, start_from_presets

    async def go() -> None:
        app, _ = app_with_fake_engines(tmp_path)
        async with app.run_test(size=SMALL) as pilot:
            screen = await start_from_presets(pilot, app)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for _ in range(3):
                    screen.show(screen.source)
                    screen.stop_now(screen.source)
                await pilot.pause()
                gc.collect()
            assert not [w for w in caught if "never awaited" in str(w.message)]

    run(go())


@pytest.mark.ui
@pytest.mark.parametrize(
    ("name", "said"),
    [("mine", "'mine' is a user preset already"), ("fp32", "'fp32' is a shipped preset")],
)
def test_saving_over_a_preset_asks_first(tmp_path: Path, name: str, said: str) -> None:
    """Before: the save dialog replaced a user preset of the same name without a word."""
    from tests.helpers import save_dialog_for

    mine = presets.user_presets_dir() / "mine.toml"
    mine.parent.mkdir(parents=True, exist_ok=True)
    mine.write_text('description = "kept"\n')
    target = presets.user_presets_dir() / f"{name}.toml"

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            dialog = await save_dialog_for(pilot, app, "amp-bf16")
            dialog.query_one("#save-name").value = name
            await pilot.press("enter")
            assert await wait_for(pilot, lambda: said in text(dialog, "#save-error"), 5)
            assert app.screen is dialog  # nothing written yet
            assert mine.read_text() == 'description = "kept"\n'
            await pilot.press("enter")  # again: replace it
            await shown(pilot, app, PresetsScreen)
            assert await wait_for(pilot, target.is_file, 5)
            assert presets.load_preset(str(target)).precision == "amp-bf16"

    run(go())


@pytest.mark.ui
def test_a_broken_user_preset_shows_no_fields_of_the_preset_before_it(tmp_path: Path) -> None:
    """Before: highlighting a user preset that cannot be loaded left the previous preset's
    fields in the form, above the error, as if they were this one's."""
    mine = presets.user_presets_dir() / "mine.toml"
    mine.parent.mkdir(parents=True, exist_ok=True)
    mine.write_text('description = "mine"\nbogus = 3\n')

    def rows_shown(screen: PresetsScreen) -> bool:
        row = screen.query_one("#" + field_id("steps")).parent
        return row is not None and bool(row.display)

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            screen = await shown(pilot, app, PresetsScreen)
            select_preset(app, "fp32")
            assert await wait_for(pilot, lambda: rows_shown(screen), 5)
            select_preset(app, "mine")
            assert await wait_for(
                pilot, lambda: "unknown field 'bogus'" in text(screen, "#preset-error"), 5
            )
            assert not rows_shown(screen)
            assert text(screen, "#preset-description").startswith("mine")
            select_preset(app, "fp32")
            assert await wait_for(pilot, lambda: rows_shown(screen), 5)
            assert text(screen, "#preset-error") == ""

    run(go())


def catch(screen, kind: type, seen) -> None:
    """Messages of ``kind`` the screen posts go to ``seen`` instead of their handlers (the
    run or plan they ask for is not started); every other message goes on as before."""
    post = screen.post_message

    def caught(message) -> bool:
        if isinstance(message, kind):
            seen(message)
            return True
        return post(message)

    screen.post_message = caught


def type_at_once(app, *keys: tuple[str, str | None]) -> None:
    """Keys posted in one burst, as a fast hand or tmux send-keys types them: each reaches the
    app before the messages the ones before it cause."""
    from textual import events

    for name, character in keys:
        app.post_message(events.Key(name, character))


@pytest.mark.ui
@pytest.mark.parametrize("key", ["r", "s"])
def test_keys_typed_in_one_burst_act_on_the_preset_they_highlighted(tmp_path: Path, key) -> None:
    """Before: 'down down r' typed at once (a fast hand, tmux send-keys) reached r before the
    list's highlight messages, and ran fp32, the preset highlighted before them; s saved it."""

    from ampscope.tui.messages import RunRequested

    asked: list[str] = []

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            screen = await shown(pilot, app, PresetsScreen)
            catch(screen, RunRequested, lambda message: asked.append(message.preset))
            type_at_once(app, ("down", None), ("down", None), (key, key))
            if key == "r":
                assert await wait_for(pilot, lambda: bool(asked), 10)
                assert asked == ["amp-bf16"]
            else:
                dialog = await shown(pilot, app, SaveDialog)
                assert dialog.suggestion.startswith("amp-bf16"), dialog.suggestion

    run(go())


@pytest.mark.ui
def test_down_l_in_one_burst_plans_the_model_of_the_preset_it_reached(tmp_path: Path) -> None:
    """Before: from a preset without a model, 'down l' typed at once was refused ("it plans
    your own model"): l was judged against the preset the list had just left."""

    from ampscope.tui.messages import PlanRequested

    mine = presets.user_presets_dir() / "mine.toml"
    mine.parent.mkdir(parents=True, exist_ok=True)
    model = str(Path(__file__).parent / "data" / "real_models.py") + ":relu_mlp"
    mine.write_text(f'description = "mine"\n[workload]\nmodel = "{model}"\n')
    asked: list[str] = []

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            screen = await shown(pilot, app, PresetsScreen)
            names = [p.name for p in screen.presets]
            before = names[names.index("mine") - 1]  # a shipped preset, without a model
            select_preset(app, before)
            assert await wait_for(pilot, lambda: screen.current.name == before, 5)
            catch(screen, PlanRequested, lambda message: asked.append(message.model))
            type_at_once(app, ("down", None), ("l", "l"))
            assert await wait_for(pilot, lambda: bool(asked), 10)
            assert asked == [model]

    run(go())


@pytest.mark.ui
def test_history_shows_the_runs_as_they_are_when_the_user_comes_back_to_it(
    tmp_path: Path,
) -> None:
    """Before: back from a run's view, History showed the runs as they were when it opened:
    a live run the user watched end still read live, and a run recorded meanwhile was missing
    until f5."""
    write_finished_record(tmp_path, "fp32")

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            history, table = await history_of(pilot, app, 1)
            await pilot.press("enter")
            await shown(pilot, app, RunScreen)
            write_finished_record(tmp_path, "bf16")
            await pilot.press("escape")
            await shown(pilot, app, HistoryScreen)
            assert await wait_for(pilot, lambda: table.row_count == 2, 10)

    run(go())
