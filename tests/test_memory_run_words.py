"""``ampscope memory --run`` on a CPU: a ratio only where the model, not the process, makes
the RSS growth."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ampscope.core import events as ev
from ampscope.core import records
from tests.helpers import cli, done, hello

pytestmark = pytest.mark.unit
MIB = 2**20


def cpu_record(tmp_path: Path, params: int, grown: int) -> Path:
    run_dir = tmp_path / f"run-{params}"
    run_dir.mkdir()
    conf = {"precision": "fp32", "batch_size": 8, "workload": {"kind": "mlp"}}
    start = hello(config=conf, device="cpu", param_count=params, rss_before_model=300 * MIB)
    end = done()
    end.mem_peak = 300 * MIB + grown
    (run_dir / records.EVENTS_FILE).write_bytes(b"".join(ev.encode(e) for e in (start, end)))
    return run_dir


def test_a_tiny_model_on_a_cpu_gets_no_ratio_of_the_processs_own_growth(tmp_path, capsys):
    """132k parameters printed 'compared / predicted = 19.72 (+1872%)': the plan is 2 MiB,
    the growth the runtime's own."""
    said = cli(capsys, "memory", "--run", str(cpu_record(tmp_path, 132_000, 40 * MIB)))
    assert said.returncode == 0, said.stderr
    assert "compared / predicted" not in said.stdout and "+1" not in said.stdout
    assert (
        "not compared: the plan (2.01 MiB) is under four times the 92 MiB a CPU run" in said.stdout
    )
    assert "read the ratio" not in said.stdout


def test_a_model_whose_plan_dwarfs_the_runtime_is_compared(tmp_path, capsys):
    said = cli(capsys, "memory", "--run", str(cpu_record(tmp_path, 30_000_000, 520 * MIB)))
    assert said.returncode == 0, said.stderr
    assert "compared / predicted = 1.14 (+14%)" in said.stdout


def gpt_record(tmp_path: Path, name: str, batch: object, precision: str = "fp32") -> Path:
    run_dir = tmp_path / name
    run_dir.mkdir()
    shape = {"kind": "gpt", "layers": 2, "width": 8, "heads": 2, "seq_len": 4, "vocab": 16}
    conf = {"precision": precision, "batch_size": batch, "workload": shape}
    start = hello(config=conf, device="cpu", param_count=1000)
    (run_dir / records.EVENTS_FILE).write_bytes(ev.encode(start) + ev.encode(done()))
    return run_dir


def test_a_record_with_sizes_below_one_is_never_planned_as_negative_bytes(tmp_path, capsys):
    """Before: a batch_size of -4 in a record planned 'activations -17 KiB, logits -4 KiB', and
    layers -2 '-1,296 parameters', 'training total: -20.2 KiB'."""
    said = cli(capsys, "memory", "--run", str(gpt_record(tmp_path, "neg-batch", -4)))
    assert said.returncode == 2 and "-17 KiB" not in said.stdout
    assert "the record's batch_size -4 is not a batch (at least 1)" in said.stderr
    run_dir = gpt_record(tmp_path, "neg-layers", 4)
    lines = (run_dir / records.EVENTS_FILE).read_bytes().replace(b'"layers":2', b'"layers":-2')
    (run_dir / records.EVENTS_FILE).write_bytes(lines)
    said = cli(capsys, "memory", "--run", str(run_dir))
    assert said.returncode == 0, said.stderr
    assert "1,000 parameters" in said.stdout and not re.search(r"-[0-9]", said.stdout)


def test_a_precision_the_planner_does_not_know_is_said_not_planned_silently(tmp_path, capsys):
    said = cli(capsys, "memory", "--run", str(gpt_record(tmp_path, "new", 4, "fp4")))
    assert said.returncode == 0, said.stderr
    assert "the record's precision 'fp4' is not one the planner knows: planned as fp32" in (
        said.stdout
    )


def test_a_run_name_is_looked_up_in_the_runs_folder_given_before_the_command(
    tmp_path, capsys, monkeypatch
):
    """Before: 'ampscope --runs-dir X memory --run NAME' looked in ./runs alone: not found, or
    another run of the same name planned in its place."""
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    run_dir = gpt_record(mine, "20260101T000000Z-fp32", 4)
    said = cli(capsys, "--runs-dir", str(mine), "memory", "--run", run_dir.name)
    assert said.returncode == 0, said.stderr
    assert f"Run {run_dir.name}: 1,000 parameters" in said.stdout


def test_a_records_words_and_a_presets_path_are_shown_literally(tmp_path, capsys):
    """Before: a record's device name, or a preset path, with an escape sequence in it
    reached the terminal raw in memory's title lines."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    conf = {"precision": "fp32", "batch_size": 8, "workload": {"kind": "mlp"}}
    start = hello(config=conf, device="cpu\x1b]0;title\x07", param_count=1000)
    (run_dir / records.EVENTS_FILE).write_bytes(b"".join(ev.encode(e) for e in (start, done())))
    said = cli(capsys, "memory", "--run", str(run_dir))
    assert said.returncode == 0, said.stderr
    assert "\x1b" not in said.stdout and "device cpu\\x1b]0;title\\x07" in said.stdout
    from ampscope.core.presets import shipped_presets_dir

    odd = tmp_path / "odd\x1b[31m.toml"
    odd.write_text((shipped_presets_dir() / "fp32.toml").read_text())
    said = cli(capsys, "memory", "--preset", str(odd))
    assert said.returncode == 0, said.stderr
    assert "\x1b" not in said.stdout and "odd\\x1b[31m.toml' (cuda size)" in said.stdout


@pytest.mark.parametrize("grown", [-200 * MIB, -400 * MIB])
def test_a_recorded_peak_below_the_rss_before_the_model_or_zero_is_no_figure(
    tmp_path, capsys, grown
) -> None:
    """A damaged or hand-made record (a peak under the RSS before the model, or negative):
    'recorded peak: -100 MiB' and 'compared / predicted = -0.44 (-144%)' were printed."""
    said = cli(capsys, "memory", "--run", str(cpu_record(tmp_path, 30_000_000, grown)))
    assert said.returncode == 0, said.stderr
    assert "compared / predicted" not in said.stdout
    assert not re.search(r"[\s(=]-[0-9]", said.stdout), said.stdout  # no negative figure
    if grown > -300 * MIB:  # a peak above zero but under the RSS before the model
        assert "the sampled RSS missed the step's peak, so nothing is compared" in said.stdout
