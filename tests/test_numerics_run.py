"""Numerics in a run: training unchanged, events out, and 'ampscope numerics' naming the layers."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from ampscope.core import events as ev
from ampscope.engine.lifecycle.run import EXIT_OK, run
from tests.helpers import cli

MODEL = Path(__file__).parent / "data" / "planted_numerics.py"
CPU = ["device='cpu'", "warmup_steps=0"]


def run_model(factory: str, *overrides: str) -> list[ev.Event]:
    seen: list[ev.Event] = []
    spec = f"workload.model='{MODEL}:{factory}'"
    assert run("fp32", [*CPU, spec, *overrides], record=False, on_event=seen.append) == EXIT_OK
    return seen


@pytest.mark.unit
def test_hooks_never_change_training_losses_bit_identical():
    on = run_model("make_overflow", "steps=5", "numerics.every=1")
    off = run_model("make_overflow", "steps=5", "numerics.every=0")
    loss = lambda seen: [e.loss for e in seen if isinstance(e, ev.StepEvent)]  # noqa: E731
    assert loss(on) == loss(off) and len(loss(on)) == 5
    assert [e.step for e in on if isinstance(e, ev.NumericsEvent)] == [0, 1, 2, 3, 4]
    assert not [e for e in off if isinstance(e, ev.NumericsEvent)]


@pytest.mark.unit
def test_every_n_steps_samples_those_steps_only_and_the_event_round_trips():
    seen = run_model("make_underflow", "steps=5", "numerics.every=2")
    events = [e for e in seen if isinstance(e, ev.NumericsEvent)]
    assert [e.step for e in events] == [0, 2, 4]
    again = ev.decode(ev.encode(events[0]))
    assert again == events[0]
    tiny = next(m for m in again.modules if m.name == "head.tiny")
    assert tiny.kind == "Scale" and tiny.activation.formats["fp16"].underflow == 1.0


def numerics_cli(
    capsys: pytest.CaptureFixture[str], *args: str, record: bool = False
) -> subprocess.CompletedProcess[str]:
    """``ampscope numerics ARGS``: the command trains in the process it runs in, so it runs in
    this one (a process of its own would cost seconds of torch's import and check no more)."""
    return cli(capsys, "numerics", *args, "--device", "cpu", *([] if record else ["--no-record"]))


@pytest.mark.unit
def test_cli_json_names_the_planted_overflow_and_the_first_inf(capsys):
    done = numerics_cli(
        capsys, "amp-fp16", "--model", f"{MODEL}:make_overflow", "--steps", "2", "--json"
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    names = [m["name"] for m in out["modules"]]
    assert names == ["trunk.embed", "trunk.boost", "trunk.act", "pair", "head.tiny", "head.out"]
    boost = out["modules"][1]
    assert set(boost["activation"]["formats"]) == {"fp16", "bf16", "e4m3", "e5m2"}
    assert set(boost["gradient"]["formats"]["fp16"]) == {"overflow", "underflow"}
    assert out["first_nonfinite"] == {
        "step": 0,
        "module": "trunk.boost",
        "pass": "forward",
        "source": "output",
        "words": "trunk.boost's outputs",
    }
    assert out["preset"] == "amp-fp16" and out["loss_scale"] == 65536.0 / 2


@pytest.mark.unit
def test_an_inf_computed_in_fp16_is_named_as_an_fp16_overflow_never_every_layer_fits(capsys):
    """Under amp-fp16 trunk.boost's output is inf in fp16 itself (finite values reach 6.5e4 at
    most): the fp16 verdict names it, the JSON's share counts the infs, and bf16 is not said
    to fit it (its true size was lost in fp16)."""
    args = ("amp-fp16", "--model", f"{MODEL}:make_overflow", "--steps", "2")
    done = numerics_cli(capsys, *args)
    assert done.returncode == 0, done.stderr
    assert "every layer fits" not in done.stdout.split("first inf/NaN")[1]
    verdicts = {line.split(":")[0]: line for line in done.stdout.splitlines()[-4:]}
    assert "of trunk.boost's outputs overflow fp16: inf/NaN, computed in fp16" in verdicts["fp16"]
    assert ". bf16 holds" not in verdicts["fp16"] and "ampscope numerics fp32" in verdicts["fp16"]
    assert "trunk.boost's outputs are inf/NaN, computed in fp16" in verdicts["bf16"]
    out = json.loads(numerics_cli(capsys, *args, "--json").stdout)
    boost = out["modules"][1]["activation"]
    assert boost["dtype"] == "float16" and boost["nonfinite"] > 0
    assert boost["formats"]["fp16"]["overflow"] > 0.3 and boost["formats"]["bf16"]["overflow"] == 0
    assert out["verdicts"][1:] == list(verdicts.values())


@pytest.mark.unit
def test_cli_table_and_verdicts_name_the_planted_layers(capsys):
    done = numerics_cli(capsys, "fp32", "--model", f"{MODEL}:make_overflow", "--steps", "2")
    assert done.returncode == 0, done.stderr
    assert (
        "fp16: trunk.boost's outputs reach 8.0e5, beyond fp16's 65504; amp-fp16 will skip "
        "every step. bf16 holds it." in done.stdout
    )
    under = numerics_cli(capsys, "fp32", "--model", f"{MODEL}:make_underflow", "--steps", "1")
    assert "fp16: 100% of head.tiny's outputs round to zero" in under.stdout
    bad = numerics_cli(capsys, "fp32", "--set", "numerics.every=-1")
    assert bad.returncode == 2 and "numerics.every" in bad.stderr and "Traceback" not in bad.stderr
    off = numerics_cli(capsys, "fp32", "--set", "numerics.every=0")  # printed nothing at all
    assert off.returncode == 2 and off.stdout == ""
    assert "numerics.every=0 turns the measuring off" in off.stderr and "1 or more" in off.stderr


@pytest.mark.unit
def test_a_module_that_first_runs_at_a_later_step_is_listed_where_it_stands_in_the_model(capsys):
    """An expert given no token before step 2 was listed after the head; the rows go in
    named_modules() order, whatever step each first ran at."""
    args = ("fp32", "--model", f"{MODEL}:make_late_expert", "--steps", "4")
    done = numerics_cli(capsys, *args)
    assert done.returncode == 0, done.stderr
    rows = [line.split()[:1] for line in done.stdout.splitlines() if line.strip()]
    order = ["embed", "experts.0", "experts.1", "head"]
    shown = [name for name, *_ in rows if name in order or name.rsplit(".", 1)[0] in order]
    assert shown == [
        *("embed", "embed", "embed.weight", "embed.bias"),
        *("experts.0", "experts.0", "experts.0.weight", "experts.0.bias"),
        *("experts.1", "experts.1", "experts.1.weight", "experts.1.bias"),
        *("head", "head", "head.weight", "head.bias"),
    ]
    out = json.loads(numerics_cli(capsys, *args, "--json").stdout)
    assert [m["name"] for m in out["modules"]] == order


@pytest.mark.unit
def test_a_numerics_run_that_would_take_long_says_so_once_and_how_to_train_fewer_steps(capsys):
    """A U-Net on a CPU trained the preset's 200 steps, 20 minutes, without a word."""
    from ampscope.cli.main import command_args
    from ampscope.cli.numerics import cmd_numerics
    from tests.helpers import hello, step

    def slow_run(preset, overrides, runs_dir=None, record=True, on_event=None):
        on_event(hello(config={"precision": "fp32", "compile": "off", "steps": 200}))
        for i in range(6):  # 6 s a step
            on_event(step(i, 6000.0))
        return EXIT_OK

    argv = ["numerics", "fp32", "--device", "cpu", "--no-record"]
    assert cmd_numerics(command_args(argv), slow_run) == EXIT_OK
    hints = [line for line in capsys.readouterr().err.splitlines() if "--steps" in line]
    assert hints == [
        "ampscope: 197 more steps at about 6.00 s a step (every step measured): about 20 min "
        "to go. --steps 10 trains fewer (about 60 s in all)."
    ]
    assert cmd_numerics(command_args([*argv, "--steps", "200"]), slow_run) == EXIT_OK
    assert "--steps" not in capsys.readouterr().err  # the user chose the steps


@pytest.mark.unit
def test_cli_works_on_a_built_in_workload_without_a_model(capsys):
    """No --model: the built-in MLP's layers, named as named_modules() names them."""
    done = numerics_cli(capsys, "mlp-demo", "--steps", "2", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["preset"] == "mlp-demo" and out["steps_sampled"] == 2
    names = [m["name"] for m in out["modules"]]
    assert names == [str(i) for i in range(len(names))] and len(names) >= 3
    linear = next(m for m in out["modules"] if m["kind"] == "Linear")
    assert linear["activation"]["amax"] > 0 and linear["gradient"]["amax"] > 0
    assert [v.split(":")[0] for v in out["verdicts"]] == ["fp16", "bf16", "e4m3", "e5m2"]


@pytest.mark.unit
def test_watch_numerics_every_records_the_planted_layer(tmp_path):
    import importlib.util

    import torch

    import ampscope
    from tests.helpers import events_of

    spec = importlib.util.spec_from_file_location("planted_numerics", MODEL)
    planted = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(planted)
    model = planted.Planted(1e5, 1.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 16) * 4, torch.randint(0, 4, (32,))
    with ampscope.watch(model, opt, runs_dir=tmp_path, numerics_every=2) as mon:
        for _ in range(5):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.step(loss)
    events = events_of(mon.run_dir, ev.NumericsEvent)
    assert [e.step for e in events] == [0, 2, 4]
    boost = next(m for m in events[0].modules if m.name == "trunk.boost")
    assert boost.activation.formats["fp16"].overflow > 0.3 and boost.gradient is not None
    with pytest.raises(ValueError, match="numerics_every"):
        ampscope.watch(model, opt, runs_dir=tmp_path, numerics_every=-1)


FOREIGN = Path(__file__).parent / "data" / "planted_foreign.py"


@pytest.mark.ui
@pytest.mark.parametrize(
    ("factory", "planted"),
    [("make_gpt2", "transformer.h.1.mlp.c_fc"), ("make_encoder", "encoder.layers.1.linear1")],
)
def test_cli_and_view_name_the_planted_layer_of_models_nobody_here_wrote(
    factory, planted, tmp_path, capsys
):
    """A Hugging Face GPT-2 and torch's own TransformerEncoder: the overflowing layer is
    named by its named_modules() name in the JSON, in the fp16 verdict, and in the Numerics
    view of the run's record (torch's own encoder needs nothing beyond torch)."""
    if factory == "make_gpt2":
        pytest.importorskip("transformers")
    model = f"{FOREIGN}:{factory}"
    done = numerics_cli(
        capsys, "fp32", "--model", model, "--steps", "3", "--json", "--runs-dir", str(tmp_path),
        record=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    over = [
        m["name"]
        for m in out["modules"]
        if m["activation"] and m["activation"]["formats"]["fp16"]["overflow"] > 0
    ]
    assert over[0] == planted and out["steps_sampled"] == 3
    fp16 = next(v for v in out["verdicts"] if v.startswith("fp16:"))
    assert fp16.startswith(f"fp16: {planted}'s outputs reach ") and "beyond fp16's 65504" in fp16
    (record,) = [p for p in tmp_path.iterdir() if (p / "events.jsonl").exists()]
    assert view_verdict(record).startswith(f"fp16: {planted}'s outputs reach ")


def view_verdict(record: Path) -> str:
    """The Numerics view's verdict line for fp16, of the run's record opened in the dashboard."""
    verdict, _ = view_text(record)
    return next(line for line in verdict.splitlines() if line.startswith("fp16:"))


def view_text(record: Path, size: tuple[int, int] = (120, 40)) -> tuple[str, str]:
    """The Numerics view's verdict and grid, of the run's record opened in the dashboard."""
    from ampscope.tui.app import AmpscopeApp
    from ampscope.tui.model.replay import RecordSource
    from ampscope.tui.screens.numerics import NumericsScreen
    from ampscope.tui.screens.presets import PresetsScreen
    from tests.helpers import run, shown

    said: list[str] = []

    async def go() -> None:
        app = AmpscopeApp(runs_dir=record.parent)
        async with app.run_test(size=size) as pilot:
            await shown(pilot, app, PresetsScreen)
            app.open_run(RecordSource.load(record))
            await pilot.pause()
            await pilot.press("n")
            screen = await shown(pilot, app, NumericsScreen)
            await pilot.pause()
            for part in ("#numerics-verdict", "#numerics-grid"):
                said.append("".join(screen.query_one(part).render().plain))

    run(go())
    return said[0], said[1]


@pytest.mark.ui
def test_a_bias_gradient_beyond_fp16_is_named_alike_in_verdict_table_json_and_view(
    tmp_path, capsys
):
    """Under amp-fp16 only out.bias's gradient (a sum over every pixel) overflows fp16: every
    output and output gradient fits. The verdict, the table, the JSON and the view all name
    that gradient, never "every layer fits" and never "out's gradients"."""
    args = ("amp-fp16", "--model", f"{MODEL}:make_bias_overflow", "--steps", "3")
    done = numerics_cli(capsys, *args, "--runs-dir", str(tmp_path), record=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    fp16 = next(line for line in lines if line.startswith("fp16:"))
    assert "every layer fits" not in fp16 and "out's gradients" not in done.stdout
    assert "of out.bias's gradient overflow fp16: inf/NaN, computed in fp16" in fp16
    assert "inf/NaN first appears in out.bias's gradient at step 0" in done.stdout
    row = next(line for line in lines if line.startswith("out.bias "))
    assert row.split()[1] == "grad" and "33%/" in row.split()[3]  # 1 step of 3, every value
    out = json.loads(numerics_cli(capsys, *args, "--json").stdout)
    conv_out = next(m for m in out["modules"] if m["name"] == "out")
    assert conv_out["parameters"]["bias"]["formats"]["fp16"]["overflow"] == pytest.approx(1 / 3)
    assert conv_out["parameters"]["bias"]["dtype"] == "float16"
    assert conv_out["gradient"]["formats"]["fp16"]["overflow"] == 0
    assert out["first_nonfinite"]["words"] == "out.bias's gradient"
    assert out["verdicts"] == lines[-5:]
    (record,) = [p for p in tmp_path.iterdir() if (p / "events.jsonl").exists()]
    verdict, grid = view_text(record)
    assert fp16 in verdict and "First inf/NaN: out.bias's gradient, step 0." in verdict
    bias = next(line for line in grid.splitlines() if line.startswith("out.bias "))
    assert bias.split()[1:] == ["grad", "XX····"]  # the inf, then two steps that fit


@pytest.mark.unit
@pytest.mark.parametrize(
    ("factory", "place"),
    [
        ("make_own_inf", "the model's own forward (its code outside any layer, before block.norm)"),
        ("make_block_inf", "block's own forward (its code outside any layer, before block.head)"),
        ("make_batch_inf", "the model's inputs (the batch itself, before embed)"),
    ],
)
def test_an_inf_computed_outside_any_layer_names_the_module_whose_code_computed_it(
    factory, place, capsys
):
    """exp(h * 100) in the model's own forward (or a block's) makes the inf before any layer
    sees it: the first layer to receive it is not where it was born. The block also takes a
    causal mask of -inf, which is no sign of a spoilt input. An inf in the batch is no layer's
    either."""
    done = numerics_cli(capsys, "fp32", "--model", f"{MODEL}:{factory}", "--steps", "1")
    assert done.returncode == 1
    assert f"first inf/NaN: step 0, {place}" in done.stdout
    assert "Loss became nan at step 0" in done.stderr and f"first appears in {place}" in done.stderr
    verdict = next(line for line in done.stdout.splitlines() if line.startswith("inf/NaN"))
    if factory == "make_batch_inf":
        assert verdict.endswith(
            "no layer made them; the data or the code that builds the batch did."
        )
    else:
        assert verdict.endswith(
            "at step 0: computed in fp32, so beyond fp32's range or no number at all (0/0, "
            "inf - inf, the log of a negative); no narrower format holds it either."
        )
    # each format's verdict leads with what its finite values do: the inf/NaN are the first
    # one's spread, where fp16's once began "100% of embed.weight's gradient overflow fp16"
    fp16 = next(line for line in done.stdout.splitlines() if line.startswith("fp16: "))
    assert fp16.startswith(
        "fp16: the inf/NaN after the first one above are its spread, beyond every format; "
        "the finite values fit (largest magnitude "
    )
    assert "overflow fp16" not in fp16


@pytest.mark.slow
def test_watch_samples_the_step_after_a_skip_and_names_where_the_inf_is(tmp_path):
    """A watched loop owns its batches, so a skipped step cannot be run again: the next step
    armed once the skip has landed is sampled instead, and names the first inf."""
    import importlib.util
    import time

    import torch

    import ampscope
    from tests.helpers import events_of

    spec = importlib.util.spec_from_file_location("planted_numerics", MODEL)
    planted = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(planted)
    model = planted.Planted(1.0, 1.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
    with ampscope.watch(model, opt, scaler=scaler, runs_dir=tmp_path, numerics_every=1000) as mon:
        for step in range(7):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss * (math.inf if step >= 3 else 1.0)).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            mon.step(loss)
            time.sleep(0.5)  # the skip lands (a reporting thread, ten times a second)
    events = events_of(mon.run_dir, ev.NumericsEvent)
    sampled = events[1].step
    assert events[0].step == 0 and sampled in (5, 6)  # step 3's skip is known after step 4
    assert events[1].first_nonfinite == ev.FirstNonfinite(
        step=sampled, module="head.out", pass_="backward", dtype="float32"
    )


@pytest.mark.unit
def test_step_0_says_the_loss_scale_its_gradients_carry():
    """A GradScaler makes its scale tensor at its first scale(): step 0 runs with the initial
    scale, and its event says so (not null, as for a run without a scaler)."""
    seen: list[ev.Event] = []
    spec = f"workload.model='{MODEL}:make_underflow'"
    overrides = [*CPU, spec, "steps=2", "numerics.every=1", "scaler.init_scale=1024.0"]
    assert run("amp-fp16", overrides, record=False, on_event=seen.append) == EXIT_OK
    events = [e for e in seen if isinstance(e, ev.NumericsEvent)]
    assert [(e.step, e.loss_scale) for e in events] == [(0, 1024.0), (1, 1024.0)]


@pytest.mark.unit
def test_a_compiled_run_says_once_that_it_does_not_measure_numerics():
    """Hooks would recompile a compiled model, so numerics stay off: a note says so, once."""
    from ampscope.core import presets
    from ampscope.engine.emitter import EventWriter
    from ampscope.engine.numerics import loop_numerics

    seen: list[ev.Event] = []
    preset = presets.load_preset("fp32", ["compile='default'", "numerics.every=10"])
    setup = type("S", (), {"preset": preset})()
    writer = EventWriter(None, on_event=seen.append)
    assert loop_numerics(setup, writer, None, None, lambda: None) is None  # type: ignore[arg-type]
    writer.flush()
    notes = [e for e in seen if isinstance(e, ev.WarningEvent)]
    assert [e.code for e in notes] == ["numerics-off"]
    assert "compiles its model" in notes[0].message and "ampscope numerics" in notes[0].message


REAL_MODELS = Path(__file__).parent / "data" / "real_models.py"


@pytest.mark.slow
def test_numerics_names_the_leaf_modules_that_never_ran_and_why(capsys):
    """nn.MultiheadAttention never calls its out_proj: "18 of 21 leaf modules measured" once
    left the three unnamed (and the dashboard suggested a cap). The reference: forward hooks
    on every leaf of the same model over one forward."""
    import torch

    from tests.data import real_models

    model, called = real_models.ViT(), set()
    leaves = {n: m for n, m in model.named_modules() if n and not any(m.children())}
    for name, module in leaves.items():
        module.register_forward_hook(lambda *_a, name=name: called.add(name))
    model(torch.randn(2, 3, 16, 16))
    idle = sorted(set(leaves) - called)
    assert idle == [f"blocks.{i}.attn.out_proj" for i in range(3)]

    done = numerics_cli(capsys, "fp32", "--model", f"{REAL_MODELS}:vit", "--steps", "2", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["modules_measured"], out["modules_total"]) == (len(called), len(leaves))
    assert sorted(out["modules_never_ran"]) == idle
    assert "F.multi_head_attention_forward" in out["modules_never_ran"][idle[0]]
    table = numerics_cli(capsys, "fp32", "--model", f"{REAL_MODELS}:vit", "--steps", "1")
    assert (
        "18 of 21 leaf modules measured; 3 never ran: blocks.0.attn.out_proj, "
        "blocks.1.attn.out_proj and 1 more (nn.MultiheadAttention's out_proj" in table.stdout
    )


PRINTING = """
import os
import torch
from torch import nn
import ampscope


class Loud(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        print("forward says hello")
        os.write(1, b"raw bytes on fd 1\\n")
        return self.fc(x)


def make(ctx):
    print("factory says hello")
    x, y = torch.randn(32, 8), torch.randint(0, 2, (32,))
    batches = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 32, 8)]
    return ampscope.Workload(model=Loud(), batches=batches, loss=nn.functional.cross_entropy)
"""


@pytest.mark.unit
@pytest.mark.parametrize("command", ["numerics", "profile"])
def test_json_on_stdout_is_the_json_alone_whatever_the_users_code_prints(
    tmp_path, capfd, command
) -> None:
    """The user's print() came first on stdout, and `| jq` failed."""
    import json

    from ampscope.cli.main import main

    (tmp_path / "loud.py").write_text(PRINTING)
    steps = ["--steps", "2"] if command == "numerics" else ["--steps", "1"]
    code = main(
        [command, "fp32", "--model", f"{tmp_path / 'loud.py'}:make", *steps, "--json",
         "--device", "cpu", "--runs-dir", str(tmp_path / "runs")]
    )  # fmt: skip
    out, err = capfd.readouterr()
    assert code == 0, err
    json.loads(out)  # one JSON document, nothing else
    assert "factory says hello" in err and "forward says hello" in err
    assert "raw bytes on fd 1" in err  # os.write(1, ...) too


BARE_MODEL = """
import torch


def make(ctx):
    batches = [(torch.randn(8, 4), torch.randint(0, 2, (8,)))]
    return {"model": torch.nn.Linear(4, 2), "batches": batches,
            "loss": torch.nn.functional.cross_entropy}
"""


@pytest.mark.unit
def test_a_model_with_no_submodules_is_said_to_have_no_layer_to_measure(
    capsys, tmp_path: Path
) -> None:
    """A bare nn.Linear has no leaf module below it: 'ampscope numerics' trained it and printed
    nothing at all, no table and no word of why, exit 0."""
    path = tmp_path / "bare.py"
    path.write_text(BARE_MODEL)
    done = numerics_cli(capsys, "fp32", "--model", f"{path}:make", "--steps", "2")
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stderr.split())
    assert "per-layer numerics measure no step: the model is one Linear with no submodules" in said
    assert "torch.nn.Sequential(model)" in said
    # --json still prints its one object (it printed nothing, exit 0: a script read no JSON)
    done = numerics_cli(capsys, "fp32", "--model", f"{path}:make", "--steps", "2", "--json")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["steps_sampled"] == 0 and shown["modules"] == []
    assert shown["verdicts"][0] == "fp16: nothing measured."
