"""The dashboard, headless: the run-state model, a real CPU run, errors, quitting and hang-ups."""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import psutil
import pytest

from ampscope.core import config as cfg
from ampscope.core import events as ev
from ampscope.tui.app import AmpscopeApp, parse_autostart
from ampscope.tui.figures import (
    cards,
    loss_series,
    memory_series,
    points_for_width,
    step_time_series,
    thin,
    util_series,
)
from ampscope.tui.replay import RecordSource
from ampscope.tui.run_state import MAX_POINTS, RunState
from ampscope.tui.screens.history import HistoryScreen
from ampscope.tui.screens.presets import PresetsScreen, SaveDialog, field_id
from ampscope.tui.screens.run import RunScreen
from ampscope.tui.widgets.event_log import EventLog
from ampscope.tui.widgets.plots import RunPlot
from tests.conftest import ROOT, engine_env
from tests.helpers import (
    FAST,
    SIZE,
    done,
    gone,
    hello,
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
def test_run_state_cards_from_a_synthetic_stream() -> None:
    state = RunState(label="fp32")
    assert state.status == "starting"
    state.ingest(ev.PhaseEvent(phase="setup", state="start"))
    state.ingest(hello())
    state.ingest(ev.PhaseEvent(phase="train", state="start", step=0))
    # 40 steps: the first 20 slow (100 ms), the last 20 alternate 10/30 ms -> median 20 ms
    for i in range(40):
        ms = 100.0 if i < 20 else (10.0 if i % 2 else 30.0)
        scale = 2.0**16 if i < 35 else 2.0**15
        state.ingest(step(i, ms, loss_scale=scale, skipped=i in (35, 36)))
    state.ingest(ev.WarningEvent(code="skipped-step", message="GradScaler skipped", step=35))
    assert state.status == "training"
    assert state.median_step_ms() == pytest.approx(20.0)
    shown = {c.key: c for c in cards(state)}
    assert shown["step_ms"].value == "20.0 ms"
    assert shown["skipped"].value == "2"
    assert shown["loss_scale"].value == "32.8k" and shown["loss_scale"].sub == "2^15"
    assert shown["throughput"].value == "800 samples/s"
    assert "no NVIDIA GPU" in shown["util"].sub
    assert shown["memory"].value == "200 MiB"
    levels = [(e.level, e.step) for e in state.log]
    assert ("skipped", 35) in levels and ("skipped", 36) in levels and ("warning", 35) in levels
    (lx, _ly), (sx, sy) = loss_series(state, 1000)
    assert len(lx) == 40 and sy[0] == 16 and sy[-1] == 15  # scale plotted as log2
    assert "step 40/100" in state.header() and "training" in state.header()
    state.ingest(done("ok", 40))
    assert state.status == "done" and state.finished


@pytest.mark.unit
def test_run_state_gpu_sys_events_and_phases() -> None:
    state = RunState()
    state.ingest(ev.PhaseEvent(phase="compile", state="start", step=0, t=1.0))
    assert state.phase_label(now=time.monotonic() + 5).startswith("compiling ")
    state.ingest(
        ev.SysEvent(
            t=2.0,
            gpu_util=87.0,
            cpu_util=12.0,
            gpu_mem_used=3 << 30,
            gpu_mem_total=80 << 30,
            power_w=300.0,
        )
    )
    card = {c.key: c for c in cards(state)}["util"]
    assert card.value == "87%" and "300 W" in card.sub
    assert set(memory_series(state, 100)) == {"device used", "device total"}
    assert set(util_series(state, 100)) == {"GPU", "CPU"}


@pytest.mark.unit
def test_host_figures_come_from_the_engines_sys_events_alone() -> None:
    """No sampler of the dashboard's own: without sys events there are no host figures."""
    state = RunState()
    state.ingest(hello())
    for i in range(5):
        state.ingest(step(i))
    assert {c.key: c for c in cards(state)}["util"].value == "-"
    assert util_series(state, 100) == {}
    state.ingest(ev.SysEvent(t=2.0, cpu_util=40.0, proc_cpu=90.0, sys_mem_used=1 << 30))
    card = {c.key: c for c in cards(state)}["util"]
    assert card.value == "CPU 40%" and "engine 90%" in card.sub
    assert util_series(state, 100) == {"CPU": ([2.0], [40.0]), "engine CPU": ([2.0], [90.0])}


@pytest.mark.unit
def test_ring_buffers_stay_bounded() -> None:
    state = RunState(maxlen=256)
    for i in range(5000):
        state.ingest(step(i, ms=float(i % 7), skipped=i % 10 == 0))
    assert len(state.steps) == 256 and state.steps[0][0] == 5000 - 256
    assert len(state.log) <= 1000 and state.skipped == 500
    assert RunState().steps.maxlen == MAX_POINTS


@pytest.mark.unit
def test_thinning_keeps_two_points_a_column_and_the_spikes() -> None:
    xs = list(range(4096))
    ys = [1.0] * 4096
    ys[1234] = 50.0  # a single stalled step must survive thinning
    columns = 60
    tx, ty = thin(xs, ys, points_for_width(columns))
    assert len(tx) <= 2 * columns and len(tx) >= columns
    assert max(ty) == 50.0 and tx == sorted(tx)
    assert thin([1, 2, 3], [3, 2, 1], 100) == ([1, 2, 3], [3, 2, 1])
    state = RunState()
    for i in range(3000):
        state.ingest(step(i, loss=math.nan if i == 5 else 1.0))
    xs2, _ = step_time_series(state, points_for_width(columns))
    assert len(xs2) <= 2 * columns
    (lx, _), _ = loss_series(state, 10_000)
    assert 5 not in lx  # non-finite losses are not plotted


@pytest.mark.unit
def test_replay_of_a_record_without_done_is_incomplete() -> None:
    state = RecordSource([hello(), step(0), step(1)], label="fp32").state
    assert state.read_only and state.status == "incomplete" and state.step == 1


@pytest.mark.unit
def test_process_exit_without_error_event_shows_stderr() -> None:
    state = RunState()
    state.process_exited(1, ["Traceback (most recent call last):", "ImportError: boom"])
    assert state.status == "failed" and "code 1" in (state.error or "")
    assert any("ImportError: boom" in e.text for e in state.log)


@pytest.mark.unit
def test_parse_autostart() -> None:
    assert parse_autostart("fp32 workload.kind=mlp 'device=cpu'") == (
        "fp32",
        ["workload.kind=mlp", "device=cpu"],
    )
    assert parse_autostart("  ") is None


# --------------------------------------------------------------------------- the app


@pytest.mark.unit
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
            assert app.session.engine is None and isinstance(app.screen, PresetsScreen)
            steps_input.value = "7"
            screen.query_one("#" + field_id("lr")).value = "1e-4"
            assert await wait_for(pilot, lambda: screen.preset is not None, 5)
            assert text(screen, "#preset-error") == ""
            assert screen.is_edited and screen.preset.steps == 7
            screen.query_one("#preset-list").focus()
            await pilot.press("s")
            dialog = await shown(pilot, app, SaveDialog)
            dialog.query_one("#save-name").value = "my-fp32"
            await pilot.press("enter")
            saved = cfg.user_presets_dir() / "my-fp32.toml"
            assert await wait_for(pilot, saved.is_file, 5)
            loaded = cfg.load_preset("my-fp32")
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
            pid = app.session.engine.pid
            assert pid is not None
            assert await wait_for(
                pilot,
                lambda: (
                    (app.session.state.step or 0) >= 5
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
            assert await wait_for(pilot, lambda: app.session.state.status == "stopped", 10)
            assert wait_gone(pid, 5)
            assert await wait_for(pilot, lambda: "stopped" in text(screen, "#run-header"), 5)
            assert app.session.state.done is not None and app.session.state.done.status == "stopped"
            # history: the run's record, replayed read-only in the same view
            await pilot.press("escape")
            await shown(pilot, app, PresetsScreen)
            await pilot.press("h")
            history = await shown(pilot, app, HistoryScreen)
            table = history.query_one("#history-table")
            assert await wait_for(pilot, lambda: table.row_count == 1, 5)
            assert table.get_row_at(0)[:2] == ["fp32", "stopped"]
            await pilot.press("enter")
            assert await wait_for(pilot, lambda: app.screen not in (history, screen), 5)
            replayed = app.screen
            assert isinstance(replayed, RunScreen) and replayed is not screen
            assert replayed.state.read_only and replayed.state.status == "stopped"
            assert replayed.state.step == app.session.state.step
            await pilot.press("escape")
            await shown(pilot, app, HistoryScreen)

    run(go())


@pytest.mark.subprocess
def test_back_to_presets_then_a_second_run_shows_the_new_run(tmp_path: Path) -> None:
    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path, extra_overrides=[*FAST, "steps=4"])
        async with app.run_test(size=SIZE) as pilot:
            await shown(pilot, app, PresetsScreen)
            for name in ("fp32", "mlp-demo"):
                select_preset(app, name)
                await pilot.press("enter")
                assert await wait_for(pilot, lambda: app.session.state.status == "done", 60)
                screen = await shown(pilot, app, RunScreen)

                def header(screen: RunScreen = screen) -> str:
                    return text(screen, "#run-header")

                assert await wait_for(pilot, lambda: "done" in header(), 5), header()
                assert name in header()
                await pilot.press("escape")
                await shown(pilot, app, PresetsScreen)

    run(go())


@pytest.mark.subprocess
def test_config_error_and_crash_are_shown_and_the_app_stays_up(tmp_path: Path) -> None:
    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path, extra_overrides=FAST)
        async with app.run_test(size=SIZE) as pilot:
            await shown(pilot, app, PresetsScreen)
            await app.session.start_run("fp32", ["precision='fp8'"])
            assert await wait_for(pilot, lambda: app.session.state.status == "failed", 20)
            screen = await shown(pilot, app, RunScreen)
            assert await wait_for(pilot, lambda: "fp8" in text(screen, "#run-error"), 5)
            log = screen.query_one(EventLog)
            assert await wait_for(pilot, lambda: "[config]" in "\n".join(log.texts), 5)
            assert "fp8" in "\n".join(log.texts)
            # back, and run a preset that crashes at step 2
            await pilot.press("escape")
            await shown(pilot, app, PresetsScreen)
            await app.session.start_run("fp32", ["steps=50", "debug.raise_at_step=2"])
            assert await wait_for(pilot, lambda: app.session.state.exit_code is not None, 60)
            screen = await shown(pilot, app, RunScreen)
            assert await wait_for(pilot, lambda: "failed" in text(screen, "#run-header"), 5)
            assert app.is_running
            log_text = "\n".join(screen.query_one(EventLog).texts)
            assert "exception" in log_text and "step" in log_text
            assert app.session.state.error and "exception" in app.session.state.error

    run(go())


@pytest.mark.subprocess
def test_quit_mid_run_leaves_no_engine(tmp_path: Path) -> None:
    pids: list[int] = []

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path, extra_overrides=LONG)
        async with app.run_test(size=SIZE) as pilot:
            await shown(pilot, app, PresetsScreen)
            await app.session.start_run("fp32")
            pids.append(app.session.engine.pid)
            assert await wait_for(pilot, lambda: (app.session.state.step or 0) >= 2), "no steps"
            await pilot.press("q")

    run(go())
    assert pids and wait_gone(pids[0], 5)


