"""A user's model is named on every screen: Run header, History, Compare, records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ampscope.core import events as ev
from ampscope.core import records
from ampscope.core.presets.workload_spec import model_label
from ampscope.core.records.labels import run_model, run_preset
from ampscope.engine.lifecycle.run import EXIT_OK, run
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.model.run_state import RunState
from ampscope.tui.screens.compare import CompareScreen
from ampscope.tui.screens.history import HistoryScreen
from ampscope.tui.screens.presets import PresetsScreen
from ampscope.tui.screens.run import fit_header
from tests import helpers
from tests.helpers import model_set, shown, user_model, wait_for

SPEC = "/home/me/models/seqclf.py:make"
MODEL_CONFIG = {
    "name": "fp32",
    "precision": "fp32",
    "compile": "off",
    "steps": 100,
    "device": "cpu",
    "workload": {"kind": "seqclf", "model": SPEC},
}


@pytest.mark.unit
def test_the_model_is_named_by_its_factory_else_by_file_and_function() -> None:
    assert model_label(SPEC, "seqclf") == "seqclf"
    assert model_label("/x/seqclf.py:make_typo") == "seqclf.py:make_typo"
    assert model_label("my_pkg.models:make") == "my_pkg.models:make"
    assert model_label(None, "gpt") is None


@pytest.mark.unit
def test_the_run_header_names_the_model_on_its_first_line_at_80_columns() -> None:
    state = RunState()
    state.ingest(helpers.hello(config=MODEL_CONFIG, workload="seqclf", device_name="Intel Xeon"))
    first_line = fit_header(state.header(), 80).splitlines()[0]
    assert "model seqclf" in first_line
    assert state.header().count("fp32") == 1  # the preset named after its precision: once


@pytest.mark.unit
def test_a_run_that_failed_before_hello_is_named_from_its_spec() -> None:
    state = RunState(launch={**MODEL_CONFIG, "workload": {"model": "/x/seqclf.py:make_typo"}})
    assert "model seqclf.py:make_typo" in state.header()


@pytest.mark.unit
def test_epochs_are_a_plain_note_and_counted_in_the_header() -> None:
    state = RunState()
    state.ingest(helpers.hello(config=MODEL_CONFIG, workload="seqclf"))
    for step in (8, 16):
        state.ingest(ev.WarningEvent(code=ev.EPOCH_NOTE, message=f"epoch x from {step}", step=step))
    assert state.epoch == 3 and "(epoch 3)" in state.header()
    assert [e.level for e in state.log][-2:] == ["info", "info"]
    assert "[epoch]" not in state.log[-1].text


@pytest.mark.unit
def test_epoch_notes_are_said_once_then_counted_in_the_header() -> None:
    """A list of 8 batches drew a line in the event log every 8 steps."""
    state = RunState()
    state.ingest(helpers.hello(config=MODEL_CONFIG, workload="seqclf"))
    lines = len(state.log)
    for count, step in enumerate((8, 16, 24, 32), start=2):
        message = f"epoch {count} from step {step}" + (
            ": the batches ran out" if count == 2 else ""
        )
        state.ingest(ev.NoteEvent(code=ev.EPOCH_NOTE, message=message, step=step, count=count))
    assert state.epoch == 5 and "(epoch 5)" in state.header()
    added = list(state.log)[lines:]
    assert [e.text for e in added] == ["epoch 2 from step 8: the batches ran out"]
    assert added[0].level == "info"


@pytest.mark.unit
def test_a_model_run_records_the_model_as_its_workload(tmp_path: Path) -> None:
    sets = [model_set(user_model(tmp_path)), "device='cpu'", "steps=2"]
    assert run("fp32", sets, runs_dir=tmp_path / "runs") == EXIT_OK
    (run_dir,) = (tmp_path / "runs").iterdir()
    rec = records.load_run(run_dir)
    assert rec.hello is not None and rec.hello.workload == "teacher-mlp"
    assert rec.hello.config["workload"]["kind"] == "teacher-mlp"
    assert run_model(rec) == "teacher-mlp" and run_preset(rec) == "fp32"


@pytest.mark.unit
def test_a_failed_model_run_is_named_by_preset_and_model_not_its_folder(tmp_path: Path) -> None:
    sets = [model_set(user_model(tmp_path), "make_typo"), "device='cpu'", "steps=2"]
    run("fp32", sets, runs_dir=tmp_path / "runs")
    (run_dir,) = (tmp_path / "runs").iterdir()
    rec = records.load_run(run_dir)
    assert rec.hello is None and rec.name.endswith("fp32-user_model-make_typo")
    assert run_preset(rec) == "fp32" and run_model(rec) == "user_model.py:make_typo"


def model_record(root: Path, preset: str, model: str | None) -> Path:
    run_dir = helpers.write_finished_record(root, preset)
    if model is not None:
        events, _ = records.read_events(run_dir / records.EVENTS_FILE)
        hello = events[0]
        assert isinstance(hello, ev.HelloEvent)
        hello.config = {**hello.config, "workload": {"kind": model, "model": f"/m/{model}.py:make"}}
        hello.workload = model
        events[0] = hello
        (run_dir / records.EVENTS_FILE).write_bytes(b"".join(ev.encode(e) for e in events))
    else:
        (run_dir / records.CONFIG_FILE).write_text(json.dumps({"name": preset}))
    return run_dir


@pytest.mark.ui
def test_history_has_a_model_column_and_compare_names_the_models(tmp_path: Path) -> None:
    model_record(tmp_path, "fp32", "seqclf")
    model_record(tmp_path, "amp-bf16", "seqclf")
    model_record(tmp_path, "fp32", "convnet")

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await shown(pilot, app, PresetsScreen)
            await pilot.press("h")
            history = await shown(pilot, app, HistoryScreen)
            assert await wait_for(pilot, lambda: len(history.paths) == 3, 5)
            text = helpers.screen_capture(app, "history")[0]
            assert "model" in text and "seqclf" in text and "convnet" in text
            await pilot.press("space", "space", "space", "c")
            screen = await shown(pilot, app, CompareScreen)
            assert sorted(r.preset for r in screen.rows) == [
                "amp-bf16 seqclf",
                "fp32 convnet",
                "fp32 seqclf",
            ]

    helpers.run(go())


@pytest.mark.ui
def test_compare_of_one_model_names_it_in_the_title(tmp_path: Path) -> None:
    runs = [records.load_run(model_record(tmp_path, p, "seqclf")) for p in ("fp32", "bf16")]

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await shown(pilot, app, PresetsScreen)
            await app.push_screen(CompareScreen(runs))
            screen = await shown(pilot, app, CompareScreen)
            await pilot.pause()
            assert "model seqclf" in str(screen.query_one("#compare-title").render())
            assert "confidence interval" in CompareScreen.HELP and "?" in CompareScreen.HELP

    helpers.run(go())


RANKED_MODEL = """
import torch
from torch import nn


