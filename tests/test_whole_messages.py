"""What the Run view and the preset form say is never cut nor misleading, at 80x24 and
120x40: a factory's error and the form's error line show every word (wrapped, or scrolled
to), and a Grad zeros card that is never measured says off, not "not measured yet"."""

from __future__ import annotations

from pathlib import Path

import pytest

from ampscope.core import events as ev
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.screens.preset_form import field_id
from ampscope.tui.screens.presets import PresetsScreen
from ampscope.tui.screens.run import RunScreen
from tests.helpers import (
    FakeEngine,
    run,
    select_preset,
    shown,
    step,
    terminal_output,
    wait_for,
)

pytestmark = pytest.mark.ui

SIZES = [(80, 24), (120, 40)]

FACTORY_ERROR = (
    "workload.model = '/home/someone/projects/vision/tinyvit.py:make': the factory raised "
    "FileNotFoundError: [Errno 2] No such file or directory: '/data/imagenet/train'. "
    "Accepted: a function called as make(ctx) that returns a mapping with model and batches; "
    "see docs/model.md. LAST-WORDS"
)


def flat(screen_text: str) -> str:
    """The screen's text with its lines joined: a wrapped message reads as one."""
    return " ".join(" ".join(screen_text.split()).split())


async def a_failed_run(app: AmpscopeApp, pilot, events: list) -> RunScreen:
    def fake_engine(preset, overrides, runs_dir, on_event) -> FakeEngine:
        return FakeEngine(preset, overrides, runs_dir, on_event, events=events, exit_at_once=2)

    await shown(pilot, app, PresetsScreen)
    app.run_manager._start_engine = fake_engine
    await pilot.press("r")
    screen = await shown(pilot, app, RunScreen)
    assert await wait_for(pilot, lambda: screen.state.finished)
    await pilot.pause(0.6)
    return screen


@pytest.mark.parametrize("size", SIZES)
def test_a_factorys_error_is_shown_whole_in_the_run_view(size, tmp_path: Path) -> None:
    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=size) as pilot:
            error = ev.ErrorEvent(kind="config", message=FACTORY_ERROR, traceback="Traceback")
            await a_failed_run(app, pilot, [error])
            shown_text = flat(terminal_output(app)[0])
            assert f"config: {FACTORY_ERROR}" in shown_text  # every word, in order

    run(go())


@pytest.mark.parametrize("size", SIZES)
def test_an_error_after_steps_scrolls_to_its_last_words(size, tmp_path: Path) -> None:
    """Mid-run the plots keep their room; the error box scrolls, so no word is out of reach."""
    long = " ".join(f"word{i}" for i in range(120)) + " LAST-WORDS"

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=size) as pilot:
            events = [step(0, 10.0), step(1, 10.0), ev.ErrorEvent(kind="exception", message=long)]
            screen = await a_failed_run(app, pilot, events)
            box = screen.query_one("#run-error-box")
            box.scroll_end(animate=False)
            await pilot.pause(0.3)
            top = "\n".join(terminal_output(app)[0].splitlines()[:8])
            assert "LAST-WORDS" in top

    run(go())


@pytest.mark.parametrize("size", SIZES)
def test_the_preset_forms_error_line_wraps_rather_than_cut(size, tmp_path: Path) -> None:
    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=size) as pilot:
            screen = await shown(pilot, app, PresetsScreen)
            select_preset(app, "amp-bf16")
            await pilot.pause(0.3)
            steps = screen.query_one("#" + field_id("steps"))
            steps.focus()
            steps.value = "0"
            assert await wait_for(pilot, lambda: steps.has_class("-invalid"), 5)
            await pilot.pause(0.3)
            message = str(screen.query_one("#preset-error").render())
            assert message.endswith("<= 10000000."), message
            form = [ln.split("\u2502")[-1] for ln in terminal_output(app)[0].splitlines()]
            assert flat(message) in flat("\n".join(form))  # right of the list's border

    run(go())


@pytest.mark.parametrize("size", SIZES)
def test_a_watched_runs_grad_zeros_card_says_off_when_never_measured(size) -> None:
    from ampscope.tui.model.run_state import RunState
    from tests.helpers import hello
    from tests.snapshot_runs import FrozenSource

    state = RunState(label="mine")
    config = {"name": "mine", "source": "watch", "precision": "fp32", "grad_zero_every": 0}
    state.ingest(hello(preset="mine", config=config))
    for i in range(30):
        state.ingest(step(i, 10.0))

    async def go() -> None:
        app = AmpscopeApp(runs_dir=Path("runs"))
        async with app.run_test(size=size) as pilot:
            await shown(pilot, app, PresetsScreen)
            app.open_run(FrozenSource(state))
            await shown(pilot, app, RunScreen)
            await pilot.pause(0.5)
            cards = "\n".join(terminal_output(app)[0].splitlines()[1:8])
            assert "not measured yet" not in cards
            line = next(ln for ln in cards.splitlines() if "Grad zeros" in ln)
            under = cards.splitlines()[cards.splitlines().index(line) + 1]
            column = line.index("Grad zeros")
            assert under[column:].split()[0] == "off"
            if size == (120, 40):  # the detail line: 80x24 has none
                assert "grad_zero_every=0" in cards

    run(go())
