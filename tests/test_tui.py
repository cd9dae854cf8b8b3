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
from ampscope.tui.run_state import MAX_POINTS, RunState, points_for_width, replay, thin
from ampscope.tui.screens.history import HistoryScreen
from ampscope.tui.screens.presets import PresetsScreen, field_id
from ampscope.tui.screens.run import RunScreen
from ampscope.tui.widgets.event_log import EventLog
from ampscope.tui.widgets.plots import RunPlot
from tests.conftest import ROOT, engine_env
from tests.helpers import FAST, SIZE, gone, hello, run, select_preset, step, wait_for, wait_gone

LONG = [*FAST, "steps=100000"]


# --------------------------------------------------------------------------- run state


def done(status: str = "ok", steps: int = 30) -> ev.DoneEvent:
    return ev.DoneEvent(
        status=status,
        steps_done=steps,
        step_ms_median=10.0,
        step_ms_p10=9.0,
        step_ms_p90=11.0,
        samples_per_s=800.0,
        tokens_per_s=None,
        tflops=0.5,
        mfu=None,
        mem_peak=150 << 20,
        loss_first=2.0,
        loss_final=0.1,
        skipped_steps=2,
        compile_s=None,
        wall_s=1.0,
    )


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
    cards = {c.key: c for c in state.cards()}
    assert cards["step_ms"].value == "20.0 ms"
    assert cards["skipped"].value == "2"
    assert cards["loss_scale"].value == "32.8k" and cards["loss_scale"].sub == "2^15"
    assert cards["throughput"].value == "800 samples/s"
    assert "no NVIDIA GPU" in cards["util"].sub
    assert cards["memory"].value == "150 MiB"  # peak allocated, never the reserved 200 MiB
    assert cards["memory"].sub == "peak allocated · resv 200 MiB"
    levels = [(e.level, e.step) for e in state.log]
    assert ("skipped", 35) in levels and ("skipped", 36) in levels and ("warning", 35) in levels
    (lx, _ly), (sx, sy) = state.loss_series(1000)
    assert len(lx) == 40 and sy[0] == 16 and sy[-1] == 15  # scale plotted as log2
    assert "step 40/100" in state.header() and "training" in state.header()
    state.ingest(done("ok", 40))
    assert state.status == "done" and state.finished


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
    card = {c.key: c for c in state.cards()}["util"]
    assert card.value == "87%" and "300 W" in card.sub
    assert set(state.memory_series(100)) == {"device used", "device total"}
    assert set(state.util_series(100)) == {"GPU", "CPU"}
    # the dashboard's own psutil samples never mix with the engine's
    state.ingest_local_sys(ev.SysEvent(t=3.0, cpu_util=50.0))
    assert len(state.sys) == 1


def test_ring_buffers_stay_bounded() -> None:
    state = RunState(maxlen=256)
    for i in range(5000):
        state.ingest(step(i, ms=float(i % 7), skipped=i % 10 == 0))
    assert len(state.steps) == 256 and state.steps[0][0] == 5000 - 256
    assert len(state.log) <= 1000 and state.skipped == 500
    assert RunState().steps.maxlen == MAX_POINTS


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
    xs2, _ = state.step_time_series(points_for_width(columns))
    assert len(xs2) <= 2 * columns
    (lx, _), _ = state.loss_series(10_000)
    assert 5 not in lx  # non-finite losses are not plotted


def test_replay_of_a_record_without_done_is_incomplete() -> None:
    state = replay([hello(), step(0), step(1)], label="fp32")
    assert state.read_only and state.status == "incomplete" and state.step == 1


def test_process_exit_without_error_event_shows_stderr() -> None:
    state = RunState()
    state.process_exited(1, ["Traceback (most recent call last):", "ImportError: boom"])
    assert state.status == "failed" and "code 1" in (state.error or "")
    assert any("ImportError: boom" in e.text for e in state.log)


def test_parse_autostart() -> None:
    assert parse_autostart("fp32 workload.kind=mlp 'device=cpu'") == (
        "fp32",
        ["workload.kind=mlp", "device=cpu"],
    )
    assert parse_autostart("  ") is None


# --------------------------------------------------------------------------- the app


def test_form_refuses_invalid_values_and_saves_a_user_preset(tmp_path: Path) -> None:
    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, PresetsScreen)
            select_preset(app, "fp32")
            await pilot.pause(0.2)
            steps_input = screen.query_one("#" + field_id("steps"))
            steps_input.value = "0"
            await pilot.pause(0.2)
            error = str(screen.query_one("#preset-error").render())
            assert "steps" in error and ">= 1" in error
            assert steps_input.has_class("-invalid")
            await pilot.press("enter")  # refused: nothing starts
            await pilot.pause(0.1)
            assert app.engine is None and isinstance(app.screen, PresetsScreen)
            steps_input.value = "7"
            screen.query_one("#" + field_id("lr")).value = "1e-4"
            await pilot.pause(0.2)
            assert str(screen.query_one("#preset-error").render()) == ""
            assert screen.is_edited and screen.preset.steps == 7
            screen.query_one("#preset-list").focus()
            await pilot.press("s")
            await pilot.pause(0.2)
            name_input = app.screen.query_one("#save-name")
            name_input.value = "my-fp32"
            await pilot.press("enter")
            await pilot.pause(0.2)
            saved = cfg.user_presets_dir() / "my-fp32.toml"
            assert saved.is_file()
            loaded = cfg.load_preset("my-fp32")
            assert loaded.steps == 7 and loaded.lr == 1e-4 and loaded.name == "my-fp32"
            assert "my-fp32" in [p.name for p in screen.presets]

    run(go())


