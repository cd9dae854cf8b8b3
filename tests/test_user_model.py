"""A user's own model (``--model``): it trains like a built-in workload, and each mistake a
user makes with it ends in exit 2 with a message that names the spec."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ampscope.core import events as ev
from ampscope.engine.lifecycle.run import EXIT_FAILED, EXIT_OK, EXIT_USAGE, run
from ampscope.engine.workloads.user import count_model_parameters
from tests.helpers import USER_MODEL, cli, model_set, user_model

BATCH, FEATURES, HIDDEN, CLASSES = 32, 16, 64, 4


def run_model(
    path: Path, factory: str = "make", preset: str = "fp32", *overrides: str
) -> tuple[int, list[ev.Event]]:
    seen: list[ev.Event] = []
    sets = [model_set(path, factory), "device='cpu'", "steps=6", *overrides]
    code = run(preset, sets, record=False, on_event=seen.append)
    return code, seen


def of(events: list[ev.Event], kind: type) -> list:
    return [e for e in events if isinstance(e, kind)]


def net_flops(batch: int) -> int:
    """The test model by hand: a Linear's forward and weight gradient are 2*b*in*out each,
    and its input gradient another, except the first layer's (its input needs none)."""
    first, second = FEATURES * HIDDEN, HIDDEN * CLASSES
    return 2 * batch * (2 * first + 3 * second)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["fp32", "amp-bf16"])
def test_a_model_from_a_file_trains_and_its_loss_falls(tmp_path: Path, preset: str) -> None:
    code, events = run_model(user_model(tmp_path), "make", preset, "steps=60", "lr=1e-2")
    assert code == EXIT_OK, of(events, ev.ErrorEvent)
    hello = of(events, ev.HelloEvent)[0]
    assert hello.workload == "teacher-mlp" and hello.config["precision"] == preset
    assert hello.samples_per_step == BATCH and hello.param_count == 1348
    assert hello.flops_source == "counted" and "FlopCounterMode" in (hello.flops_note or "")
    assert hello.flops_per_step == pytest.approx(net_flops(BATCH), rel=0.01)
    losses = [s.loss for s in of(events, ev.StepEvent)]
    assert len(losses) == 60
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.7 * first, (first, last)
    assert all(s.data_ms is not None and s.data_ms >= 0 for s in of(events, ev.StepEvent))
    # a note, not a warning: said in words once, then counted (a list of 8 batches: every 8)
    epochs = [n for n in of(events, ev.NoteEvent) if n.code == ev.EPOCH_NOTE]
    assert [n.step for n in epochs] == [8, 16, 24, 32, 40, 48, 56]  # 256 examples, batches of 32
    assert [n.count for n in epochs] == [2, 3, 4, 5, 6, 7, 8]
    assert epochs[0].message.startswith("epoch 2 from step 8: the batches ran out after 8 steps")
    assert epochs[-1].message == "epoch 8 from step 56"
    assert not [
        w for w in of(events, ev.WarningEvent) if w.code in (ev.EPOCH_NOTE, "batches-restarted")
    ]


@pytest.mark.unit
def test_amp_fp16_with_an_injected_inf_skips_that_step(tmp_path: Path) -> None:
    code, events = run_model(
        user_model(tmp_path), "make", "amp-fp16", "steps=8", "debug.inf_loss_at_step=4"
    )
    assert code == EXIT_OK
    steps = of(events, ev.StepEvent)
    assert [s.step for s in steps if s.skipped] == [4]
    assert steps[4].loss_scale == steps[3].loss_scale / 2
    assert of(events, ev.DoneEvent)[0].skipped_steps == 1


