"""Keys a newcomer can trust: what the footer offers works, help and the palette reach every
screen, esc is predictable, a live run is never stopped without asking, keys.toml applies."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ampscope.tui.app import AmpscopeApp
from ampscope.tui.keys import load_keymap, valid_key
from ampscope.tui.model.follow import AttachSource
from ampscope.tui.screens.compare import CompareScreen
from ampscope.tui.screens.dialogs import ConfirmDialog
from ampscope.tui.screens.formats import FormatsScreen
from ampscope.tui.screens.help import HelpScreen, key_rows
from ampscope.tui.screens.history import HistoryScreen
from ampscope.tui.screens.memory import MemoryScreen
from ampscope.tui.screens.preset_form import field_id
from ampscope.tui.screens.presets import PresetsScreen
from ampscope.tui.screens.run import RunScreen
from ampscope.tui.widgets.key_bar import KeyBar, KeyItem, fit
from ampscope.tui.widgets.plots import RunPlot
from tests.helpers import (
    FakeEngine,
    done,
    hello,
    run,
    select_preset,
    shown,
    step,
    wait_for,
)
from tests.test_detach import make_record

SMALL = (80, 24)


class Engines:
    """Fake engine children for the app's run manager: they run until stopped."""

    def __init__(self) -> None:
        self.made: list[FakeEngine] = []

    def __call__(self, preset, overrides, runs_dir, on_event) -> FakeEngine:
        engine = FakeEngine(preset, overrides, runs_dir, on_event, events=[hello(preset=preset)])
        self.made.append(engine)
        return engine


def app_with_fake_engines(tmp_path: Path) -> tuple[AmpscopeApp, Engines]:
    app = AmpscopeApp(runs_dir=tmp_path)
    engines = Engines()
    app.run_manager._start_engine = engines
    return app, engines


async def start_from_presets(pilot, app, name: str = "fp32") -> RunScreen:
    """From the Presets screen: highlight ``name``, press r, and wait for the Run view."""
    await shown(pilot, app, PresetsScreen)
    select_preset(app, name)
    await pilot.press("r")
    return await shown(pilot, app, RunScreen)


def footer(app) -> str:
    return app.screen.query_one(KeyBar).plain


@pytest.mark.unit
def test_the_footer_keeps_run_help_and_quit_when_space_is_short() -> None:
    items = [
        KeyItem("h", "h", "History", True, 3),
        KeyItem("r", "r", "Run", True, 0),
        KeyItem("m", "m", "Mark for sweep", True, 5),
        KeyItem("question_mark", "?", "Help", True, 1),
        KeyItem("q", "q", "Quit", True, 1),
    ]
    ranked = sorted(items, key=lambda i: i.rank)
    shown = fit(ranked, 22)
    assert [i.description for i in shown] == ["Run", "Help", "Quit"]
    assert sum(len(i.display) + 1 + len(i.description) for i in shown) + 2 * 2 <= 22


@pytest.mark.ui
def test_starting_a_run_while_one_runs_asks_first(tmp_path: Path) -> None:
    async def go() -> None:
        app, engines = app_with_fake_engines(tmp_path)
        async with app.run_test(size=SMALL) as pilot:
            await start_from_presets(pilot, app)
            assert await wait_for(pilot, lambda: len(engines.made) == 1, 5)
            await pilot.press("escape")
            await shown(pilot, app, PresetsScreen)
            select_preset(app, "amp-bf16")
            await pilot.press("r")
            dialog = await shown(pilot, app, ConfirmDialog)
            assert "fp32 is running" in dialog.question and "amp-bf16" in dialog.question
            await pilot.press("enter")  # No has the focus: enter stops nothing
            await shown(pilot, app, PresetsScreen)
            assert len(engines.made) == 1 and engines.made[0].running
            await pilot.press("r")
            await shown(pilot, app, ConfirmDialog)
            await pilot.press("y")
            assert await wait_for(pilot, lambda: len(engines.made) == 2, 5)
            assert engines.made[0].stop_requested and engines.made[1].preset == "amp-bf16"
            # restart in the Run view asks too while the run goes on
            await shown(pilot, app, RunScreen)
            await pilot.press("r")
            await shown(pilot, app, ConfirmDialog)
            await pilot.press("n")
            assert len(engines.made) == 2

    run(go())