def make(ctx):
    y = torch.randint(0, 2, (8,))
    return {
        "model": nn.Linear(4, 2),
        "batches": [(torch.full((1, 4), float(i)), y[i : i + 1]) for i in range(8)],
        "loss": nn.functional.cross_entropy,
        "name": f"rank{ctx.rank}-of{ctx.world_size}-local{ctx.local_rank}",
        "sharded": ctx.world_size > 1,
    }
"""


@pytest.mark.unit
def test_the_factory_is_told_its_rank_and_a_sharded_loader_is_not_sharded_again(
    tmp_path: Path,
) -> None:
    import types

    import torch

    from ampscope.core import presets
    from ampscope.engine.device import DeviceInfo
    from ampscope.engine.step.setup import make_workload

    path = tmp_path / "ranked.py"
    path.write_text(RANKED_MODEL)
    preset = presets.load_preset("fp32", [model_set(path), "device='cpu'"])
    cpu = DeviceInfo(torch.device("cpu"), "cpu", None, None, None, None)
    link = types.SimpleNamespace(rank=1, world_size=2, local_rank=1)
    workload, _ = make_workload(preset, cpu, link)  # type: ignore[arg-type]
    assert workload.name == "rank1-of2-local1"
    workload.prepare()
    workload.pool.shard(1, 2)
    served = [float(workload.batch(step)[0][0, 0]) for step in range(3)]
    assert served == [0.0, 1.0, 2.0]  # sharded again, rank 1 would get 0, 3, 5
    assert workload.pool.world_size == 1  # the loader's batches are this rank's already
    solo, _ = make_workload(preset, cpu)
    assert solo.name == "rank0-of1-local0"


@pytest.mark.subprocess
def test_the_memory_plan_of_a_model_dashboard_plans_the_users_model(tmp_path: Path) -> None:
    from textual.widgets import Input

    from ampscope.tui.model.preset_draft import model_spec
    from ampscope.tui.screens.memory import MemoryScreen

    path = user_model(tmp_path)
    assert model_spec([model_set(path)]) == f"{path}:make"

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path, extra_overrides=[model_set(path)])
        async with app.run_test(size=(120, 40)) as pilot:
            await shown(pilot, app, PresetsScreen)
            await pilot.press("p")
            screen = await shown(pilot, app, MemoryScreen)
            assert await wait_for(pilot, lambda: screen.model_params is not None, 120)
            assert screen.model_params == 1348  # the test model, not the preset's GPT
            assert screen.query_one("#memory-params", Input).value == "1348"
            assert "1,348 parameters" in str(screen.query_one("#memory-title").render())
            # the activations of one step, as `ampscope memory --model` measures them
            assert screen.measured is not None
            by_regime = {r.regime: r for r in screen.plan}
            fp32 = by_regime["fp32"]
            assert fp32.activations == screen.measured.activations["fp32"] > 0
            assert "activations measured on the CPU" in str(
                screen.query_one("#memory-title").render()
            )

    helpers.run(go())


@pytest.mark.ui
@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
def test_the_presets_form_of_a_model_dashboard_shows_the_model_not_workload_gpt(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    path = user_model(tmp_path)

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path, extra_overrides=[model_set(path)])
        async with app.run_test(size=size) as pilot:
            await shown(pilot, app, PresetsScreen)
            await pilot.pause()
            text = helpers.screen_capture(app, "presets")[0]
            lines = text.splitlines()
            model = next(ln for ln in lines if "user_model.py:make" in ln)
            precision = next(ln for ln in lines if " precision " in ln)
            assert "workload" not in model
            # the model's label and value in the same columns as the fields under it
            assert model.index("model ") == precision.index("precision ")
            assert model.index("user_model.py") == precision.index("fp32")
            assert not app.screen.query_one("#field-workload-kind").parent.display

    helpers.run(go())