@pytest.mark.slow
def test_inputs_as_a_tuple_a_dict_or_token_ids_and_a_loss_the_model_returns(
    tmp_path: Path,
) -> None:
    path = user_model(tmp_path)
    for factory in ("make_tuple_inputs", "make_own_loss"):
        code, events = run_model(path, factory)
        assert code == EXIT_OK, (factory, of(events, ev.ErrorEvent))
        hello = of(events, ev.HelloEvent)[0]
        assert hello.samples_per_step == BATCH and hello.tokens_per_step is None
    code, events = run_model(path, "make_tokens")
    hello = of(events, ev.HelloEvent)[0]
    assert code == EXIT_OK and hello.samples_per_step == 8 and hello.tokens_per_step == 8 * 12
    assert all(s.tokens_per_s for s in of(events, ev.StepEvent))


def per_step(events: list[ev.Event], rate: str) -> list[float]:
    """What each step did: its rate times its time (samples, tokens, FLOPs)."""
    return [getattr(s, rate) * s.step_ms / 1000.0 for s in of(events, ev.StepEvent)]


@pytest.mark.unit
def test_samples_and_flops_follow_each_batch_not_the_first(tmp_path: Path) -> None:
    code, events = run_model(user_model(tmp_path), "make_short_batches", "fp32", "warmup_steps=0")
    assert code == EXIT_OK, of(events, ev.ErrorEvent)
    samples = [round(n) for n in per_step(events, "samples_per_s")]
    assert samples == [32, 8, 8, 32, 8, 8]
    flops = [f * 1e12 for f in per_step(events, "tflops")]
    assert flops == pytest.approx([net_flops(n) for n in samples], rel=1e-3)
    done = of(events, ev.DoneEvent)[0]  # the typical step: a batch of 8
    median_s = done.step_ms_median / 1000.0
    assert done.samples_per_s * median_s == pytest.approx(8)
    assert done.tflops * 1e12 * median_s == pytest.approx(net_flops(8), rel=1e-3)


@pytest.mark.unit
def test_tokens_and_flops_follow_a_sequence_length_that_changes(tmp_path: Path) -> None:
    code, events = run_model(user_model(tmp_path), "make_token_lengths")
    assert code == EXIT_OK, of(events, ev.ErrorEvent)
    assert of(events, ev.HelloEvent)[0].tokens_per_step == 4 * 8
    assert [round(n) for n in per_step(events, "tokens_per_s")] == [32, 128, 128] * 2
    flops = per_step(events, "tflops")
    assert flops[1] == pytest.approx(4 * flops[0], rel=1e-3)  # an embedding and a Linear


@pytest.mark.unit
def test_flops_given_by_the_factory_are_used_and_checked_against_the_count(
    tmp_path: Path,
) -> None:
    code, events = run_model(user_model(tmp_path), "make_given_flops")
    hello = of(events, ev.HelloEvent)[0]
    assert code == EXIT_OK and hello.flops_per_step == 1e6 and hello.flops_source == "analytic"
    assert hello.flops_counted == pytest.approx(net_flops(BATCH), rel=0.01)


def line_of(text: str) -> int:
    return USER_MODEL.splitlines().index(text) + 1


BAD = [
    ("make_raises", "the factory raised ValueError: the data folder is empty"),
    ("no_such_factory", "has no 'no_such_factory'. The functions it defines: "),
    ("make_no_model", "the factory's answer has no 'model'"),
    ("make_no_batches", "the factory's answer has no 'batches'"),
    ("make_not_a_module", "'model' is a str, not a torch.nn.Module"),
    ("make_wrong_width", "the first training step failed on the first batch (inputs a tensor"),
    ("make_wrong_width_given_flops", "the first training step failed on the first batch"),
    ("make_generator", "the batches ran out after 3 batches and cannot be read again"),
    ("make_typo", "unknown key(s) 'lossfn'. Accepted keys: model, batches, loss,"),
    ("make_net_not_model", "unknown key(s) 'net', and it has no 'model'. Accepted keys: model,"),
    ("make_vector_loss", "the loss is a tensor of shape [8] (float32), not a scalar"),
    ("make_float_loss", "the loss is a float, not a tensor: backward() needs the tensor"),
]