@pytest.mark.ui
def test_esc_from_the_run_view_gives_the_keys_back_to_the_list(tmp_path: Path) -> None:
    async def go() -> None:
        app, engines = app_with_fake_engines(tmp_path)
        async with app.run_test(size=SMALL) as pilot:
            presets = await shown(pilot, app, PresetsScreen)
            select_preset(app, "fp32")
            steps = presets.query_one("#" + field_id("steps"))
            steps.focus()
            await pilot.pause()
            assert "esc Done editing" in footer(app) and "^q Quit" in footer(app)
            assert steps.parent.get_style_at(0, 0).reverse  # its name is lit
            await pilot.press("tab")  # the next field lights, this one goes dark
            assert not steps.parent.get_style_at(0, 0).reverse
            steps.focus()
            await pilot.pause()
            await pilot.press("escape")  # esc leaves the field first
            assert presets.focused is presets.query_one("#preset-list")
            steps.focus()
            await pilot.press("enter")  # runs the preset from the field
            await shown(pilot, app, RunScreen)
            await pilot.press("escape")
            await shown(pilot, app, PresetsScreen)
            assert presets.focused is presets.query_one("#preset-list")
            await pilot.press("h")  # a key, not a letter typed into 'steps'
            await shown(pilot, app, HistoryScreen)
            assert steps.value == str(presets.draft.base["steps"])

    run(go())


@pytest.mark.ui
def test_after_a_run_two_marked_presets_show_w_in_the_footer_at_80_columns(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        app, engines = app_with_fake_engines(tmp_path)
        async with app.run_test(size=SMALL) as pilot:
            await start_from_presets(pilot, app)
            await pilot.press("escape")
            await shown(pilot, app, PresetsScreen)
            assert "v Live run" in footer(app)
            assert "Run sweep" not in footer(app)  # nothing marked: w gives way
            for name in ("fp32", "mlp-demo"):
                select_preset(app, name)
                await pilot.press("m")
            keys = footer(app)
            assert "w Run sweep" in keys and "m Mark for sweep" in keys
            assert "r Run" in keys and "? Help" in keys and "q Quit" in keys

    run(go())


@pytest.mark.ui
def test_a_run_view_says_none_recorded_once_a_run_without_samples_ends(tmp_path: Path) -> None:
    async def go() -> None:
        app, engines = app_with_fake_engines(tmp_path)
        async with app.run_test(size=SMALL) as pilot:
            screen = await start_from_presets(pilot, app)
            util = screen.query_one("#plot-util", RunPlot)
            assert await wait_for(pilot, lambda: "waiting for the first samples" in util.text)
            (engine,) = engines.made
            engine.on_event(step(0))
            engine.on_event(done(steps=1))
            engine.finish(0)
            assert await wait_for(pilot, lambda: "none recorded" in util.text, 5)
            await pilot.press("s")  # dimmed now: pressed, it says why
            assert [n.message for n in app._notifications] == ["Stop: the run has ended"]

    run(go())


@pytest.mark.subprocess
def test_v_returns_to_an_attached_run_and_its_keys_all_work(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        run_dir = make_record(tmp_path, "20260101T000001Z-fp32", sleeper.pid)

        async def go() -> None:
            app = AmpscopeApp(runs_dir=tmp_path)
            async with app.run_test(size=SMALL) as pilot:
                await shown(pilot, app, PresetsScreen)
                source = AttachSource(run_dir)
                screen = app.open_run(source)
                await shown(pilot, app, RunScreen)
                assert await wait_for(pilot, lambda: screen.state.step_count == 5, 5)
                keys = footer(app)
                assert "s Stop" in keys and "Restart" not in keys  # r would do nothing
                assert screen.check_action("restart", ()) is False
                await pilot.press("escape")
                await shown(pilot, app, PresetsScreen)
                assert "v Live run" in footer(app)
                await pilot.press("v")
                back = await shown(pilot, app, RunScreen)
                assert back is screen and back.source is source

        run(go())
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.ui
@pytest.mark.parametrize(
    "open_it",
    [
        pytest.param(lambda app: None, id="presets"),
        pytest.param(lambda app: app.show_history(), id="history"),
        pytest.param(lambda app: app.show_formats(), id="formats"),
        pytest.param(lambda app: app.show_memory(), id="memory"),
    ],
)
def test_every_screen_has_help_listing_its_keys(tmp_path: Path, open_it) -> None:
    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=SMALL) as pilot:
            await shown(pilot, app, PresetsScreen)
            open_it(app)
            await pilot.pause()
            target = app.screen
            app.action_help()  # what ? and F1 do
            help_screen = await shown(pilot, app, HelpScreen)
            assert help_screen.target is target
            described = {does for _keys, does, _note, _ids in help_screen.rows}
            assert "Quit" in described and ("Back" in described or "Run" in described)
            await pilot.press("escape")
            assert app.screen is target

    run(go())


@pytest.mark.ui
def test_help_says_why_a_key_does_nothing(tmp_path: Path) -> None:
    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=SMALL) as pilot:
            presets = await shown(pilot, app, PresetsScreen)
            rows = {ids: note for _keys, _does, note, ids in key_rows(presets)}
            assert rows["presets.sweep"] == "unavailable now: mark two or more presets with m first"
            assert rows["presets.live-run"].startswith("not here")
            detach = [(what, note) for _k, what, note, ids in key_rows(presets) if "detach" in ids]
            assert detach == [("Detached: off", "")]  # the toggle once, as it stands

    run(go())