@pytest.mark.subprocess
def test_hangup_kills_dashboard_and_engine(tmp_path: Path) -> None:
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = engine_env(
        AMPSCOPE_AUTOSTART="fp32 workload.kind=mlp device=cpu steps=100000",
        AMPSCOPE_RUNS_DIR=str(tmp_path),
        TERM="xterm-256color",
    )
    code = "import sys; from ampscope.tui.app import run_dashboard; sys.exit(run_dashboard())"
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
        env=env,
        cwd=ROOT,
    )
    os.close(slave)
    output = bytearray()

    def drain() -> None:  # a terminal that reads what the app writes
        with contextlib.suppress(OSError):
            while chunk := os.read(master, 65536):
                output.extend(chunk)

    threading.Thread(target=drain, daemon=True).start()
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
    from ampscope.cli.viewer import main as viewer_main
    from ampscope.core.run_args import REFRESH_RANGE

    with pytest.raises(SystemExit) as exit_:
        viewer_main(["--refresh", "5"])
    assert exit_.value.code == 2 and "0.5 to 4" in capsys.readouterr().err
    low, high = REFRESH_RANGE
    assert AmpscopeApp(refresh_hz=low).refresh_hz == low
    assert AmpscopeApp(refresh_hz=high).refresh_hz == high
    for bad in (high + 0.5, low / 2, math.inf):
        with pytest.raises(ValueError, match="accepted: 0.5 to 4"):
            AmpscopeApp(refresh_hz=bad)