@pytest.mark.unit
@pytest.mark.parametrize(("factory", "expected"), BAD)
def test_a_bad_factory_exits_2_naming_the_spec(tmp_path: Path, factory: str, expected: str) -> None:
    path = user_model(tmp_path)
    code, events = run_model(path, factory)
    assert code == EXIT_USAGE
    (error,) = of(events, ev.ErrorEvent)
    assert error.kind == "config"
    assert f"workload.model = '{path}:{factory}'" in error.message
    assert expected in error.message
    if factory.startswith("make_wrong_width"):  # the model's own complaint, with its shapes
        assert "mat1 and mat2 shapes cannot be multiplied" in error.message
        assert error.traceback and "F.linear" in error.traceback
        assert "Accepted batches" in error.message
    if factory != "make_generator":
        assert not of(events, ev.StepEvent)


@pytest.mark.unit
def test_a_first_step_failure_whose_own_message_ends_in_a_stop_ends_its_sentence_once(
    tmp_path: Path,
) -> None:
    """torch's cross_entropy says "... target batch_size (8)." and the message read "(8).. ":
    the user's error, then what is accepted, each sentence ending once."""
    path = user_model(tmp_path)
    code, events = run_model(path, "make_short_targets")
    assert code == EXIT_USAGE
    (error,) = of(events, ev.ErrorEvent)
    assert (
        "targets a tensor of shape [8] (int64)): ValueError: Expected input batch_size (32) to "
        "match target batch_size (8). Accepted batches: " in error.message
    )
    assert ".." not in error.message


@pytest.mark.unit
def test_the_users_traceback_is_theirs_file_and_line(tmp_path: Path) -> None:
    path = user_model(tmp_path)
    _, events = run_model(path, "make_raises")
    trace = of(events, ev.ErrorEvent)[0].traceback or ""
    raise_line = line_of('    raise ValueError("the data folder is empty")')
    assert f'File "{path}", line {raise_line}, in helper_that_fails' in trace
    assert (
        f'File "{path}", line {line_of("    return helper_that_fails()")}, in make_raises' in trace
    )
    assert "ampscope" not in trace.replace(str(tmp_path), "")
    assert trace.splitlines()[-1] == "ValueError: the data folder is empty"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("missing/model.py:make", "the file missing/model.py does not exist"),
        ("no_such_pkg.models:make", "there is no module named 'no_such_pkg'"),
        ("model.py", "names no factory"),
        ("models/net.txt:make", "is not a Python file (.py)"),
    ],
)
@pytest.mark.unit
def test_a_spec_that_names_no_factory_exits_2(tmp_path: Path, spec: str, expected: str) -> None:
    seen: list[ev.Event] = []
    code = run(
        "fp32", [f'workload.model="{spec}"', "device='cpu'"], record=False, on_event=seen.append
    )
    assert code == EXIT_USAGE
    (error,) = of(seen, ev.ErrorEvent)
    assert error.kind == "config" and f"'{spec}'" in error.message and expected in error.message


@pytest.mark.unit
def test_a_module_name_is_imported_from_the_working_folder(tmp_path: Path, monkeypatch) -> None:
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    user_model(package, "models.py")
    monkeypatch.chdir(tmp_path)
    seen: list[ev.Event] = []
    sets = ['workload.model="mypkg.models:make"', "device='cpu'", "steps=3"]
    assert run("fp32", sets, record=False, on_event=seen.append) == EXIT_OK
    assert of(seen, ev.HelloEvent)[0].workload == "teacher-mlp"


@pytest.mark.unit
def test_dimensions_of_a_built_in_workload_are_refused_beside_a_model(tmp_path: Path) -> None:
    code, events = run_model(user_model(tmp_path), "make", "fp32", "workload.layers=4")
    (error,) = of(events, ev.ErrorEvent)
    assert (
        code == EXIT_USAGE and "workload.layers does not apply to your own model" in error.message
    )


