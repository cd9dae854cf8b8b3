"""The Numerics view, from fixed events: heatmap, format and measure switches, the first inf."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ampscope.core import events as ev
from ampscope.core.numerics import FirstNonfinite, FormatShare, ModuleNumerics, TensorNumerics
from ampscope.core.numerics.grid import build_grid
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.screens.numerics import NumericsScreen
from ampscope.tui.screens.presets import PresetsScreen
from ampscope.tui.screens.run import RunScreen
from ampscope.tui.widgets.key_bar import KeyBar
from tests.helpers import assert_snapshot, run, shown, terminal_output, text
from tests.snapshot_runs import FrozenSource, gpu_run


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


async def open_run_view(pilot, app, state) -> RunScreen:
    await shown(pilot, app, PresetsScreen)
    app.open_run(FrozenSource(state))
    screen = await shown(pilot, app, RunScreen)
    for _ in range(3):
        await pilot.pause()
    return screen


SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((120, 40), id="120x40")]


def tensor(amax: float, over16: float = 0.0, under16: float = 0.0) -> TensorNumerics:
    shares = {
        "fp16": FormatShare(overflow=over16, underflow=under16),
        "bf16": FormatShare(overflow=0.0, underflow=0.0),
        "e4m3": FormatShare(
            overflow=0.3 if amax > 448 else 0.0, underflow=0.2, scaled_underflow=0.01
        ),
        "e5m2": FormatShare(overflow=over16, underflow=0.05, scaled_underflow=0.0),
    }
    return TensorNumerics(numel=4096, amax=amax, min_nonzero=1e-9, nonfinite=0, formats=shares)


def events() -> list[ev.NumericsEvent]:
    """A 12-block model sampled every 50 steps; trunk.boost overflows fp16 from step 300 on,
    and its output is the first inf at step 400."""
    out = []
    for i, step in enumerate(range(0, 1000, 50)):
        modules = [ModuleNumerics(name="embed", kind="Embedding", activation=tensor(3.0))]
        for block in range(12):
            for part, amax in (("attn.proj", 40.0 + block), ("mlp.fc", 9.0)):
                modules.append(
                    ModuleNumerics(
                        name=f"blocks.{block}.{part}",
                        kind="Linear",
                        activation=tensor(amax),
                        gradient=tensor(1e-4, under16=0.02 * (i % 5)),
                    )
                )
        big = step >= 300
        modules.append(
            ModuleNumerics(
                name="trunk.boost",
                kind="Scale",
                activation=tensor(7.8e4 if big else 2e4, over16=0.4 if big else 0.0),
                gradient=tensor(0.01),
            )
        )
        first = FirstNonfinite(step=400, module="trunk.boost", pass_="forward")
        out.append(
            ev.NumericsEvent(
                step=step,
                loss_scale=65536.0,
                modules=modules,
                modules_total=26,
                first_nonfinite=first if step == 400 else None,
            )
        )
    return out


def numerics_state():
    state = gpu_run()
    for e in events():
        state.ingest(e)
    return state


@pytest.mark.unit
def test_repeated_blocks_share_a_row_and_the_first_inf_is_marked():
    steps, rows = build_grid(events(), "fp16", "overflow")
    labels = [(r.label, r.pass_label) for r in rows]
    assert ("blocks.0-11.attn.proj", "out") in labels and len(rows) == 7
    boost = next(r for r in rows if r.label == "trunk.boost" and r.pass_label == "out")
    assert steps[boost.first_nonfinite] == 400
    assert boost.cells[steps.index(250)] == 0.0 and boost.cells[steps.index(300)] == 0.4
    _, headroom = build_grid(events(), "fp16", "headroom")
    boost = next(r for r in headroom if r.label == "trunk.boost" and r.pass_label == "out")
    assert boost.cells[-1] < 0  # beyond fp16's 65504


@pytest.mark.unit
def test_a_layer_that_first_runs_at_a_later_step_has_its_row_where_it_stands_in_the_model():
    """An expert given no token at step 0 had its heatmap row after the head."""

    def module(name: str, order: int) -> ModuleNumerics:
        return ModuleNumerics(name=name, kind="Linear", order=order, activation=tensor(2.0))

    embed, late, head = module("embed", 0), module("experts.1", 2), module("head", 3)
    sampled = [
        ev.NumericsEvent(step=0, loss_scale=None, modules=[embed, head], modules_total=3),
        ev.NumericsEvent(step=1, loss_scale=None, modules=[embed, late, head], modules_total=3),
    ]
    _, rows = build_grid(sampled, "fp16", "overflow")
    assert [r.label for r in rows] == ["embed", "experts.1", "head"]


@pytest.mark.ui
@pytest.mark.parametrize("size", SIZES)
def test_numerics_view(size):
    async def go() -> None:
        app = AmpscopeApp(runs_dir=Path("runs"))
        async with app.run_test(size=size) as pilot:
            run_screen = await open_run_view(pilot, app, numerics_state())
            assert "n Numerics" in run_screen.query_one(KeyBar).plain
            await pilot.press("n")
            await shown(pilot, app, NumericsScreen)
            await pilot.pause()
            text = assert_snapshot(app, f"numerics-{size[0]}x{size[1]}")
            assert "trunk.boost's outputs reach 7.8e4, beyond fp16's 65504" in text
            assert "blocks.0-11.attn.proj" in text and "XX" in text
            assert "f Format" in app.screen.query_one(KeyBar).plain
            await pilot.press("f")
            await pilot.press("m")
            await pilot.pause()
            text = assert_snapshot(app, f"numerics-bf16-underflow-{size[0]}x{size[1]}")
            assert "bf16" in text and "underflow share" in text
            await pilot.press("escape")
            await shown(pilot, app, RunScreen)

    run(go())


@pytest.mark.ui
def test_the_header_names_a_layer_whose_fp16_output_is_inf_as_an_fp16_overflow():
    """What amp-fp16 records for a layer that multiplies by 1e5: inf in fp16 itself, finite
    values up to 6.5e4. The header says the overflow, as the CLI does, not "every layer fits"."""
    shares = {k: FormatShare(overflow=0.0, underflow=0.0) for k in ("bf16", "e4m3", "e5m2")}
    shares["fp16"] = FormatShare(overflow=0.75, underflow=0.0)
    boost = TensorNumerics(
        numel=512, amax=65472.0, min_nonzero=1.0, nonfinite=384, formats=shares, dtype="float16"
    )
    first = FirstNonfinite(step=0, module="trunk.boost", pass_="forward")
    state = gpu_run()
    state.ingest(
        ev.NumericsEvent(
            step=0,
            loss_scale=65536.0,
            modules=[ModuleNumerics(name="trunk.boost", kind="Scale", activation=boost)],
            modules_total=1,
            first_nonfinite=first,
        )
    )

    async def go() -> None:
        app = AmpscopeApp(runs_dir=Path("runs"))
        async with app.run_test(size=(120, 40)) as pilot:
            await open_run_view(pilot, app, state)
            await pilot.press("n")
            await shown(pilot, app, NumericsScreen)
            await pilot.pause()
            said = "".join(app.screen.query_one("#numerics-verdict").render().plain)
            assert said.startswith("fp16: 75% of trunk.boost's outputs overflow fp16"), said
            assert "every layer fits" not in said
            await pilot.press("f")  # bf16: the true size was lost in fp16, so not "fits"
            await pilot.pause()
            said = "".join(app.screen.query_one("#numerics-verdict").render().plain)
            assert said.startswith("bf16: 75% of trunk.boost's outputs are inf/NaN"), said

    run(go())


@pytest.mark.ui
def test_a_run_without_numerics_says_why():
    async def go() -> None:
        app = AmpscopeApp(runs_dir=Path("runs"))
        async with app.run_test(size=(80, 24)) as pilot:
            await open_run_view(pilot, app, gpu_run())
            await pilot.press("n")
            await shown(pilot, app, NumericsScreen)
            await pilot.pause()
            text = "".join(app.screen.query_one("#numerics-verdict").render().plain)
            assert "numerics.every" in text and "ampscope numerics" in text

    run(go())


def many_layer_events() -> list[ev.NumericsEvent]:
    """A model of 10,000 leaf modules, 256 of them measured, none repeated in a way that
    groups (names without a block number): far more rows than a terminal has."""
    import itertools

    letters = "abcdefghijklmnop"
    names = [f"layer_{a}{b}" for a, b in itertools.product(letters, repeat=2)]
    modules = [
        ModuleNumerics(name=n, kind="Linear", activation=tensor(2.0), gradient=tensor(0.5))
        for n in names
    ]
    return [
        ev.NumericsEvent(step=s, loss_scale=None, modules=modules, modules_total=10_000)
        for s in (0, 250)
    ]


@pytest.mark.ui
def test_many_layers_scroll_and_the_header_says_how_many_were_measured():
    async def go() -> None:
        app = AmpscopeApp(runs_dir=Path("runs"))
        state = gpu_run()
        for e in many_layer_events():
            state.ingest(e)
        async with app.run_test(size=(80, 24)) as pilot:
            await open_run_view(pilot, app, state)
            await pilot.press("n")
            screen = await shown(pilot, app, NumericsScreen)
            await pilot.pause()
            header = text(screen, "#numerics-header")
            assert "256 layers of 10000 (at most 256 measured)" in header
            scroll = screen.query_one("#numerics-scroll")
            first, _ = terminal_output(app)
            assert "layer_aa" in first and "layer_pp" not in first
            assert scroll.max_scroll_y > 400  # 512 rows (out and grad) in about 15 lines
            await pilot.press("end")
            await pilot.pause()
            last, _ = terminal_output(app)
            assert scroll.scroll_y == scroll.max_scroll_y
            assert "layer_pp" in last and "layer_aa" not in last

    run(go())


@pytest.mark.ui
def test_the_header_names_layers_that_never_ran_and_suggests_no_cap_for_them():
    """nn.MultiheadAttention's out_proj never runs as a module: '18 layers of 21' once came
    with '(at most 256 measured)', a cap that had nothing to do with it."""
    modules = [
        ModuleNumerics(name=f"mlp.{i}", kind="Linear", activation=tensor(2.0), gradient=None)
        for i in range(18)
    ]
    idle = {f"blocks.{i}.attn.out_proj": "never called" for i in range(3)}

    async def go() -> None:
        app = AmpscopeApp(runs_dir=Path("runs"))
        state = gpu_run()
        state.ingest(
            ev.NumericsEvent(
                step=0, loss_scale=None, modules=modules, modules_total=21, modules_idle=idle
            )
        )
        async with app.run_test(size=(120, 40)) as pilot:
            await open_run_view(pilot, app, state)
            await pilot.press("n")
            screen = await shown(pilot, app, NumericsScreen)
            await pilot.pause()
            header = text(screen, "#numerics-header")
            assert "18 layers of 21 (3 never ran)" in header and "at most" not in header

    run(go())