@pytest.mark.unit
def test_every_key_binding_has_an_id_a_keymap_can_move(tmp_path: Path) -> None:
    from textual.binding import Binding

    from ampscope.tui.screens.compare import CompareScreen
    from ampscope.tui.screens.formats import FormatsScreen
    from ampscope.tui.screens.memory import MemoryScreen
    from ampscope.tui.screens.presets import SaveDialog
    from ampscope.tui.viewer import WaitingScreen

    owners = [
        AmpscopeApp,
        PresetsScreen,
        SaveDialog,
        RunScreen,
        HistoryScreen,
        CompareScreen,
        FormatsScreen,
        MemoryScreen,
        WaitingScreen,
    ]
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


@pytest.mark.unit
def test_control_characters_are_spelled_out() -> None:
    from ampscope.core.text import visible

    assert visible("evil\x1b[2J\rdone\x07") == "evil\\x1b[2J\\rdone\\x07"
    assert visible("two\nlines\tand a tab") == "two\nlines\tand a tab"
    assert visible("two\nlines", lines=False) == "two\\nlines"
    assert visible("\x9b31m") == "\\x9b31m"  # the one-byte CSI too
    assert visible("fp32 · ok ✓") == "fp32 · ok ✓"


@pytest.mark.unit
def test_names_from_records_show_as_written_never_as_markup(tmp_path: Path) -> None:
    from rich.text import Text

    name = "[red]evil[/] [/x]\x1b[2J"
    shown_as = "[red]evil[/] [/x]\\x1b[2J"
    run_dir = write_finished_record(tmp_path, name)

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await shown(pilot, app, PresetsScreen)
            await pilot.press("h")
            history = await shown(pilot, app, HistoryScreen)
            table = history.query_one("#history-table")
            assert await wait_for(pilot, lambda: table.row_count == 1, 5)
            assert Text.from_markup(table.get_row_at(0)[0]).plain == shown_as
            await pilot.press("enter")
            screen = await shown(pilot, app, RunScreen)
            assert await wait_for(pilot, lambda: "done" in text(screen, "#run-header"), 5)
            assert shown_as in text(screen, "#run-header")
            log = screen.query_one(EventLog)
            assert any(shown_as in line for line in log.texts)  # the hello line names it

    run(go())
    assert run_dir.is_dir()
