"""What the commands say about themselves: help texts and headings that state real numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from ampscope.cli.main import main
from tests.helpers import cli


def help_of(capsys: pytest.CaptureFixture[str], command: str) -> str:
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse's wrapping undone


@pytest.mark.unit
def test_numerics_help_says_json_prints_one_object_not_the_event_stream(capsys) -> None:
    said = help_of(capsys, "numerics")
    assert "--json print one JSON object at the end" in said
    assert "event stream" not in said
    assert "--json print the event stream" in help_of(capsys, "run")  # run's does


@pytest.mark.unit
def test_profile_says_the_warm_up_it_really_runs(capsys, tmp_path: Path) -> None:
    """The preset's warmup_steps (here 4), not a fixed 3: in the help and over the profile."""
    assert "after the preset's warm-up steps (its warmup_steps, 5 by default" in help_of(
        capsys, "profile"
    )
    done = cli(
        capsys,
        "profile", "mlp-demo", "--device", "cpu", "--steps", "1", "--no-record",
        "--set", "warmup_steps=4", "--set", "workload.width=32", "--set", "workload.layers=1",
        "--set", "batch_size=4",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("mlp-demo (after 4 warm-up steps): 1 steps from step 4,")


@pytest.mark.unit
def test_doctors_flags_without_bench_agree_in_number(capsys) -> None:
    one = cli(capsys, "doctor", "--bench-device", "cpu")
    assert one.returncode == 2
    assert "--bench-device only applies to the machine check" in one.stderr
    assert "leave it out" in one.stderr
    two = cli(capsys, "doctor", "--quick", "--bench-device", "cpu")
    assert "--quick and --bench-device only apply to the machine check" in two.stderr
    assert "leave them out" in two.stderr


@pytest.mark.unit
def test_a_parameter_count_past_a_floats_range_is_called_too_large(capsys) -> None:
    """'memory --params 1e400' said it 'must be at least 1'."""
    said = cli(capsys, "memory", "--params", "1e400")
    assert said.returncode == 2
    assert "'1e400' is not a parameter count: it is too large to read" in said.stderr
    assert "at least 1" not in said.stderr
    assert "must be at least 1" in cli(capsys, "memory", "--params", "0.5").stderr


@pytest.mark.unit
def test_a_parameter_count_past_any_model_is_refused_and_the_largest_fits_its_columns(
    capsys,
) -> None:
    """'memory --params 1e30' printed 20-digit TiB figures that pushed every column out of line."""
    said = cli(capsys, "memory", "--params", "1e30")
    assert said.returncode == 2 and "'1e30' is more parameters" in said.stderr
    assert "at most 1e15" in said.stderr
    table = cli(capsys, "memory", "--params", "1e15")
    assert table.returncode == 0
    assert table.stdout.startswith("Training memory for 1,000,000,000,000,000 parameters (1,000T)")
    header, *rows = table.stdout.split("\n\n")[1].splitlines()[:8]
    assert all(len(row) == len(header) for row in rows), [header, *rows]


@pytest.mark.unit
def test_a_replay_speed_out_of_range_is_echoed_as_typed(capsys) -> None:
    """'replay --speed 1e400' said '--speed inf is out of range', a value the user never typed."""
    said = cli(capsys, "replay", "--speed", "1e400")
    assert said.returncode == 2
    assert "--speed 1e400 is out of range. Accepted: 0.1 to 100." in said.stderr
    assert "inf" not in said.stderr
    assert "--speed banana is not a number" in cli(capsys, "replay", "--speed", "banana").stderr


ESC = "\x1b[31m"


@pytest.mark.unit
@pytest.mark.parametrize(
    "argv",
    [
        ["memory", "--params", "1M", "--gpu", ESC],  # an unknown option's text
        ["memory", "--params", "1M", "--batch", ESC],  # a value argparse's type refuses
        ["memory", "--preset", ESC],  # an unknown preset, said by memory itself
    ],
)
def test_a_refused_argument_is_echoed_escaped(capsys, argv: list[str]) -> None:
    """An ESC byte the user typed reached the terminal raw through argparse's own messages
    and memory's, where every other command's refusal shows it as \\x1b."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("ampscope: ")
    assert "\x1b" not in err and "\\x1b[31m" in err


@pytest.mark.unit
@pytest.mark.parametrize(
    ("shape", "refused"),
    [
        (
            "--layers 12 --hidden 100000000000 --heads 12 --seq 1024 --batch 8",
            "1.44e+24 parameters",
        ),
        (
            "--layers 12 --hidden 768 --heads 12 --seq 100000000000 --batch 100000000",
            "bytes of activations",
        ),
        (
            "--layers 2 --hidden 64 --heads 2 --seq 64 --batch 1 --vocab 100000000000000",
            "parameters",
        ),
    ],
)
def test_a_shape_past_any_model_is_refused_naming_it(capsys, shape: str, refused: str) -> None:
    """'memory --hidden 1e11' printed 13-digit TiB figures that pushed every column out of line."""
    said = cli(capsys, "memory", *shape.split())
    assert said.returncode == 2 and said.stdout == ""
    assert said.stderr.startswith("ampscope: the shape (layers ") and refused in said.stderr
    assert "more than the planner takes" in said.stderr


@pytest.mark.unit
@pytest.mark.parametrize(
    "shape",
    [
        "--layers 100 --hidden 900000 --heads 100 --seq 1 --batch 1",  # 9.7e14 parameters
        "--layers 100 --hidden 1000 --heads 8 --seq 1000000 --batch 1000",  # 6.4e15 B of activations
    ],
)
def test_the_largest_shapes_planned_keep_their_columns_in_line(capsys, shape: str) -> None:
    table = cli(capsys, "memory", *shape.split())
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.split("\n\n")[1].splitlines()[:8]
    assert all(len(row) == len(header) for row in rows), [header, *rows]


@pytest.mark.unit
def test_a_hidden_size_the_heads_do_not_divide_is_refused_naming_both(capsys) -> None:
    """'memory --hidden 8 --heads 3' planned a model no attention layer can have."""
    said = cli(
        capsys,
        "memory",
        *["--layers", "2", "--hidden", "768", "--heads", "10", "--seq", "8", "--batch", "1"],
    )
    assert said.returncode == 2 and said.stdout == ""
    assert "hidden 768 is not divisible by heads 10" in said.stderr
    assert "takes 12, 16, 24, 32, 48 or 64 heads" in said.stderr


@pytest.mark.unit
@pytest.mark.parametrize("command", [["dtypes"], ["runs"], ["doctor"], ["presets"], ["stop"]])
def test_a_model_given_before_a_command_that_trains_none_is_refused(capsys, command) -> None:
    """'ampscope --model X dtypes' ran dtypes and ignored X without a word."""
    said = cli(capsys, "--model", "net.py:make", *command)
    assert said.returncode == 2 and said.stdout == ""
    assert said.stderr.startswith(f"ampscope: --model net.py:make: '{command[0]}' trains no model")
    assert "run, bench, memory, plan, numerics and profile" in said.stderr


@pytest.mark.unit
@pytest.mark.parametrize("argv", [["--set", "steps=150"], ["--set=steps=1", "run", "fp32"]])
def test_a_set_before_any_command_says_where_it_goes(capsys, argv) -> None:
    """'ampscope --set steps=150' (meant for the dashboard) answered argparse's "argument
    command: invalid choice: 'steps=150'"."""
    said = cli(capsys, *argv)
    assert said.returncode == 2 and said.stdout == ""
    assert said.stderr.startswith("ampscope: --set before a command: it sets a field")
    assert "invalid choice" not in said.stderr and said.stderr.count("\n") == 1
