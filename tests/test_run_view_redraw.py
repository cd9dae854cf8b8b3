"""Following a run, the Run view sends the terminal the cells that changed, not whole plots
and cards, and what it shows is what a view opened afresh on the same run shows."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ampscope.tui.app import AmpscopeApp
from ampscope.tui.model.run_state import RunState
from ampscope.tui.screens.presets import PresetsScreen
from ampscope.tui.screens.run import RunScreen
from ampscope.tui.widgets.plots import RunPlot
from ampscope.tui.widgets.stat_cards import StatCard
from tests.helpers import hello, run, shown, step, terminal_output, wait_for
from tests.snapshot_runs import FrozenSource

pytestmark = pytest.mark.ui


def add_steps(state: RunState, first: int, count: int) -> None:
    for i in range(first, first + count):
        state.ingest(
            step(
                i,
                40.0 + 3.0 * math.sin(i / 5) + (60.0 if i == first + count // 2 else 0.0),
                loss=3.0 + 7.0 * math.exp(-i / 150),
                loss_scale=65536.0,
                mem_allocated=(18 << 30) + (i % 40) * (1 << 20),
                mem_reserved=22 << 30,
                t=2.0 + i * 0.05,
            )
        )


def drawn(screen: RunScreen) -> bool:
    plots = list(screen.query(RunPlot))
    return len(plots) == 4 and all(plot.strips for plot in plots)


def screen_of(app) -> tuple[str, dict[str, str], dict[str, str]]:
    screen = app.screen
    plots = {plot.id: plot.text for plot in screen.query(RunPlot)}
    cards = {card.id: card.text for card in screen.query(StatCard)}
    return terminal_output(app)[0], plots, cards


@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
def test_a_growing_run_repaints_what_changed_and_shows_what_a_fresh_view_shows(
    size, tmp_path: Path
) -> None:
    state = RunState(label="fp32")
    state.ingest(hello(config={"name": "fp32", "steps": 10_000}))
    add_steps(state, 0, 400)

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=size) as pilot:
            await shown(pilot, app, PresetsScreen)
            screen = app.open_run(FrozenSource(state))
            await shown(pilot, app, RunScreen)
            assert await wait_for(pilot, lambda: drawn(screen), 5)
            plots = list(screen.query(RunPlot))
            painted: list[tuple] = []
            for plot in plots:
                whole = plot.refresh

                def spy(*regions, _whole=whole, **kwargs):
                    painted.append(regions)
                    return _whole(*regions, **kwargs)

                plot.refresh = spy  # type: ignore[method-assign]
            first = 400
            for _ in range(4):
                add_steps(state, first, 3)  # a few steps: the axes stay, new points appear
                first += 3
                screen.refresh_view()
                await pilot.pause()
            partial = [regions for regions in painted if regions]
            assert partial, "every repaint was of whole plots"
            widest = max(region.width * region.height for regions in partial for region in regions)
            assert widest < min(p.size.width * p.size.height for p in plots) / 4
            followed = screen_of(app)

            app.pop_screen()
            fresh = RunScreen(FrozenSource(state))
            app.push_screen(fresh)
            await shown(pilot, app, RunScreen)
            assert await wait_for(pilot, lambda: drawn(fresh), 5)
            await pilot.pause()
            assert screen_of(app) == followed

    run(go())


def test_another_theme_redraws_the_cards_and_plots_in_its_colours(tmp_path: Path) -> None:
    state = RunState(label="fp32")
    state.ingest(hello(config={"name": "fp32", "steps": 10_000}))
    add_steps(state, 0, 50)

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await shown(pilot, app, PresetsScreen)
            screen = app.open_run(FrozenSource(state))
            assert await wait_for(pilot, lambda: drawn(screen), 5)
            before = terminal_output(app)[1]
            app.theme = "textual-light"
            await pilot.pause(0.2)
            screen.refresh_view()
            await pilot.pause()
            switched = terminal_output(app)[1]
            assert switched != before
            app.pop_screen()
            fresh = RunScreen(FrozenSource(state))
            app.push_screen(fresh)
            assert await wait_for(pilot, lambda: drawn(fresh), 5)
            await pilot.pause()
            assert terminal_output(app)[1] == switched  # colours and all

    run(go())