def test_live_run_plots_stop_and_history_replay(tmp_path: Path) -> None:
    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path, extra_overrides=LONG)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            select_preset(app, "fp32")
            await pilot.press("enter")
            await pilot.pause(0.2)
            assert isinstance(app.screen, RunScreen)
            screen = app.screen
            pid = app.engine.pid
            assert pid is not None
            assert await wait_for(
                pilot,
                lambda: (
                    (app.state.step or 0) >= 5
                    and all(
                        p.points_drawn > 0 for p in screen.query(RunPlot) if p.id != "plot-util"
                    )
                ),
            ), "no steps in 60 s"
            header = str(screen.query_one("#run-header").render())
            assert "fp32" in header and "cpu" in header and "training" in header
            assert screen.displayed_step is not None
            await pilot.press("s")
            assert await wait_for(pilot, lambda: app.state.status == "stopped", 10)
            assert wait_gone(pid, 5)
            await pilot.pause(0.5)
            assert "stopped" in str(screen.query_one("#run-header").render())
            assert app.state.done is not None and app.state.done.status == "stopped"
            # history: the run's record, replayed read-only in the same view
            await pilot.press("escape")
            await pilot.pause(0.1)
            assert isinstance(app.screen, PresetsScreen)
            await pilot.press("h")
            await pilot.pause(0.3)
            assert isinstance(app.screen, HistoryScreen)
            table = app.screen.query_one("#history-table")
            assert table.row_count == 1
            assert table.get_row_at(0)[:2] == ["fp32", "stopped"]
            await pilot.press("enter")
            await pilot.pause(0.3)
            replayed = app.screen
            assert isinstance(replayed, RunScreen) and replayed is not screen
            assert replayed.state.read_only and replayed.state.status == "stopped"
            assert replayed.state.step == app.state.step
            await pilot.press("escape")
            await pilot.pause(0.1)
            assert isinstance(app.screen, HistoryScreen)

    run(go())


def test_back_to_presets_then_a_second_run_shows_the_new_run(tmp_path: Path) -> None:
    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path, extra_overrides=[*FAST, "steps=4"])
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            for name in ("fp32", "mlp-demo"):
                select_preset(app, name)
                await pilot.press("enter")
                assert await wait_for(pilot, lambda: app.state.status == "done", 60)
                await pilot.pause(0.5)
                assert isinstance(app.screen, RunScreen)
                header = str(app.screen.query_one("#run-header").render())
                assert name in header and "done" in header
                await pilot.press("escape")
                await pilot.pause(0.2)
                assert isinstance(app.screen, PresetsScreen)

    run(go())


def test_config_error_and_crash_are_shown_and_the_app_stays_up(tmp_path: Path) -> None:
    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path, extra_overrides=FAST)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await app.start_run("fp32", ["precision='fp8'"])
            assert await wait_for(pilot, lambda: app.state.status == "failed", 20)
            await pilot.pause(0.5)
            screen = app.screen
            assert isinstance(screen, RunScreen)
            assert "fp8" in str(screen.query_one("#run-error").render())
            log = "\n".join(screen.query_one(EventLog).texts)
            assert "[config]" in log and "fp8" in log
            # back, and run a preset that crashes at step 2
            await pilot.press("escape")
            await pilot.pause(0.1)
            assert isinstance(app.screen, PresetsScreen)
            await app.start_run("fp32", ["steps=50", "debug.raise_at_step=2"])
            assert await wait_for(pilot, lambda: app.state.exit_code is not None, 60)
            await pilot.pause(0.3)
            assert app.is_running and isinstance(app.screen, RunScreen)
            log = "\n".join(app.screen.query_one(EventLog).texts)
            assert "exception" in log and "step" in log
            assert app.state.error and "exception" in app.state.error
            assert "failed" in str(app.screen.query_one("#run-header").render())

    run(go())


def test_quit_mid_run_leaves_no_engine(tmp_path: Path) -> None:
    pids: list[int] = []

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path, extra_overrides=LONG)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await app.start_run("fp32")
            pids.append(app.engine.pid)
            assert await wait_for(pilot, lambda: (app.state.step or 0) >= 2), "no steps"
            await pilot.press("q")
            await pilot.pause(0.2)

    run(go())
    assert pids and wait_gone(pids[0], 5)


def test_hangup_kills_dashboard_and_engine(tmp_path: Path) -> None:
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = engine_env(
        AMPSCOPE_AUTOSTART="fp32 workload.kind=mlp device=cpu steps=100000",
        AMPSCOPE_RUNS_DIR=str(tmp_path),
        TERM="xterm-256color",
    )
    code = "import sys; from tui.app import run_dashboard; sys.exit(run_dashboard())"
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
