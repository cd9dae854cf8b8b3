"""Presets: every shipped one resolves, and every kind of bad input gets a message naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from ampscope.cli import main as cli
from ampscope.core import presets

SHIPPED = [p.name for p in presets.list_presets() if p.source == "shipped"]


@pytest.mark.unit
def test_every_preset_in_the_lectures_order_is_shipped() -> None:
    """The listing order names the lecture's presets: each must exist as a shipped file."""
    assert set(presets.PRESET_ORDER) <= set(SHIPPED)
    assert {"fp32", "amp-fp16-noscale", "compile-max-autotune"} <= set(presets.PRESET_ORDER)


@pytest.mark.unit
@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_preset_resolves(name: str) -> None:
    preset = presets.load_preset(name)
    assert preset.name == name
    assert preset.description, "every preset needs a one-line description"
    for on_cuda in (False, True):
        dims, batch = presets.resolve_workload(preset, on_cuda)
        assert batch >= 1 and all(v >= 1 for v in dims.values())


@pytest.mark.unit
def test_presets_mean_what_their_names_say() -> None:
    assert presets.load_preset("amp-fp16").uses_scaler
    assert not presets.load_preset("amp-fp16-noscale").uses_scaler
    assert not presets.load_preset("amp-bf16").uses_scaler
    for mode in ("default", "reduce-overhead", "max-autotune"):
        preset = presets.load_preset(f"compile-{mode}")
        assert (preset.compile, preset.precision) == (mode, "amp-bf16")


@pytest.mark.unit
def test_auto_size_is_small_on_cpu_and_about_100m_params_on_cuda() -> None:
    preset = presets.load_preset("fp32")
    small, _ = presets.resolve_workload(preset, on_cuda=False)
    large, _ = presets.resolve_workload(preset, on_cuda=True)
    params = 12 * large["layers"] * large["width"] ** 2 + 2 * large["vocab"] * large["width"]
    assert 80e6 < params < 200e6
    assert small["width"] < large["width"]
    assert large["width"] % 64 == 0 and large["vocab"] % 64 == 0


@pytest.mark.unit
def test_overrides_are_parsed_as_toml_values() -> None:
    preset = presets.load_preset(
        "fp32",
        [
            "steps=7",
            "lr=1e-2",
            "workload.layers=3",
            "fullgraph=true",
            "device=cpu",
            "batch_size=auto",
        ],
    )
    assert (preset.steps, preset.lr, preset.workload.layers, preset.fullgraph) == (7, 0.01, 3, True)
    assert preset.device == "cpu" and preset.batch_size == "auto"


@pytest.mark.unit
def test_explicit_sizes_override_auto() -> None:
    preset = presets.load_preset("fp32", ["workload.width=96", "batch_size=3"])
    dims, batch = presets.resolve_workload(preset, on_cuda=True)
    assert dims["width"] == 96 and batch == 3