@pytest.mark.slow
def test_waiting_for_batches_is_reported_and_warned_once(tmp_path: Path) -> None:
    code, events = run_model(user_model(tmp_path), "make_slow_data", "fp32", "steps=16")
    assert code == EXIT_OK
    steps = of(events, ev.StepEvent)
    assert steps[0].step == 0  # step 0's batch, read ahead of timing, waited as long
    assert all(s.data_ms >= 190 for s in steps)  # sleeps 200 ms
    (warning,) = [w for w in of(events, ev.WarningEvent) if w.code == "input-bound"]
    assert "num_workers" in warning.message and "pin_memory" in warning.message
    seen: list[ev.Event] = []
    run(
        "fp32",
        ["workload.kind='mlp'", "device='cpu'", "steps=14"],
        record=False,
        on_event=seen.append,
    )
    assert not [w for w in of(seen, ev.WarningEvent) if w.code == "input-bound"]


@pytest.mark.unit
def test_a_model_too_big_for_the_device_gets_the_planners_estimate_first(
    tmp_path: Path, monkeypatch
) -> None:
    from ampscope.engine.step import setup

    class Tiny:
        total = 1 << 20  # a device of 1 MiB

    monkeypatch.setattr(setup.psutil, "virtual_memory", lambda: Tiny())
    _, events = run_model(user_model(tmp_path), "make_big", "fp32", "steps=2")
    (warning,) = [w for w in of(events, ev.WarningEvent) if w.code == "memory-estimate"]
    assert events.index(warning) < events.index(of(events, ev.StepEvent)[0])
    # fp32 training state: 4 bytes of weights, 4 of gradients and 8 of AdamW state a parameter
    assert f"at {1_001_000 * 16 / 2**20:.3g} MiB (1,001,000 parameters" in warning.message
    assert "has 1 MiB" in warning.message


@pytest.mark.unit
def test_the_parameter_count_is_built_on_the_meta_device_when_the_factory_allows(
    tmp_path: Path,
) -> None:
    path = user_model(tmp_path)
    assert count_model_parameters(f"{path}:make") == (1348, "meta", "teacher-mlp")
    assert count_model_parameters(f"{path}:make_on_cpu_only") == (1348, "cpu", "teacher-mlp")


@pytest.mark.unit
def test_a_fault_in_their_model_mid_run_shows_their_frames_only(tmp_path: Path) -> None:
    path = user_model(tmp_path)
    code, events = run_model(path, "make_fails_later")
    assert code == 1  # a fault of the run, after steps that trained
    (error,) = of(events, ev.ErrorEvent)
    assert error.kind == "exception" and error.step is not None and error.step >= 3
    trace = error.traceback or ""
    line = line_of('            raise ValueError("a corrupt sample in the fifth batch")')
    assert f'File "{path}", line {line}, in forward' in trace
    assert "ampscope" not in trace.replace(str(tmp_path), "") and "torch/nn" not in trace
    assert trace.splitlines()[-1] == "ValueError: a corrupt sample in the fifth batch"


@pytest.mark.unit
def test_a_loss_that_takes_the_wrong_arguments_is_named_as_the_loss(tmp_path: Path) -> None:
    path = user_model(tmp_path)
    code, events = run_model(path, "make_loss_one_argument")
    assert code == EXIT_USAGE
    (error,) = of(events, ev.ErrorEvent)
    assert "loss_without_targets() takes 1 positional argument" in error.message
    assert "For the loss, give 'loss' as (output, targets) -> scalar tensor" in error.message
    assert error.traceback is None  # no frame of theirs to show: the message says it all


@pytest.mark.unit
def test_a_loss_without_a_gradient_shows_no_frames_of_torchs_backward(tmp_path: Path) -> None:
    code, events = run_model(user_model(tmp_path), "make_loss_without_grad")
    assert code == EXIT_USAGE
    (error,) = of(events, ev.ErrorEvent)
    assert "does not require grad" in error.message
    assert error.traceback is None  # autograd's frames only: none of theirs to show


