"""``--model`` on every front-end: bench, memory, run, the dashboard, and the shipped examples."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ampscope.cli.main import main
from ampscope.core import events as ev
from ampscope.core.memory.plan import MeasuredStep, plan_regime, workload_from_preset
from ampscope.engine.lifecycle.run import EXIT_OK, run
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.screens.presets import PresetsScreen
from ampscope.tui.screens.run import RunScreen
from ampscope.tui.widgets.stat_cards import StatCard
from tests.helpers import (
    ROOT,
    SIZE,
    engine_env,
    model_set,
    select_preset,
    shown,
    text,
    user_model,
    wait_for,
)
from tests.helpers import run as run_async

EXAMPLES = ROOT / "examples"


@pytest.mark.subprocess
def test_bench_on_a_users_model_gives_a_table_and_a_verdict(tmp_path: Path, capsys) -> None:
    """One run each (the verdict over repeats is tested on forged runs: test_bench,
    test_sweep_repeats): the table, and the sentence that says a speed-up is untested."""
    spec = f"{user_model(tmp_path)}:make"
    sets = ["--set", "device='cpu'", "--set", "warmup_steps=2"]
    code = main(["bench", "fp32", "amp-bf16", "--model", spec, "--steps", "6", "--repeats", "1",
                 *sets, "--runs-dir", str(tmp_path / "runs")])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    table = [line for line in out.splitlines() if line.startswith(("fp32 ", "amp-bf16 "))]
    assert len(table) == 2 and all(line.split()[-1] == "ok" for line in table)
    verdict = r"^amp-bf16: no speed verdict without 3 .*; an untested \S+x the speed of fp32"
    assert re.search(verdict, out, re.M), out
    runs = sorted((tmp_path / "runs").glob("*/events.jsonl"))
    hellos = [ev.decode(p.read_bytes().splitlines()[1]) for p in runs]
    assert [h.workload for h in hellos if isinstance(h, ev.HelloEvent)] == ["teacher-mlp"] * 2


@pytest.mark.subprocess
def test_bench_on_a_factory_that_raises_exits_2_after_the_first_run(tmp_path: Path, capsys) -> None:
    spec = f"{user_model(tmp_path)}:make_raises"
    code = main(["bench", "fp32", "amp-bf16", "--model", spec, "--set", "device='cpu'",
                 "--runs-dir", str(tmp_path / "runs")])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert f"fp32 (the baseline) did not run: workload.model = '{spec}'" in captured.err
    assert "ValueError: the data folder is empty" in captured.err
    assert "[2/2]" not in captured.err  # amp-bf16 was not tried


@pytest.mark.unit
def test_memory_gives_the_models_true_parameter_count(tmp_path: Path, capsys) -> None:
    path = user_model(tmp_path)
    code = main(["memory", "--model", f"{path}:make", "--json", "--regime", "amp-bf16"])
    assert code == 0
    plan = json.loads(capsys.readouterr().out)
    from torch import nn  # the test file's model, built here: Linear(16, 64), Linear(64, 4)

    truth = sum(p.numel() for p in (nn.Linear(16, 64), nn.Linear(64, 4)) for p in p.parameters())
    assert plan["params"] == truth == 1348
    measured = MeasuredStep(**plan["measured"])  # the activations of one step, measured
    assert plan["regimes"][0]["activations"] == measured.activations["amp-bf16"] > 0
    assert (
        plan["regimes"][0]["train_total"]
        == plan_regime(truth, "amp-bf16", measured=measured).train_total
    )
    assert main(["memory", "--model", f"{path}:make"]) == 0
    assert "model teacher-mlp from" in capsys.readouterr().out


@pytest.mark.unit
def test_memory_of_a_model_that_fails_its_step_says_so_instead_of_a_total(
    tmp_path: Path, capsys
) -> None:
    """A forward that raises on the first batch in every regime gave a table whose TRAIN
    totals left the activations out unsaid, read as fp32 taking 'its 16-bit twin's bytes'."""
    spec = f"{user_model(tmp_path)}:make_wrong_width"
    assert main(["memory", "--model", spec]) == 0
    out = capsys.readouterr().out
    assert "(the model could not run a step on the CPU: activations not measured)" in out
    assert "twin's bytes" not in out
    assert main(["memory", "--model", spec, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["measured"] is None


@pytest.mark.unit
def test_memory_refuses_a_factory_that_fails_showing_the_users_traceback(
    tmp_path: Path, capsys
) -> None:
    path = user_model(tmp_path)
    assert main(["memory", "--model", f"{path}:make_raises"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ampscope: workload.model = '{path}:make_raises': the factory raised")
    assert f'File "{path}"' in err and "ampscope/engine" not in err


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["gpt2-124m", "llama"])
def test_memory_preset_counts_the_new_workloads_as_built(kind: str, tmp_path: Path) -> None:
    from ampscope.core import presets

    (tmp_path / "p.toml").write_text(f'name = "p"\n[workload]\nkind = "{kind}"\n')
    wl = workload_from_preset(str(tmp_path / "p.toml"), on_cuda=True)
    preset = presets.load_preset(str(tmp_path / "p.toml"))
    dims, _ = presets.resolve_workload(preset, on_cuda=True)
    with torch.device("meta"):  # the model as the engine builds it, at no cost
        if kind == "llama":
            from ampscope.engine.workloads.llama import Llama

            args = ("vocab", "seq_len", "width", "layers", "heads", "kv_heads")
            model = Llama(*(dims[a] for a in args))
        else:
            from ampscope.engine.workloads.gpt2 import Gpt2

            model = Gpt2(*(dims[a] for a in ("vocab", "seq_len", "width", "layers", "heads")))
    assert wl.params == sum(p.numel() for p in model.parameters())


@pytest.mark.subprocess
def test_run_with_a_missing_model_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ampscope", "run", "fp32", "--model", "nowhere/net.py:make"],
        cwd=tmp_path,
        env=engine_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert out.stderr.startswith("ampscope: --model nowhere/net.py:make: ")  # as typed
    assert "does not exist" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.subprocess
def test_model_before_the_command_is_the_commands_model(tmp_path: Path, capsys) -> None:
    """As `--runs-dir`: `ampscope --model X run` trains X, not a built-in workload."""
    argv = ["--model", "nowhere/net.py:make", "run", "fp32", "--steps", "1", "--no-record"]
    out = subprocess.run(
        [sys.executable, "-m", "ampscope", *argv],
        cwd=tmp_path,
        env=engine_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stdout
    assert out.stderr.startswith("ampscope: --model nowhere/net.py:make: ")
    assert main(["--model", f"{user_model(tmp_path)}:make", "memory"]) == 0
    assert "model teacher-mlp from" in capsys.readouterr().out


@pytest.mark.unit
def test_batches_that_run_out_are_said_once_and_the_progress_stops_before_it(
    tmp_path: Path, capsys
) -> None:
    spec = f"{user_model(tmp_path)}:make_generator"  # a generator of 3 batches, 6 steps asked
    argv = ["run", "fp32", "--model", spec, "--steps", "6", "--runs-dir", str(tmp_path)]
    assert main([*argv, "--set", "device=cpu"]) == 2
    out, err = capsys.readouterr()
    said = "the batches ran out after 3 batches and cannot be read again"
    assert (out + err).count(said) == 1, out + err
    assert re.search(r"^  status +failed \(the error above\)$", out, re.M), out
    progress = re.findall(r"\] (\d)/6 ", err)
    assert progress and progress[-1] == "3"  # where it ended, shown before the error
    assert not re.search(r"\] \d/6 ", err.split(said)[1])  # and not drawn again after it


@pytest.mark.unit
def test_the_dashboard_refuses_a_bad_model_before_taking_the_screen(capsys) -> None:
    assert main(["--model", "missing.py:make"]) == 2
    assert "'missing.py:make'" in capsys.readouterr().err


@pytest.mark.subprocess
def test_the_dashboard_runs_a_users_model_headless(tmp_path: Path) -> None:
    sets = [model_set(user_model(tmp_path)), "device='cpu'", "steps=12", "warmup_steps=2"]

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path / "runs", extra_overrides=sets)
        async with app.run_test(size=SIZE) as pilot:
            await shown(pilot, app, PresetsScreen)
            select_preset(app, "amp-bf16")
            await pilot.press("enter")
            screen = await shown(pilot, app, RunScreen)
            assert await wait_for(pilot, lambda: app.run_manager.state.status == "done", 90)
            hello = app.run_manager.state.hello
            assert hello is not None and hello.workload == "teacher-mlp"
            assert await wait_for(pilot, lambda: "done" in text(screen, "#run-header"), 5)
            card = screen.query_one("#card-step_ms", StatCard)
            assert await wait_for(pilot, lambda: "data " in card.sub, 5), card.sub

    run_async(go())


def run_example(spec: str, preset: str = "fp32", steps: int = 4) -> list[ev.Event]:
    seen: list[ev.Event] = []
    sets = [f'workload.model="{spec}"', "device='cpu'", f"steps={steps}", "warmup_steps=1"]
    code = run(preset, sets, record=False, on_event=seen.append)
    errors = [e for e in seen if isinstance(e, ev.ErrorEvent)]
    assert code == EXIT_OK, errors
    return seen


@pytest.mark.slow
def test_the_plain_example_trains() -> None:
    seen = run_example(f"{EXAMPLES / 'custom_model.py'}:make", "amp-bf16", steps=12)
    hello = next(e for e in seen if isinstance(e, ev.HelloEvent))
    assert hello.workload == "residual-mlp" and hello.samples_per_step == 64
    losses = [e.loss for e in seen if isinstance(e, ev.StepEvent)]
    assert len(losses) == 12 and min(losses[-3:]) < losses[0]


@pytest.mark.slow
def test_the_hugging_face_gpt2_example_runs_at_a_tiny_size() -> None:
    pytest.importorskip("transformers")
    seen = run_example(f"{EXAMPLES / 'hf_gpt2.py'}:make", "amp-bf16", steps=3)
    hello = next(e for e in seen if isinstance(e, ev.HelloEvent))
    assert hello.workload == "hf-gpt2" and hello.tokens_per_step == 8 * 64
    # GPT-2's matmuls by hand: 12 h^2 a layer plus the tied head, 6 FLOPs a token each, plus
    # attention's 12 x layers x h x context a token
    h, layers, vocab, tokens, context = 64, 2, 1024, 8 * 64, 64
    by_hand = (6 * (12 * h * h * layers + vocab * h) + 12 * layers * h * context) * tokens
    assert hello.flops_per_step == pytest.approx(by_hand, rel=0.01)
    assert hello.flops_source == "counted"


@pytest.mark.unit
def test_the_torchvision_example_runs_a_few_steps() -> None:
    # torchvision from PyPI does not import beside torch 2.13's CPU build here
    # ("operator torchvision::nms does not exist"): this test skips where that is so.
    pytest.importorskip("torchvision")
    seen = run_example(f"{EXAMPLES / 'resnet50.py'}:make", "fp32", steps=2)
    hello = next(e for e in seen if isinstance(e, ev.HelloEvent))
    assert hello.workload == "resnet50" and 25e6 < hello.param_count < 26e6


@pytest.mark.unit
def test_the_torchvision_example_without_torchvision_names_the_release_to_install(
    capsys,
) -> None:
    try:
        import torchvision  # noqa: F401
    except (ImportError, RuntimeError):
        pass
    else:
        pytest.skip("torchvision is installed: the example runs instead")
    code = main(["run", "fp32", "--model", f"{EXAMPLES / 'resnet50.py'}:make", "--no-record"])
    err = capsys.readouterr().err
    minor = int(torch.__version__.split(".")[1])
    assert code == 2
    assert f"pip install 'torchvision==0.{minor + 15}.*'" in err and "resnet50.py" in err
