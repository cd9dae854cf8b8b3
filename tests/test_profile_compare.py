"""Two runs' profiles side by side: Compare's lines under its plots and
``ampscope profile --compare``, from forged records and from real profiles on a CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ampscope.cli.main import main
from ampscope.core import records
from ampscope.core.profiles import compare
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.screens.compare import CompareScreen
from ampscope.tui.screens.presets import PresetsScreen
from tests.helpers import cli, run, shown, split_profile, terminal_output, text
from tests.snapshot_runs import BF16_SPLIT, FP32_SPLIT, write_profiled_runs, write_record

FP32, BF16 = split_profile(12.0, **FP32_SPLIT), split_profile(7.0, **BF16_SPLIT)


def runs(*named: tuple[str, object]) -> list[compare.ProfiledRun]:
    return [compare.ProfiledRun(name, name, profile) for name, profile in named]  # type: ignore[arg-type]


@pytest.mark.unit
def test_a_record_profiled_twice_is_compared_by_its_last_profile(tmp_path: Path) -> None:
    fp32, bf16, fp16 = (records.load_run(p) for p in write_profiled_runs(tmp_path))
    first = compare.last_profile(fp32.events)
    assert first is not None and (first.step, first.step_ms) == (150, 12.0)
    assert compare.last_profile(fp16.events) is None
    lines = compare.compare_lines(
        [
            compare.ProfiledRun(r.preset, r.preset, compare.last_profile(r.events))
            for r in (fp32, bf16, fp16)
        ],
        "fp32",
    )
    assert lines == [
        "fp32 \u2192 amp-bf16, 12.0 \u2192 7.00 ms/step: matmul \u221268 %, elementwise +14 % "
        "(casts)",
        "No profile: amp-fp16 ('ampscope profile amp-fp16' or p in a live Run view)",
    ]


@pytest.mark.unit
def test_each_run_is_diffed_against_the_baseline_or_the_first_run_with_a_profile() -> None:
    three = runs(("fp32", FP32), ("amp-bf16", BF16), ("bf16", BF16))
    assert compare.compare_lines(three, "amp-bf16")[0].startswith(
        "amp-bf16 \u2192 fp32, 7.00 \u2192"
    )
    assert compare.compare_lines(three, "amp-bf16")[1].startswith(
        "amp-bf16 \u2192 bf16, 7.00 \u2192"
    )
    unprofiled_base = runs(("fp16", None), ("fp32", FP32), ("amp-bf16", BF16))
    lines = compare.compare_lines(unprofiled_base, "fp16")
    assert lines[0].startswith("fp32 \u2192 amp-bf16") and lines[1].startswith("No profile: fp16")
    alone = compare.compare_lines(runs(("fp32", FP32), ("a", None), ("b", None)), "fp32")
    assert alone[0] == "Profile of fp32 alone, GPU kernel time: matmul 63 %, elementwise 12 %"
    assert alone[1] == "No profile: a, b ('ampscope profile PRESET' or p in a live Run view)"
    none = compare.compare_lines(runs(("a", None), ("b", None)), "a")
    assert none == ["No profiles to compare: 'ampscope profile PRESET' or p in a live Run view."]


@pytest.mark.unit
def test_every_line_fits_its_width_and_many_runs_end_in_a_count() -> None:
    long = "x" * 90
    many = runs(("fp32", FP32), *((f"{long}{i}", BF16) for i in range(6)), (long, None))
    for width in (78, 40):
        lines = compare.compare_lines(many, "fp32", width)
        assert len(lines) == 4 and all(len(line) <= width for line in lines)
        assert lines[0].startswith("fp32 \u2192 xxx") and lines[1].startswith("fp32 \u2192 xxx")
        assert lines[2].startswith("\u2026 4 more profiled runs: ")
        assert lines[3].startswith("No profile: xxx")
    wide = compare.compare_lines(runs(("fp32", FP32), ("amp-bf16", BF16)), "fp32", 200)
    assert "norm, activation \u221213 %" in wide[0]  # room for every class that moved


@pytest.mark.unit
def test_without_step_times_classes_compare_by_share_and_cpu_against_gpu_says_so() -> None:
    no_time = split_profile(12.0, **FP32_SPLIT)
    no_time.step_ms = 0.0
    line = compare.pair_line("fp32", "amp-bf16", no_time, BF16, 200)
    assert line.startswith("fp32 \u2192 amp-bf16, share of step: matmul 63 % \u2192 34 %")
    cpu = split_profile(12.0, timing="cpu", **FP32_SPLIT)
    line = compare.pair_line("cpu", "gpu", cpu, BF16, 200)
    assert "(CPU op time vs GPU kernel time: not like for like)" in line


@pytest.mark.ui
def test_the_profile_lines_show_run_names_literally(tmp_path: Path) -> None:
    name = "[red]evil[/] [/x]\x1b[2J"
    paths = [
        write_record(tmp_path, "20260101T000001Z-a", name, "ok", 12.0, 20, extra=[FP32]),
        write_record(tmp_path, "20260101T000002Z-b", "fp32", "ok", 7.0, 20, extra=[BF16]),
    ]

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await shown(pilot, app, PresetsScreen)
            app.push_screen(CompareScreen([records.load_run(p) for p in paths]))
            screen = await shown(pilot, app, CompareScreen)
            await pilot.pause()
            assert text(screen, "#compare-profile").startswith(
                "fp32 \u2192 [red]evil[/] [/x]\\x1b[2J, 7.00 \u2192 12.0 ms/step: matmul +217 %"
            )
            assert "\x1b[2J" not in terminal_output(app)[1]

    run(go())


@pytest.mark.unit
def test_profile_compare_prints_both_splits_and_what_moved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fp32, bf16, _ = write_profiled_runs(tmp_path)
    assert main(["profile", "--compare", str(fp32), bf16.name, "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "A: fp32 (20261130T090000Z-fp32): 5 steps from step 150, GPU kernel time" in out
    assert "  matmul                63 %   7.60 ms fp32          34 %   2.40 ms bf16" in out
    assert "A \u2192 B, 12.0 \u2192 7.00 ms/step: matmul \u221268 %, elementwise +14 %" in out
    args = ["profile", "--compare", fp32.name, bf16.name, "--runs-dir", str(tmp_path), "--json"]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data.keys() == {"before", "after", "unit", "changes", "differs"}
    assert (data["before"]["run"], data["after"]["preset"]) == (fp32.name, "amp-bf16")
    assert data["before"]["step"] == 150 and data["unit"] == "ms per step"
    matmul = data["changes"][0]
    assert matmul == {"class": "matmul", "before": 7.6, "after": 2.4, "change": -0.6842}


@pytest.mark.unit
@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--compare", "no-such-run", "R1"], "--compare: no run record 'no-such-run'. Accepted: "),
        (["--compare", "R0", "R2"], "the run '20261130T092000Z-amp-fp16' holds no profile. "),
        (["fp32", "--compare", "R0", "R1"], "give either a preset to profile or --compare"),
        ([], "say what to profile: a preset name"),
    ],
)
def test_profile_compare_refuses_in_a_paragraph_with_exit_2(
    args: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    names = [p.name for p in write_profiled_runs(tmp_path)]
    args = [names[int(a[1])] if a in ("R0", "R1", "R2") else a for a in args]
    assert main(["profile", *args, "--runs-dir", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert said.replace("R2", names[2]) in captured.err and captured.out == ""
    assert "Traceback" not in captured.err and captured.err.count("\n") == 1
    if "holds no profile" in said:
        assert "'ampscope profile amp-fp16'" in captured.err and "p in the Run view" in captured.err


def _profile(preset: str, runs_dir: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """``ampscope profile PRESET --json``: it trains in the process it runs in, as here."""
    done = cli(
        capsys,
        "profile", preset, "--device", "cpu", "--steps", "2", "--json",
        "--runs-dir", str(runs_dir),
        "--set", "workload.kind='mlp'", "--set", "workload.width=64",
        "--set", "workload.layers=2", "--set", "batch_size=8",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return Path(json.loads(done.stdout)["trace"]).parent


@pytest.mark.slow
def test_real_profiles_of_fp32_and_amp_bf16_on_a_cpu_compare_by_matmul_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fp32, bf16 = _profile("fp32", tmp_path, capsys), _profile("amp-bf16", tmp_path, capsys)
    assert main(["profile", "--compare", str(fp32), str(bf16), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["before"]["dtypes"]["matmul"].keys() == {"fp32"}
    assert data["after"]["dtypes"]["matmul"].keys() == {"bf16"}
    assert data["after"]["casts"] > 0  # autocast converts the weights for every matmul
    # Each class that takes 1 % of the step before or after is a change, in ms per step. How
    # much each moves is the CPU's business, not the test's: on a busy machine time outside
    # any operator ("other") can take 98 % of a step and leave matmul under the 1 %.
    before, after = data["before"], data["after"]
    ms = {
        cls: (
            before["classes"].get(cls, 0.0) * before["step_ms"],
            after["classes"].get(cls, 0.0) * after["step_ms"],
        )
        for cls in {*before["classes"], *after["classes"]}
    }
    changes = {c["class"]: c for c in data["changes"]}
    assert changes.keys() == {c for c, pair in ms.items() if max(pair) >= 0.01 * before["step_ms"]}
    for cls, change in changes.items():
        assert change["before"] == pytest.approx(ms[cls][0], abs=1e-3)
        assert change["after"] == pytest.approx(ms[cls][1], abs=1e-3)


@pytest.mark.ui
def test_a_sweep_with_repeats_compares_each_rows_profile_whichever_repeat_took_it(
    tmp_path: Path,
) -> None:
    """A row of repeats is one row in Compare; its profile is the one any of its runs took
    (here the second repeat of each preset), not a run matched to a row by position."""
    paths = []
    for k in range(3):
        for preset, ms, profile in (("fp32", 12.0, FP32), ("amp-bf16", 7.0, BF16)):
            extra = [profile] if k == 1 else []
            name = f"2026010{k + 1}T00000{len(paths)}Z-{preset}"
            paths.append(write_record(tmp_path, name, preset, "ok", ms, 20, extra=extra))

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await shown(pilot, app, PresetsScreen)
            loaded = [records.load_run(p) for p in paths]
            app.push_screen(CompareScreen(loaded, baseline="fp32", repeated=True))
            screen = await shown(pilot, app, CompareScreen)
            await pilot.pause()
            assert [(r.preset, r.runs) for r in screen.rows] == [("fp32", 3), ("amp-bf16", 3)]
            assert text(screen, "#compare-profile").startswith(
                "fp32 \u2192 amp-bf16, 12.0 \u2192 7.00 ms/step: matmul \u221268 %"
            )

    run(go())


@pytest.mark.unit
def test_a_profile_whose_figures_do_not_hold_is_no_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A damaged or hand-made record: a matmul share of -0.4 and a negative step time were
    compared as 'matmul -40 %' and a change of hundreds of percent."""
    import msgspec

    from ampscope.core import events as ev
    from tests.snapshot_runs import write_record

    fp32, _, _ = write_profiled_runs(tmp_path)
    good = split_profile(7.0, step=150, **BF16_SPLIT)
    classes = {**good.classes, "matmul": -0.4, "elementwise": good.classes["elementwise"] + 0.74}
    for name, bad in (
        ("20261130T093000Z-bf16", msgspec.structs.replace(good, classes=classes)),
        ("20261130T094000Z-bf16", msgspec.structs.replace(good, step_ms=-7.0)),
    ):
        forged = write_record(tmp_path, name, "bf16", "ok", 7.0, 200, extra=[bad])
        assert main(["profile", "--compare", str(fp32), str(forged)]) == 2
        said = capsys.readouterr()
        assert "holds no profile" in said.err and "-40 %" not in said.out + said.err
        assert compare.last_profile(records.load_run(forged).events) is None
    assert isinstance(good, ev.ProfileEvent) and compare.last_profile([good]) is good