@pytest.mark.unit
def test_runs_of_two_models_have_folders_that_tell_them_apart(tmp_path: Path) -> None:
    from ampscope.core.presets.workload_spec import record_name

    path = user_model(tmp_path)
    seen: list[ev.Event] = []
    sets = [model_set(path, "make"), "device='cpu'", "steps=2"]
    assert run("fp32", sets, runs_dir=tmp_path / "runs", on_event=seen.append) == 0
    (folder,) = (tmp_path / "runs").iterdir()
    assert folder.name.endswith("-fp32-user_model")  # the preset, then the model's file
    assert record_name("amp-bf16", "my_pkg.models:small") == "amp-bf16-models-small"
    assert record_name("fp32", None) == "fp32"


@pytest.mark.unit
def test_a_nan_before_any_update_in_fp32_blames_the_model_not_the_format(tmp_path: Path) -> None:
    path = user_model(tmp_path)
    code, events = run_model(path, "make_nan_loss")
    assert code == 1
    (error,) = of(events, ev.ErrorEvent)
    assert error.kind == "nan" and error.step == 0
    assert "the model or its data gives it" in error.message
    assert "wider format" not in error.message


@pytest.mark.unit
@pytest.mark.parametrize("command", ["run", "profile"])
def test_an_empty_model_spec_is_refused_not_read_as_no_model(capsys, command: str) -> None:
    """`--model ''` (an unset shell variable) trained the preset's own model as if no --model."""
    said = cli(capsys, command, "fp32", "--model", "", "--device", "cpu")
    assert said.returncode == EXIT_USAGE and said.stdout == ""
    assert said.stderr.startswith("ampscope: --model '': workload.model = '' names no factory.")


@pytest.mark.unit
@pytest.mark.parametrize("argv", [["memory", "--model", ""], ["plan", "fp8", "--model", ""]])
def test_memory_and_plan_name_an_empty_model_spec(capsys, argv: list[str]) -> None:
    """They said 'say which model' / 'needs a model' as if --model had not been given."""
    said = cli(capsys, *argv)
    assert said.returncode == EXIT_USAGE and said.stdout == ""
    assert "workload.model = '' names no factory" in said.stderr


@pytest.mark.unit
@pytest.mark.parametrize("target", ["model.py", "gone.py"])
def test_a_link_that_leads_nowhere_is_named_as_a_link(capsys, tmp_path: Path, target: str) -> None:
    """A link in a loop (or to a removed file) was said not to exist, though `ls` lists it."""
    link = tmp_path / "model.py"
    link.symlink_to(tmp_path / target)
    said = cli(capsys, "memory", "--model", f"{link}:make")
    assert said.returncode == EXIT_USAGE
    assert f"the file {link} is a link that leads to no file" in said.stderr
    assert "does not exist" not in said.stderr


@pytest.mark.unit
def test_a_model_path_that_is_a_fifo_is_named_for_what_it_is(capsys, tmp_path: Path) -> None:
    """It was said not to exist, though `ls` lists it."""
    fifo = tmp_path / "model.py"
    os.mkfifo(fifo)
    said = cli(capsys, "memory", "--model", f"{fifo}:make")
    assert said.returncode == EXIT_USAGE
    assert f"the file {fifo} is not a regular file (a FIFO" in said.stderr


ODD_MODEL = """
import torch


class Unprintable(Exception):
    def __str__(self):
        raise ZeroDivisionError("its __str__ fails too")


def data(step):
    return torch.randn(8, 4), torch.randn(8, 2)


def mse(out, target):
    return ((out - target) ** 2).mean()


def make_unprintable(ctx):
    raise Unprintable()


class FailsLater(torch.nn.Linear):
    def forward(self, x):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls > 3:
            raise Unprintable()
        return super().forward(x)


def make_fails_later(ctx):
    return {"model": FailsLater(4, 2), "batches": data, "loss": mse}


def make_flops_past_float(ctx):
    return {"model": torch.nn.Linear(4, 2), "batches": data, "loss": mse,
            "flops_per_step": 10**400}


class Unnamable:
    def __str__(self):
        raise Unprintable()


def make_unnamable(ctx):
    return {"model": torch.nn.Linear(4, 2), "batches": data, "loss": mse, "name": Unnamable()}


def make_flops_near_floats_range(ctx):
    return {"model": torch.nn.Linear(4, 2), "batches": data, "loss": mse,
            "flops_per_step": 1e308}


def make_tokens_past_float(ctx):
    return {"model": torch.nn.Linear(4, 2), "batches": data, "loss": mse,
            "tokens_per_step": 10**5000}
"""


