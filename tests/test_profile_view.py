"""The Run view's p: a request the running engine takes between steps, and the answer's chart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ampscope.core import events as ev
from ampscope.core import profiles
from ampscope.core.processes.launch import engine_command
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.model.run_state import RunState
from ampscope.tui.screens.presets import PresetsScreen
from ampscope.tui.screens.profile import ProfileScreen
from ampscope.tui.screens.run import RunScreen
from tests.helpers import ROOT, engine_env, hello, run, shown, step, text, wait_for
from tests.snapshot_runs import FrozenSource, gpu_profile


def live_state(run_dir: Path | None, **kw) -> RunState:
    state = RunState(label="amp-fp16")
    state.ingest(hello(preset="amp-fp16", run_dir=str(run_dir) if run_dir else None, **kw))
    state.ingest(ev.PhaseEvent(phase="train", state="start", step=0))
    state.ingest(step(10))
    return state


@pytest.mark.ui
def test_p_asks_the_running_engine_and_the_answer_replaces_the_waiting_line(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await shown(pilot, app, PresetsScreen)
            state = live_state(tmp_path)
            app.open_run(FrozenSource(state))
            await shown(pilot, app, RunScreen)
            await pilot.press("p")
            screen = await shown(pilot, app, ProfileScreen)
            request = json.loads((tmp_path / profiles.REQUEST_FILE).read_text())
            assert request == {"steps": profiles.DEFAULT_STEPS}
            assert "Profiling the next 5 steps of amp-fp16" in text(screen, "#profile-body")
            state.ingest(gpu_profile(step=11))
            assert await wait_for(
                pilot, lambda: "matmul (fp16)" in text(screen, "#profile-body"), 5
            )
            assert "profile of 5 steps: matmul (fp16) 43%" in state.log[-1].text
            await pilot.press("escape")
            await shown(pilot, app, RunScreen)

    run(go())


@pytest.mark.ui
def test_p_asks_a_run_whose_folder_path_is_not_utf8(tmp_path: Path) -> None:
    """Before: the hello names such a folder with those bytes escaped (\\xe9), as the engine
    writes it, and p said the request could not be written there: no such folder."""
    folder = Path(os.fsdecode(bytes(tmp_path) + b"/r\xe9s"))
    folder.mkdir()

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await shown(pilot, app, PresetsScreen)
            state = RunState(label="amp-fp16")
            said = ev.decode(ev.encode(hello(preset="amp-fp16", run_dir=str(folder))))
            assert isinstance(said, ev.HelloEvent) and "\\xe9" in str(said.run_dir)
            state.ingest(said)
            state.ingest(ev.PhaseEvent(phase="train", state="start", step=0))
            state.ingest(step(10))
            notes: list[str] = []
            app.notify = lambda message, **kw: notes.append(str(message))  # type: ignore[method-assign]
            app.open_run(FrozenSource(state))
            await shown(pilot, app, RunScreen)
            await pilot.press("p")
            screen = await shown(pilot, app, ProfileScreen)
            request = json.loads((folder / profiles.REQUEST_FILE).read_text())
            assert request == {"steps": profiles.DEFAULT_STEPS}, notes
            assert "Profiling the next 5 steps of amp-fp16" in text(screen, "#profile-body")

    run(go())


@pytest.mark.ui
@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("watched", "a watched loop cannot be profiled from here"),
        ("ended", "the run has ended"),
        ("no-record", "this run keeps no record"),
    ],
)
def test_p_says_why_a_run_cannot_be_profiled(tmp_path: Path, kind: str, why: str) -> None:
    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await shown(pilot, app, PresetsScreen)
            folder = None if kind == "no-record" else tmp_path
            state = live_state(folder, source="watch" if kind == "watched" else "engine")
            if kind == "ended":
                from tests.helpers import done

                state.ingest(done())
            notes: list[str] = []
            app.notify = lambda message, **kw: notes.append(str(message))  # type: ignore[method-assign]
            app.open_run(FrozenSource(state, live=kind != "ended"))
            await shown(pilot, app, RunScreen)
            await pilot.press("p")
            await pilot.pause()
            assert isinstance(app.screen, RunScreen)
            assert any(why in n for n in notes), notes
            assert not (tmp_path / profiles.REQUEST_FILE).exists()

    run(go())


@pytest.mark.ui
def test_p_in_a_read_only_view_never_asks_the_live_run_to_profile(tmp_path: Path) -> None:
    """A served viewer (anyone with the link) has no effect on the run it shows."""

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path, read_only=True)
        async with app.run_test(size=(80, 24)) as pilot:
            await shown(pilot, app, PresetsScreen)
            notes: list[str] = []
            app.notify = lambda message, **kw: notes.append(str(message))  # type: ignore[method-assign]
            state = live_state(tmp_path)
            app.open_run(FrozenSource(state))
            screen = await shown(pilot, app, RunScreen)
            assert screen.check_action("profile", ()) is None  # shown, disabled
            await pilot.press("p")
            await pilot.pause()
            assert isinstance(app.screen, RunScreen)
            assert any("this view is read-only" in n for n in notes), notes
            assert not (tmp_path / profiles.REQUEST_FILE).exists()
            state.ingest(gpu_profile(step=11))  # a profile the run took is still shown
            await pilot.press("p")
            profile = await shown(pilot, app, ProfileScreen)
            assert profile.check_action("again", ()) is False
            assert not (tmp_path / profiles.REQUEST_FILE).exists()

    run(go())


@pytest.mark.subprocess
def test_a_running_engine_profiles_its_next_steps_when_asked_and_keeps_them_in_the_record(
    tmp_path: Path,
) -> None:
    proc = subprocess.Popen(
        engine_command(
            "mlp-demo",
            ["steps=100000", "workload.width=32", "workload.layers=2", "batch_size=8", "device='cpu'"],
            tmp_path,
        ),
        cwd=ROOT,
        env=engine_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        run_dir = None
        for line in proc.stdout:
            event = ev.decode(line)
            if isinstance(event, ev.HelloEvent):
                run_dir = Path(event.run_dir or "")
            if isinstance(event, ev.StepEvent) and event.step >= 3:
                break
        assert run_dir is not None
        profiles.ask_to_profile(run_dir, 2)
        found = None
        deadline = time.monotonic() + 60
        for line in proc.stdout:
            event = ev.decode(line)
            if isinstance(event, ev.ProfileEvent):
                found = event
                break
            assert time.monotonic() < deadline
        assert found is not None and found.steps == 2 and found.step > 3
        assert abs(sum(found.classes.values()) - 1.0) < 0.05
        assert found.trace and Path(found.trace).is_file()
        assert not (run_dir / profiles.REQUEST_FILE).exists()  # taken: asked once, answered once
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    recorded = [e for e in (ev.decode(x) for x in (run_dir / "events.jsonl").open("rb"))]
    assert any(isinstance(e, ev.ProfileEvent) for e in recorded)


@pytest.mark.ui
def test_p_answers_beside_a_fifo_in_the_run_folder(tmp_path: Path) -> None:
    """The request was written through a file of a fixed name: a FIFO under that name waited
    for a reader for ever, and the dashboard froze on p."""
    import threading

    fifo = tmp_path / (profiles.REQUEST_FILE + ".tmp")
    os.mkfifo(fifo)
    requests: list[object] = []

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await shown(pilot, app, PresetsScreen)
            app.open_run(FrozenSource(live_state(tmp_path)))
            await shown(pilot, app, RunScreen)
            await pilot.press("p")
            await shown(pilot, app, ProfileScreen)
            requests.append(json.loads((tmp_path / profiles.REQUEST_FILE).read_text()))

    thread = threading.Thread(target=lambda: run(go()), daemon=True)
    thread.start()
    thread.join(60)  # milliseconds when it answers; only a wait for ever takes this long
    stuck = thread.is_alive()
    while thread.is_alive():  # a writer stuck on the FIFO is let go (a reader opens it)
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        thread.join(0.1)
    assert not stuck, "p waited on the FIFO"
    assert requests == [{"steps": profiles.DEFAULT_STEPS}]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([fifo.name, profiles.REQUEST_FILE])  # no temporary file left behind