@pytest.mark.ui
def test_the_palette_reaches_every_screen(tmp_path: Path) -> None:
    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=SMALL) as pilot:
            await shown(pilot, app, PresetsScreen)
            commands = {c.title: c.callback for c in app.get_system_commands(app.screen)}
            for title in ("Keys and help", "History", "Number formats", "Memory plan", "Quit"):
                assert title in commands
            for title, kind in (
                ("History", HistoryScreen),
                ("Number formats", FormatsScreen),
                ("Memory plan", MemoryScreen),
            ):
                commands[title]()
                screen = await shown(pilot, app, kind)
                assert await wait_for(pilot, lambda s=screen: s.is_mounted, 10)
                await pilot.pause()
                commands = {c.title: c.callback for c in app.get_system_commands(app.screen)}
                commands["Presets"]()
                await shown(pilot, app, PresetsScreen)
            commands["Compare the last sweep"]()  # none yet: said, nothing opens
            await pilot.pause()
            assert not isinstance(app.screen, CompareScreen)

    run(go())


@pytest.mark.ui
def test_keys_toml_moves_a_key_and_a_bad_line_is_said(tmp_path: Path, monkeypatch) -> None:
    config = tmp_path / "config"
    (config / "ampscope").mkdir(parents=True)
    (config / "ampscope" / "keys.toml").write_text(
        '"presets.history" = "y"\n"no.such.id" = "x"\n"presets.formats" = "ctlr+f"\n'
    )
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        told: list[str] = []
        app.tell = lambda message, **kw: told.append(message)  # type: ignore[method-assign]
        async with app.run_test(size=SMALL) as pilot:
            await shown(pilot, app, PresetsScreen)
            assert "y History" in footer(app)
            await pilot.press("h")
            await pilot.pause()
            assert isinstance(app.screen, PresetsScreen)
            await pilot.press("y")
            await shown(pilot, app, HistoryScreen)
        (problem,) = told
        assert "'no.such.id' is no binding id" in problem and "'ctlr+f' is no key" in problem

    run(go())


@pytest.mark.unit
def test_key_names_are_checked_as_textual_reads_them() -> None:
    assert all(valid_key(k) for k in ("x", "?", "f5", "ctrl+x", "shift+tab", "question_mark"))
    assert not any(valid_key(k) for k in ("ctlr+x", "", "f99", "ctrl+"))
    keymap, problems = load_keymap(Path("/nonexistent/keys.toml"), {"quit"})
    assert keymap == {} and problems == []


@pytest.mark.ui
def test_a_replay_stream_shows_steps_and_no_engine_keys(tmp_path: Path) -> None:
    from ampscope.tui.model.replay import ReplaySource

    events = [hello(), *(step(i) for i in range(20))]

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=SMALL) as pilot:
            await shown(pilot, app, PresetsScreen)
            app.open_run(ReplaySource(events, label="fp32", speed=50))
            screen = await shown(pilot, app, RunScreen)
            assert await wait_for(pilot, lambda: screen.state.step == 19, 5)
            keys = footer(app)
            assert "Stop" not in keys and "Restart" not in keys and "space Pause/play" in keys

    run(go())


@pytest.mark.unit
def test_the_run_header_breaks_between_its_parts_never_inside_one() -> None:
    from ampscope.tui.screens.run import fit_header

    header = "failed · 2/150 steps · fp16 · cpu (AMD EPYC) · fp16 · compile off · end 100% · 20x"
    assert fit_header(header, 120) == header
    assert "AMD EPYC" not in fit_header(header, 78)  # the device's name goes first
    first, second = fit_header(header, 60).split("\n")
    assert len(first) <= 60 and first.endswith("compile off") and second == "end 100% · 20x"