@pytest.mark.unit
def test_user_preset_directory_and_save_roundtrip(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    edited = presets.load_preset(
        "amp-fp16", ["steps=42", "scaler.init_scale=1024", "workload.kind=mlp"]
    )
    edited.name = "my-fp16"
    presets.user_presets_dir().mkdir(parents=True)
    (presets.user_presets_dir() / "my-fp16.toml").write_text(presets.to_toml(edited))
    assert "my-fp16" in [p.name for p in presets.list_presets()]
    assert presets.load_preset("my-fp16") == edited


def run_cli(args: list[str], capsys) -> tuple[int, str]:
    code = cli.main(args)
    captured = capsys.readouterr()
    return code, captured.err + captured.out


BAD_FILES = {
    "unknown key": (
        'name = "x"\nprecison = "fp32"\n',
        ["precison", "Accepted fields", "precision"],
    ),
    "wrong type": ('name = "x"\nsteps = "many"\n', ["steps", "integer"]),
    "unknown precision": ('name = "x"\nprecision = "fp4"\n', ["precision", "'fp4'", "'fp8'"]),
    "out of range": (
        'name = "x"\n[scaler]\nbackoff_factor = 1.5\n',
        ["scaler.backoff_factor", "< 1"],
    ),
    "negative lr": ('name = "x"\nlr = -0.1\n', ["lr", "> 0"]),
    "malformed toml": ('name = "x\nsteps = 3\n', ["not valid TOML"]),
    "nested unknown": ('name = "x"\n[workload]\nlayer = 2\n', ["workload.layer", "layers"]),
    "wrong workload field": (
        'name = "x"\n[workload]\nkind = "mlp"\nheads = 2\n',
        ["workload.heads", "mlp"],
    ),
    "impossible scaler": (
        'name = "x"\nprecision = "fp16"\ngrad_scaler = "on"\n',
        ["grad_scaler", "amp-fp16"],
    ),
    "bad device": ('name = "x"\ndevice = "gpu"\n', ["device", "cuda:N"]),
}


@pytest.mark.unit
@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_preset_file_exits_2_naming_the_key(case: str, tmp_path: Path, capsys) -> None:
    text, expected = BAD_FILES[case]
    path = tmp_path / "bad.toml"
    path.write_text(text)
    code, output = run_cli(["run", str(path), "--no-record"], capsys)
    assert code == 2
    assert str(path) in output
    for fragment in expected:
        assert fragment in output
    assert "Traceback" not in output


@pytest.mark.unit
def test_unknown_preset_lists_the_available_ones(capsys) -> None:
    code, output = run_cli(["run", "fp33", "--no-record"], capsys)
    assert code == 2
    assert "Unknown preset 'fp33'" in output and "fp32" in output and "amp-bf16" in output


@pytest.mark.unit
def test_bad_override_is_blamed_on_the_override(capsys) -> None:
    code, output = run_cli(["run", "fp32", "--set", "steps=0", "--no-record"], capsys)
    assert code == 2
    assert "--set steps=0" in output and ">= 1" in output
    code, output = run_cli(["run", "fp32", "--steps", "0", "--no-record"], capsys)
    assert code == 2 and output.startswith("ampscope: --steps 0: 'steps'") and ">= 1" in output
    code, output = run_cli(["run", "fp32", "--device", "x" * 70, "--no-record"], capsys)
    assert code == 2 and f"--device {'x' * 70}: 'device'" in output and "--set" not in output
    code, output = run_cli(["run", "fp32", "--set", "nonsense", "--no-record"], capsys)
    assert code == 2 and "key=value" in output
    code, output = run_cli(["run", "fp32", "--set", "steps=abc", "--no-record"], capsys)
    assert code == 2
    assert "--set steps=abc: 'steps' cannot be text. Accepted: an integer >= 1" in output
    code, output = run_cli(["run", "fp32", "--set", "lr=true", "--no-record"], capsys)
    assert "'lr' cannot be true or false. Accepted: a number > 0" in output


@pytest.mark.unit
def test_a_set_value_of_the_wrong_kind_is_named_in_the_users_words(capsys) -> None:
    """1e12, nan and 1e400 are no fractions; a table is named by its fields, never by the
    class that reads it ('Accepted: OptimizerOptions')."""
    for value in ("1e12", "nan", "1e400"):
        code, output = run_cli(["run", "fp32", "--set", f"steps={value}", "--no-record"], capsys)
        assert code == 2 and "fractional" not in output
        assert f"--set steps={value}: 'steps' cannot be a float" in output
    code, output = run_cli(["run", "fp32", "--set", "optimizer=1", "--no-record"], capsys)
    assert code == 2 and "Options" not in output
    assert "Accepted: a table of fields (fused, foreach" in output
    code, output = run_cli(["run", "fp32", "--set", "workload=1", "--no-record"], capsys)
    assert code == 2 and "WorkloadTable" not in output and "(kind, model, size" in output


@pytest.mark.unit
def test_a_set_list_or_table_of_the_wrong_kind_is_named_and_blamed_on_the_set(capsys) -> None:
    """A list or a table of names is said in words, not as msgspec's type
    (a list of Annotated str with its Meta); a wrong entry in a --set table is the --set's,
    where the shipped preset's file was named as at fault."""
    code, output = run_cli(["run", "fp32", "--set", 'fp8.layers="x"', "--no-record"], capsys)
    assert code == 2 and "Accepted: a list of strings (or leave unset)." in output
    assert "typing" not in output
    code, output = run_cli(["run", "fp32", "--set", "fp8.layer_recipes=[]", "--no-record"], capsys)
    assert code == 2 and "Accepted: a table of names to 'tensorwise' | 'rowwise'" in output
    code, output = run_cli(
        ["run", "fp32", "--set", "fp8.layer_recipes={a=1}", "--no-record"], capsys
    )
    assert code == 2 and output.startswith("ampscope: --set fp8.layer_recipes={a=1}: ")
    assert "fp32.toml" not in output


@pytest.mark.unit
def test_presets_command_lists_shipped_presets(capsys) -> None:
    code, output = run_cli(["presets"], capsys)
    assert code == 0
    for name in presets.PRESET_ORDER:
        assert name in output


@pytest.mark.unit
def test_presets_on_an_80_column_terminal_wrap_between_words(capsys, monkeypatch) -> None:
    import os
    import shutil
    import sys

    monkeypatch.setattr(shutil, "get_terminal_size", lambda *a: os.terminal_size((80, 24)))
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    code, output = run_cli(["presets"], capsys)
    assert code == 0
    # the user presets folder is printed whole, however long its path (a test's is long)
    lines = [line for line in output.splitlines() if not line.startswith("User presets: ")]
    assert max(len(line) for line in lines) < 80
    indent = " " * (len("compile-reduce-overhead") + 2)  # the longest name, then two spaces
    continued = [line for line in lines if line.startswith(indent)]
    assert continued and all(line[len(indent)] != " " for line in continued)
    words = set(presets.load_preset("amp-fp16").description.split())
    assert words <= set(output.split())  # no word cut in two


@pytest.mark.subprocess
def test_piping_into_head_is_no_error() -> None:
    import subprocess
    import sys

    from tests.helpers import ROOT, engine_env

    proc = subprocess.run(
        f"'{sys.executable}' -m ampscope dtypes $(seq 1 300) | head -1",  # > a pipe's buffer
        shell=True,
        cwd=ROOT,
        env=engine_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout == "1\n" and "Traceback" not in proc.stderr and "Error" not in proc.stderr


@pytest.mark.unit
def test_a_preset_without_debug_faults_says_so_and_one_with_them_says_so() -> None:
    """The training step calls the fault hook only for a preset that sets a fault."""
    assert not presets.Debug().configured
    assert (
        presets.Debug(inf_loss_at_step=3).configured and presets.Debug(raise_at_step=1).configured
    )
    assert not presets.Debug(rank=1).configured  # a rank alone strikes nothing