@pytest.mark.unit
@pytest.mark.parametrize("factory", ["make_flops_past_float", "make_tokens_past_float"])
def test_a_figure_past_floats_range_is_refused_as_a_figure(tmp_path: Path, factory: str) -> None:
    """10**400 FLOPs stopped the run on an OverflowError with ampscope's own frames."""
    path = tmp_path / "odd_model.py"
    path.write_text(ODD_MODEL)
    code, events = run_model(path, factory)
    assert code == EXIT_USAGE
    (error,) = of(events, ev.ErrorEvent)
    key = factory.removeprefix("make_").removesuffix("_past_float")
    assert error.kind == "config"
    assert f"'{key}_per_step' is a number past float's range. Accepted: a" in error.message


@pytest.mark.unit
def test_flops_per_step_near_floats_range_is_refused_where_tflops_would_be_inf(
    tmp_path: Path,
) -> None:
    """1e308 FLOPs a step ran, and its summary said 'TFLOP/s inf'."""
    path = tmp_path / "odd_model.py"
    path.write_text(ODD_MODEL)
    code, events = run_model(path, "make_flops_near_floats_range")
    assert code == EXIT_USAGE
    (error,) = of(events, ev.ErrorEvent)
    assert "'flops_per_step' is 1e+308. Accepted: a number > 0 and at most 1e+24" in error.message


@pytest.mark.unit
def test_an_exception_that_cannot_be_printed_still_ends_the_run_recorded(tmp_path: Path) -> None:
    """A user's exception whose __str__ raises ended the process on a traceback of
    ampscope's own, its record left without a done."""
    path = tmp_path / "odd_model.py"
    path.write_text(ODD_MODEL)
    code, events = run_model(path, "make_unprintable")
    assert code == EXIT_USAGE
    (error,) = of(events, ev.ErrorEvent)
    assert "the factory raised Unprintable: <exception str() failed>" in error.message
    assert of(events, ev.DoneEvent)
    code, events = run_model(path, "make_fails_later")
    (error,) = of(events, ev.ErrorEvent)
    assert code == EXIT_FAILED and error.kind == "exception"
    assert error.message == "Unprintable: <exception str() failed>"
    assert of(events, ev.DoneEvent)[0].status == "failed"


@pytest.mark.unit
@pytest.mark.parametrize("command", ["run", "memory", "plan"])
def test_a_name_that_cannot_be_made_text_is_the_users_error(
    capsys, tmp_path: Path, command: str
) -> None:
    """A 'name' whose __str__ raises ended memory and plan on a traceback of ampscope's frames,
    and failed run as an unexplained exception (exit 1)."""
    from ampscope.cli.main import main

    path = tmp_path / "odd_model.py"
    path.write_text(ODD_MODEL)
    spec = f"{path}:make_unnamable"
    argv = {
        "run": ["run", "fp32", "--model", spec, "--device", "cpu", "--steps", "2"],
        "memory": ["memory", "--model", spec],
        "plan": ["plan", "fp16", "--model", spec, "--steps", "1", "--out", str(tmp_path / "p")],
    }[command]
    code = main(["--runs-dir", str(tmp_path / "runs"), *argv])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE, err
    assert f"workload.model = '{spec}': 'name' cannot be made text: Unprintable: " in err
    assert f'File "{path}"' in err  # the user's frames, none of ampscope's
    assert "ampscope/engine" not in err and "ampscope/cli" not in err