@pytest.mark.unit
def test_profile_compare_of_two_different_models_or_batches_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A GPT's profile beside an MLP's read as a format's change, without a word."""
    import msgspec

    from ampscope.core import events as ev

    fp32, bf16, _ = write_profiled_runs(tmp_path)
    for path, workload, batch in ((fp32, "gpt", 8), (bf16, "mlp", 32)):
        events = records.load_run(path).events
        hello = next(e for e in events if isinstance(e, ev.HelloEvent))
        config = {**hello.config, "workload": {"kind": workload}, "batch_size": batch}
        events[events.index(hello)] = msgspec.structs.replace(hello, config=config)
        (path / records.EVENTS_FILE).write_bytes(b"".join(ev.encode(e) for e in events))
    argv = ["profile", "--compare", fp32.name, bf16.name, "--runs-dir", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert (
        "A and B differ in workload (gpt, mlp) and batch (8, 32): what moved is not the "
        "format's change alone." in " ".join(out.split())
    )
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["differs"] == {"workload": ["gpt", "mlp"], "batch": ["8", "32"]}


@pytest.mark.unit
def test_profile_compare_of_the_same_setup_has_no_such_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fp32, bf16, _ = write_profiled_runs(tmp_path)
    assert main(["profile", "--compare", fp32.name, bf16.name, "--runs-dir", str(tmp_path)]) == 0
    assert "differ in" not in capsys.readouterr().out
    args = ["profile", "--compare", fp32.name, bf16.name, "--runs-dir", str(tmp_path), "--json"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["differs"] == {}