@pytest.mark.ui
@pytest.mark.parametrize(
    ("line", "taken"),
    [('"presets.run" = "h"', "'presets.history'"), ('"presets.run" = "ctrl+c"', "Textual's")],
)
def test_a_keys_toml_line_that_takes_another_bindings_key_is_refused_and_named(
    tmp_path: Path, monkeypatch, line: str, taken: str
) -> None:
    """Textual let one of the two take the key silently (h ran a preset instead of opening
    History), or told the user run lost ctrl+c while ctrl+c still started a run."""
    config = tmp_path / "config"
    (config / "ampscope").mkdir(parents=True)
    (config / "ampscope" / "keys.toml").write_text(line + '\n"numerics.format" = "g"\n')
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        told: list[str] = []
        app.tell = lambda message, **kw: told.append(message)  # type: ignore[method-assign]
        started: list[str] = []

        async def start_run(preset: str, *args, **kw) -> None:
            started.append(preset)

        app.run_manager.start_run = start_run  # type: ignore[method-assign]
        async with app.run_test(size=SMALL) as pilot:
            await shown(pilot, app, PresetsScreen)
            key = line.split('"')[3]
            if key == "h":
                await pilot.press("h")
                await shown(pilot, app, HistoryScreen)  # h keeps History
                await pilot.press("escape")
                await shown(pilot, app, PresetsScreen)
            else:
                await pilot.press("ctrl+c")  # the key run lost: it starts nothing
                await pilot.pause()
                assert started == [] and isinstance(app.screen, PresetsScreen)
            await pilot.press("r")  # run keeps its own key
            await pilot.pause()
        (problem,) = told  # numerics.format is a binding id the file may move
        assert f"'presets.run' = \"{key}\" is ignored: {key} is already {taken}" in problem
        assert "the Presets screen" in problem
        assert len(started) == 1

    run(go())


@pytest.mark.ui
def test_a_toast_about_the_last_run_goes_when_the_run_is_restarted(tmp_path: Path) -> None:
    async def go() -> None:
        app, engines = app_with_fake_engines(tmp_path)
        async with app.run_test(size=SMALL) as pilot:
            screen = await start_from_presets(pilot, app)
            app.notify("Profile: the last run's notice", title="Not now")
            assert await wait_for(pilot, lambda: "the last run's notice" in toasts(app), 5)
            await pilot.press("r")
            await shown(pilot, app, ConfirmDialog)
            await pilot.press("y")
            assert await wait_for(pilot, lambda: len(engines.made) == 2, 5)
            assert await shown(pilot, app, RunScreen) is screen
            await pilot.pause()
            assert "the last run's notice" not in toasts(app)

    run(go())


def toasts(app) -> str:
    """The notices up now (those the app has not timed out or cleared)."""
    return " ".join(n.message for n in app._notifications)


@pytest.mark.ui
def test_ctrl_z_suspends_the_dashboard_as_the_shell_expects(tmp_path: Path) -> None:
    """Ctrl+Z was a key the dashboard ate: over SSH, a user could not put it in the background
    with the shell's job control (fg brings it back)."""
    suspended: list[str] = []

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        app.action_suspend_process = lambda: suspended.append(type(app.screen).__name__)  # type: ignore[method-assign]
        async with app.run_test(size=SMALL) as pilot:
            await shown(pilot, app, PresetsScreen)
            await pilot.press("ctrl+z")
            await pilot.pause()
            await pilot.press("h")
            await shown(pilot, app, HistoryScreen)
            await pilot.press("ctrl+z")
            await pilot.pause()

    run(go())
    assert suspended == ["PresetsScreen", "HistoryScreen"]


@pytest.mark.ui
def test_r_on_a_user_preset_whose_file_was_removed_runs_nothing_and_says_so(
    tmp_path: Path, monkeypatch
) -> None:
    """The engine was started on the name and failed: a Run view of "Unknown preset 'mine'"
    with the list still offering it."""
    config = tmp_path / "config"
    (config / "ampscope" / "presets").mkdir(parents=True)
    preset = config / "ampscope" / "presets" / "mine.toml"
    preset.write_text('name = "mine"\nprecision = "fp32"\nsteps = 20\ndevice = "cpu"\n')
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    started: list[str] = []
    told: list[str] = []

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path / "runs")

        async def start_run(name: str, *args, **kw) -> None:
            started.append(name)

        app.run_manager.start_run = start_run  # type: ignore[method-assign]
        notify = app.notify
        app.notify = lambda message, **kw: told.append(message) or notify(message, **kw)  # type: ignore[method-assign]
        async with app.run_test(size=SMALL) as pilot:
            screen = await shown(pilot, app, PresetsScreen)
            select_preset(app, "mine")
            assert await wait_for(pilot, lambda: getattr(screen.current, "name", "") == "mine")
            preset.unlink()
            await pilot.press("r")
            await pilot.pause()
            assert isinstance(app.screen, PresetsScreen)

    run(go())
    assert started == []
    (notice,) = told
    assert notice.startswith(f"mine: its file {preset} was removed since the list was read")
    assert "s saves the form" in notice
