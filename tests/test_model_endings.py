"""How ``ampscope run`` and ``ampscope memory`` end and speak for a ``--model`` whose code does
something unusual: a Ctrl+C in its factory, ``sys.exit()``, a name with control characters, a
model built on the meta device."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ampscope.cli.main import main
from ampscope.core import records
from ampscope.engine.lifecycle.exits import EXIT_FAILED, EXIT_STOPPED, EXIT_USAGE
from tests.helpers import engine_env

MODEL = """
import sys
import torch
from torch import nn


def batches():
    return [(torch.randn(8, 4), torch.randn(8, 2)) for _ in range(2)]


def make_interrupted(ctx):
    raise KeyboardInterrupt  # Ctrl+C while the factory loads its data


def make_slow(ctx):
    import time
    time.sleep(60)  # a long load: stopped before it ends


def make_exits(ctx):
    sys.exit()


class Odd:
    def __repr__(self):
        raise ValueError("no repr")


def make_exits_odd(ctx):
    sys.exit(Odd())  # an argument whose repr raises


def make_exits_huge(ctx):
    sys.exit(10**5000)  # past the digits int's repr gives


def make_cancelled(ctx):
    import asyncio
    raise asyncio.CancelledError("the loader's task was cancelled")  # a BaseException


class Cancels(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.calls = 0

    def forward(self, x):
        import asyncio
        self.calls += 1
        if self.calls > 1:  # the second step (setup counts FLOPs on a copy)
            raise asyncio.CancelledError("the loader's task was cancelled")
        return self.fc(x)


def make_cancels_in_a_step(ctx):
    return {"model": Cancels(), "batches": batches(), "loss": nn.functional.mse_loss}


class CancelsAlways(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        import asyncio
        raise asyncio.CancelledError("the loader's task was cancelled")


def make_cancels_at_once(ctx):
    return {"model": CancelsAlways(), "batches": batches(), "loss": nn.functional.mse_loss}


class RaisesItsError(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.error = ValueError("the shapes do not fit")  # one instance, raised on every call

    def forward(self, x):
        raise self.error


def make_raises_one_error(ctx):
    return {"model": RaisesItsError(), "batches": batches(), "loss": nn.functional.mse_loss}


def make_cancels_reading_a_batch(ctx):
    def batch(step):
        import asyncio
        if step > 0:
            raise asyncio.CancelledError("the loader's task was cancelled")
        return batches()[0]

    return {"model": nn.Linear(4, 2), "batches": batch, "loss": nn.functional.mse_loss}


class Unshowable:
    def __str__(self):
        raise ValueError("no str")

    __repr__ = __str__


def make_odd_key(ctx):
    return {"model": nn.Linear(4, 2), "batches": batches(), Unshowable(): 1}


def make_out_of_descriptors(ctx):
    import errno

    def batches_then_emfile():
        yield torch.randn(8, 4), torch.randn(8, 2)
        raise OSError(errno.EMFILE, "Too many open files")  # as DataLoader workers fail

    loss = nn.functional.mse_loss
    return {"model": nn.Linear(4, 2), "batches": batches_then_emfile(), "loss": loss}


def make_os_exit(ctx):
    import os
    os._exit(0)


def make_odd_name(ctx):
    loss = nn.functional.mse_loss
    return {"model": nn.Linear(4, 2), "batches": batches(), "loss": loss, "name": "two\\nlines\\x1b[2J"}


def make_on_meta(ctx):
    with torch.device("meta"):
        model = nn.Linear(4, 2)
    return {"model": model, "batches": batches(), "loss": nn.functional.mse_loss}
"""


def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "net.py"
    path.write_text(MODEL)
    return path


def run_model(tmp_path: Path, factory: str) -> int:
    spec = f"{model_file(tmp_path)}:{factory}"
    return main(["run", "fp32", "--model", spec, "--steps", "2", "--device", "cpu",
                 "--runs-dir", str(tmp_path / "runs")])  # fmt: skip


@pytest.mark.unit
def test_a_ctrl_c_in_the_factory_still_says_where_the_record_is(tmp_path, capsys) -> None:
    assert run_model(tmp_path, "make_interrupted") == EXIT_STOPPED
    out = capsys.readouterr().out
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert "status               stopped" in out
    assert out.rstrip().splitlines()[-1] == f"run record: {run_dir}"


@pytest.mark.unit
def test_a_factory_that_fails_before_hello_says_where_the_record_is(tmp_path, capsys) -> None:
    assert run_model(tmp_path, "make_on_meta") == EXIT_USAGE
    out, err = capsys.readouterr()
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert out.rstrip().splitlines()[-1] == f"run record: {run_dir}"
    # and a model built on the meta device is said to be, with the way out, not torch's frames
    assert "the model's parameters are on the meta device (2 of 2)" in err
    assert "model.to_empty(device=ctx.device)" in err and "Build the model on the CPU" in err
    assert "Traceback" not in err and "torch/nn/modules/module.py" not in err


@pytest.mark.unit
def test_sys_exit_in_the_factory_under_memory_is_an_error_naming_it(tmp_path, capsys) -> None:
    spec = f"{model_file(tmp_path)}:make_exits"
    assert main(["memory", "--model", spec]) == EXIT_USAGE  # not a silent exit 0
    out, err = capsys.readouterr()
    assert out == ""
    first = err.splitlines()[0]
    assert first.startswith(f"ampscope: workload.model = '{spec}': your code called sys.exit()")
    assert "Raise an exception instead" in first


@pytest.mark.unit
@pytest.mark.parametrize(
    ("factory", "call"),
    [
        ("make_exits_odd", "sys.exit(<repr() failed>)"),
        ("make_exits_huge", "sys.exit(about 10**5000)"),
    ],
)
def test_sys_exit_with_an_unprintable_code_is_said_under_run_and_memory(
    tmp_path, capsys, factory, call
) -> None:
    assert run_model(tmp_path, factory) == EXIT_FAILED  # was ampscope's traceback, the record torn
    err = capsys.readouterr().err
    assert f"your code called {call} before the first step" in err
    assert "During handling" not in err and "faults.py" not in err
    (run_dir,) = (tmp_path / "runs").iterdir()
    done = records.load_run(run_dir).done
    assert done is not None and done.status == "failed" and call in (done.error or "")
    spec = f"{model_file(tmp_path)}:{factory}"
    assert main(["memory", "--model", spec]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"ampscope: workload.model = '{spec}': your code called {call} while")


@pytest.mark.unit
def test_a_factory_that_is_sys_exit_itself_shows_none_of_ampscopes_frames(tmp_path, capsys) -> None:
    """'--model sys:exit': no frame of the user's code called it, and the run's error showed
    ampscope's own (training.py, setup.py, user_code.py) as if they were at fault."""
    argv = ["run", "fp32", "--model", "sys:exit", "--steps", "2", "--device", "cpu"]
    assert main([*argv, "--runs-dir", str(tmp_path / "runs")]) == EXIT_FAILED
    said = capsys.readouterr()
    shown = said.out + said.err
    assert "your code called sys.exit(ModelContext(" in shown
    assert "Traceback" not in shown and "ampscope/engine" not in shown


@pytest.mark.unit
def test_a_run_out_of_file_descriptors_says_what_to_raise_or_lower(tmp_path, capsys) -> None:
    """DataLoader workers under a low 'ulimit -n' failed the run on 'OSError: Too many open
    files' and torch's frames, with no word of the limit or of num_workers."""
    assert run_model(tmp_path, "make_out_of_descriptors") == EXIT_FAILED
    said = capsys.readouterr()
    shown = " ".join((said.out + said.err).split())
    assert "Too many open files" in shown
    assert "hint: The process ran out of file descriptors (ulimit -n is " in shown
    assert "num_workers" in shown


@pytest.mark.unit
def test_a_base_exception_from_the_users_code_ends_the_run_failed_and_recorded(
    tmp_path, capsys
) -> None:
    assert run_model(tmp_path, "make_cancels_reading_a_batch") == EXIT_FAILED  # a traceback
    err = capsys.readouterr().err
    assert "CancelledError: the loader's task was cancelled" in err
    assert "cli/main.py" not in err  # the user's frames, not ampscope's way to them
    (run_dir,) = (tmp_path / "runs").iterdir()
    done = records.load_run(run_dir).done
    assert done is not None and done.status == "failed"
    assert "CancelledError" in (done.error or "")


@pytest.mark.unit
@pytest.mark.parametrize(
    ("factory", "said"),
    [
        ("make_cancelled", "the factory raised CancelledError: the loader's task was cancelled"),
        ("make_odd_key", "the factory's mapping has unknown key(s) '<repr() failed>'."),
    ],
)
def test_a_factory_raising_a_base_exception_or_answering_an_odd_key_is_a_config_error(
    tmp_path, capsys, factory, said
) -> None:
    """Both were ampscope's traceback under memory (a BaseException passed the factory's
    except Exception; the unknown key's str() raised); under run, an exit 1 or a crash."""
    spec = f"{model_file(tmp_path)}:{factory}"
    assert main(["memory", "--model", spec]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"ampscope: workload.model = '{spec}': {said}")
    assert "user_code.py" not in err
    assert run_model(tmp_path, factory) == EXIT_USAGE
    assert f"ampscope: workload.model = '{spec}': {said}" in capsys.readouterr().err


@pytest.mark.unit
@pytest.mark.parametrize("command", [["memory"], ["plan", "fp8"], ["plan", "fp16"]])
def test_a_base_exception_inside_a_step_under_memory_and_plan_is_no_traceback(
    tmp_path, capsys, command
) -> None:
    """memory's measured step and plan's watched fp32 steps (and fp16's check) caught
    Exception alone: a step raising asyncio.CancelledError ended them on ampscope's traceback."""
    spec = f"{model_file(tmp_path)}:make_cancels_in_a_step"
    args = [*command, "--model", spec]
    code = main(args if command == ["memory"] else [*args, "--out", str(tmp_path / "plan")])
    err = capsys.readouterr().err
    assert "ampscope/engine" not in err and "ampscope/cli" not in err
    if command == ["memory"]:  # the parameters' plan stands, the step is said unmeasured
        assert code == 0
    else:
        assert code == EXIT_USAGE
        assert "failed (steps 0 to 0 ran" in err and "CancelledError" in err


@pytest.mark.unit
@pytest.mark.parametrize(
    "command", [["run", "fp32", "--steps", "2"], ["numerics", "fp32"], ["plan", "fp8"]]
)
def test_a_base_exception_from_the_first_forward_is_the_first_steps_failure(
    tmp_path, capsys, command
) -> None:
    """A forward raising asyncio.CancelledError at once passed every check around it (they
    catch Exception): plan ended on ampscope's traceback, run and numerics on exit 1 as an
    instrumentation fault; it is the first step's failure, with the user's frames."""
    spec = f"{model_file(tmp_path)}:make_cancels_at_once"
    runs = ["--runs-dir", str(tmp_path / "runs")]
    out = ["--out", str(tmp_path / "plan")] if command[0] == "plan" else runs
    assert main([*command, "--model", spec, "--device", "cpu", *out]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "the first training step failed on the first batch" in err
    assert "CancelledError: the loader's task was cancelled" in err
    assert "ampscope/engine" not in err and "ampscope/cli" not in err


@pytest.mark.unit
def test_a_model_raising_one_kept_exception_again_is_blamed_not_ampscope(tmp_path, capsys) -> None:
    """The FLOP count swallowed the model's exception with its frames still on it; raised
    again by the first step, it carried the count's frames, and the run called it a fault of
    ampscope's instrumentation (exit 1, ampscope's traceback) instead of the model's."""
    assert run_model(tmp_path, "make_raises_one_error") == EXIT_USAGE
    err = capsys.readouterr().err
    assert "the first training step failed on the first batch" in err
    assert "ValueError: the shapes do not fit" in err
    assert "instrumentation" not in err and "ampscope/engine" not in err


@pytest.mark.unit
def test_a_models_name_with_control_characters_stays_on_one_header_line(tmp_path, capsys) -> None:
    assert run_model(tmp_path, "make_odd_name") == 0
    err = capsys.readouterr().err
    (header,) = [line for line in err.splitlines() if " params, model " in line]
    assert "model two\\nlines\\x1b[2J from " in header and "\x1b" not in err


@pytest.mark.subprocess
def test_a_stop_during_setup_still_says_where_the_record_is(tmp_path) -> None:
    runs = tmp_path / "runs"
    command = [sys.executable, "-m", "ampscope", "run", "fp32", "--model",
               f"{model_file(tmp_path)}:make_slow", "--device", "cpu", "--runs-dir", str(runs)]  # fmt: skip
    proc = subprocess.Popen(command, cwd=tmp_path, env=engine_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not list(runs.glob("*/events.jsonl")) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # in setup: importing torch, or in the factory
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    (run_dir,) = runs.iterdir()
    assert proc.returncode == EXIT_STOPPED, err[-2000:]
    assert out.rstrip().splitlines()[-1] == f"run record: {run_dir}"


@pytest.mark.unit
def test_ctrl_c_in_the_factory_under_memory_says_so_without_a_traceback(tmp_path, capsys) -> None:
    """It printed a raw KeyboardInterrupt traceback."""
    spec = f"{model_file(tmp_path)}:make_interrupted"
    assert main(["memory", "--model", spec]) == EXIT_STOPPED
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert "stopped (Ctrl+C) while the model of" in err and "nothing counted" in err


@pytest.mark.subprocess
def test_os_exit_in_the_factory_under_memory_is_said_and_never_exit_0(tmp_path) -> None:
    """The factory's os._exit(0) ended memory --model with exit 0 and not a word."""
    spec = f"{model_file(tmp_path)}:make_os_exit"
    done = subprocess.run(
        [sys.executable, "-m", "ampscope", "memory", "--model", spec],
        env=engine_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == EXIT_USAGE, done.stderr
    assert done.stdout == ""
    assert "your code called os._exit(0) while its model was being built" in done.stderr
