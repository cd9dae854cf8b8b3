"""ampscope bench: the comparison table, its exports, interleaving and the spoken verdict."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import sys
import threading
from pathlib import Path

import msgspec
import psutil
import pytest

from ampscope.cli.main import main
from ampscope.core import comparison, records
from ampscope.core import events as ev
from tests.helpers import hello, step, write_finished_record


def done(
    ms: float,
    mem: int,
    loss: float,
    p10: float | None = None,
    p90: float | None = None,
    status: str = "ok",
    skipped: int = 0,
    error: str | None = None,
) -> ev.DoneEvent:
    d = ev.empty_done(status, error)
    d.step_ms_median, d.step_ms_p10, d.step_ms_p90 = ms, p10 or ms * 0.98, p90 or ms * 1.02
    d.samples_per_s, d.mem_peak, d.loss_final, d.skipped_steps = 1000 / ms, mem, loss, skipped
    d.steps_done = 100
    return d


def record(preset: str, d: ev.DoneEvent, zeros: float | None = None) -> records.RunRecord:
    r = records.RunRecord(path=Path(f"/runs/{preset}"), done=d)
    if zeros is not None:
        r.events = [step(0, grad_zero_frac=zeros)]
    return r


def runs(preset: str, medians: tuple[float, ...], mem: int, loss: float, **kw) -> list:
    return [record(preset, done(ms, mem, loss), **kw) for ms in medians]


def fixed_rows() -> list[comparison.Row]:
    """Three interleaved repeats each: enough for a speed verdict."""
    rows = [
        comparison.row_from_runs("fp32", runs("fp32", (100.0, 101.0, 99.0), 1000, 2.000)),
        comparison.row_from_runs("amp-bf16", runs("amp-bf16", (41.7, 42.0, 41.4), 620, 2.004)),
        comparison.row_from_runs("tf32", runs("tf32", (99.0, 103.0, 98.0), 1000, 2.000)),
        comparison.row_from_runs(
            "amp-fp16-noscale",
            runs("amp-fp16-noscale", (45.0, 45.5, 44.8), 640, 2.3, zeros=0.41),
        ),
        comparison.row_from_runs(
            "fp16", [record("fp16", ev.empty_done("failed", "Loss became nan at step 3."))]
        ),
    ]
    return comparison.compare(rows, "fp32")


@pytest.mark.unit
def test_verdict_is_derived_from_the_numbers() -> None:
    lines = comparison.verdicts(fixed_rows(), "fp32")
    # By hand: ln(100/41.7), ln(101/42), ln(99/41.4) have mean 0.87465 and sd 0.0028075;
    # t(0.975, 2) = 4.303, so exp(0.87465 -+ 4.303 * 0.0028075 / sqrt(3)) = 2.381 .. 2.415.
    assert (
        "amp-bf16: 2.4x faster than fp32 (95% CI 2.38-2.41x), 38% less peak memory, "
        "final loss within 0.2%." in lines
    )
    assert any(line.startswith("tf32: no significant speed difference from fp32") for line in lines)
    assert (
        "amp-fp16-noscale lost 41% of its output-gradient values to underflow (exact zeros)."
        in lines
    )
    assert "fp16 failed: Loss became nan at step 3." in lines
    assert not any(line.startswith("fp32") for line in lines)


@pytest.mark.unit
def test_a_repeat_stopped_by_the_user_leaves_the_finished_repeats_to_speak() -> None:
    """'ampscope stop' during a bench stops one run, and the sweep goes on: the preset's
    other repeat finished as the baseline's did. The stopped run's loss at its 79th of 300
    steps made the row's final loss '+47.4 %' and its slow median the step time '0.20x':
    the finished runs, alike in loss and speed, said neither."""
    stopped = done(40.0, 1000, 2.9, status="stopped")
    rows = comparison.compare(
        [
            comparison.row_from_runs("fp32", runs("fp32", (1.2, 1.4), 1000, 0.93)),
            comparison.row_from_runs(
                "mlp-demo", [record("mlp-demo", stopped), record("mlp-demo", done(1.3, 1000, 0.93))]
            ),
        ],
        "fp32",
    )
    row = rows[1]
    assert (row.status, row.loss_final, row.step_ms) == ("mixed", 0.93, 1.3)
    text = comparison.render(rows, "fp32", width=400)
    assert "mixed: 1 of 2 runs stopped before the last step" in text
    assert "mlp-demo mixed: 1 of 2 runs stopped before the last step" in text
    assert "final loss within 0.1%" in text and "47" not in text


@pytest.mark.unit
def test_a_stopped_baseline_is_said_beside_the_figures_read_against_it() -> None:
    """The baseline stopped at its 79th step: every row's 'final loss 67.9 % lower' is read
    against that step's loss, and no line said the baseline had stopped (a stopped row other
    than the baseline had its line); its status read 'stopped: ?'."""
    stopped = done(40.0, 1000, 2.9, status="stopped")
    rows = comparison.compare(
        [
            comparison.row_from_runs("fp32", [record("fp32", stopped)]),
            comparison.row_from_runs("mlp-demo", runs("mlp-demo", (1.3,), 1000, 0.93)),
        ],
        "fp32",
    )
    text = comparison.render(rows, "fp32", width=400)
    assert "fp32 was stopped before its last step: its figures cover the steps it ran" in text
    assert "stopped: ?" not in text and text.splitlines()[1].endswith(" stopped")


@pytest.mark.unit
def test_zeros_the_baseline_has_too_are_not_called_underflow() -> None:
    """A Hugging Face causal LM's last position gets no gradient: 1.6 % exact zeros in fp32
    and amp-bf16 alike, which the verdict once called amp-bf16's underflow."""
    rows = comparison.compare(
        [
            comparison.row_from_runs("fp32", runs("fp32", (100.0,), 1000, 2.0, zeros=0.016)),
            comparison.row_from_runs("amp-bf16", runs("amp-bf16", (60.0,), 900, 2.0, zeros=0.016)),
            comparison.row_from_runs("amp-fp16", runs("amp-fp16", (60.0,), 900, 2.0, zeros=0.30)),
        ],
        "fp32",
    )
    lines = comparison.verdicts(rows, "fp32")
    assert not any(line.startswith("amp-bf16 lost") for line in lines)
    assert (
        "amp-fp16 lost 30% of its output-gradient values to underflow (exact zeros; fp32 1.6%)."
        in lines
    )


@pytest.mark.unit
def test_baseline_speedup_is_one_and_a_failed_preset_is_a_row_with_its_reason() -> None:
    rows = {r.preset: r for r in fixed_rows()}
    assert rows["fp32"].speedup == 1.0 and rows["fp32"].mem_change == 0.0
    assert rows["fp16"].status == "failed" and "nan" in (rows["fp16"].reason or "")
    text = comparison.render(list(rows.values()), "fp32")
    header = text.splitlines()[0]
    for title, _ in comparison.COLUMNS:
        assert title in header
    assert "failed: Loss became nan" in text
    assert "1.00x" in text and "~" in text  # tf32's interval contains 1.0


@pytest.mark.unit
@pytest.mark.parametrize(
    ("device", "head", "words", "legend"),
    [
        (
            "cpu",
            "peak RSS  RSS vs base",
            "38% less peak process memory (RSS)",
            "peak RSS: the engine process's peak resident memory (RSS), the Python and torch "
            "runtime and its caches as well as the tensors: not the training tensors that "
            "ampscope memory plans",
        ),
        (
            "cuda",
            "peak alloc  alloc vs base",
            "38% less peak allocated memory",
            "peak alloc: the peak of torch's CUDA allocator (max_memory_allocated)",
        ),
    ],
)
def test_peak_memory_is_named_for_what_it_measures_on_the_device(
    device: str, head: str, words: str, legend: str
) -> None:
    """On a CPU the peak is the process's RSS, which `ampscope memory` does not plan: an MoE's
    amp-bf16 "+65 % more peak memory" than fp32 read as the opposite of the memory plan."""

    def on(preset: str, ms: tuple[float, ...], mem: int) -> comparison.Row:
        runs_of = runs(preset, ms, mem, 2.0)
        for r in runs_of:
            r.hello = hello(device=device, device_name=device)
        return comparison.row_from_runs(preset, runs_of)

    rows = comparison.compare([on("fp32", (100.0,), 1000), on("amp-bf16", (50.0,), 620)], "fp32")
    text = comparison.render(rows, "fp32", width=400)
    assert head in text.splitlines()[0]
    verdict = next(line for line in text.splitlines() if line.startswith("amp-bf16:"))
    assert verdict.endswith(f", {words}, final loss within 0.1%.")
    assert legend in text


@pytest.mark.unit
def test_exports_parse() -> None:
    rows = fixed_rows()
    data = json.loads(comparison.render(rows, "fp32", "json"))
    assert data["baseline"] == "fp32" and len(data["rows"]) == 5 and data["verdict"]
    table = list(csv.DictReader(io.StringIO(comparison.render(rows, "fp32", "csv"))))
    assert [r["preset"] for r in table] == [r.preset for r in rows]
    assert float(table[1]["speedup"]) > 2
    markdown = comparison.render(rows, "fp32", "markdown").splitlines()
    assert markdown[0].startswith("| preset |") and set(markdown[1]) <= {"|", "-"}


@pytest.mark.unit
def test_repeats_are_interleaved() -> None:
    assert comparison.interleaved(["a", "b", "c"], 2) == ["a", "b", "c", "a", "b", "c"]


@pytest.mark.unit
def test_repeats_use_the_spread_across_runs() -> None:
    runs = [record("x", done(ms, 1, 1.0)) for ms in (40.0, 50.0, 60.0)]
    row = comparison.row_from_runs("x", runs)
    geometric_mean = (40.0 * 50.0 * 60.0) ** (1 / 3)  # 49.3 ms: the speed-up's own average
    assert row.step_ms == pytest.approx(geometric_mean)
    assert (row.spread_lo, row.spread_hi, row.runs) == (40.0, 60.0, 3)


@pytest.mark.subprocess
def test_a_real_sweep_on_the_cpu(tmp_path: Path, capsys) -> None:
    code = main(
        [
            "bench",
            "fp16",  # given first; the baseline, fp32, runs first all the same
            "fp32",
            "--steps",
            "6",
            "--set",
            "workload.kind='mlp'",
            "--set",
            "device='cpu'",
            "--set",
            "warmup_steps=2",
            "--repeats",
            "1",
            "--runs-dir",
            str(tmp_path),
            "--json",
        ]
    )
    out = capsys.readouterr().out
    assert code == 1  # fp16 failed
    data = json.loads(out)
    rows = {r["preset"]: r for r in data["rows"]}
    assert list(rows) == ["fp32", "fp16"]  # the baseline goes first
    assert rows["fp32"]["speedup"] == 1.0 and rows["fp32"]["status"] == "ok"
    assert rows["fp16"]["status"] == "failed" and "nan" in rows["fp16"]["reason"].lower()
    (sweep,) = tmp_path.glob("*-sweep")
    assert json.loads((sweep / comparison.SWEEP_FILE).read_text())["order"] == ["fp32", "fp16"]
    assert len(records.list_runs(tmp_path)) == 2


@pytest.mark.unit
def test_unknown_preset_is_refused_before_anything_runs(tmp_path: Path, capsys) -> None:
    code = main(["bench", "fp32", "nope", "--runs-dir", str(tmp_path)])
    assert code == 2 and "Unknown preset 'nope'" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.unit
@pytest.mark.parametrize("repeats", ["0", "101", "99999999999"])
def test_a_number_of_repeats_out_of_range_is_refused_before_anything_runs(
    tmp_path: Path, capsys, repeats: str
) -> None:
    """--repeats 99999999999 started a sweep that could never end (each repeat is a run of
    every preset)."""
    code = main(["bench", "fp32", "--repeats", repeats, "--runs-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and f"--repeats {repeats}: accepted a whole number from 1 to 100" in err
    assert not list(tmp_path.iterdir())


CHATTY_ENGINE = r"""
import sys
for i in range(20_000):  # 2 MB: far more than a pipe holds (64 KB on Linux)
    sys.stderr.write(f"autotune log line {i:6d} " + "x" * 77 + "\n")
sys.stderr.write("fatal: the chatty engine gave up\n")
sys.stderr.flush()
print('{"not": "an event"}', flush=True)
sys.exit(1)
"""


@pytest.mark.subprocess
def test_a_run_under_a_runs_folder_that_is_not_utf8_is_read_back(tmp_path: Path) -> None:
    """The engine's hello names its folder with the bytes that are not UTF-8 escaped (JSON
    cannot carry them): bench finds the record by its name under the runs folder, where it
    read the run that ended ok as failed, "the engine exited at once"."""
    from ampscope.cli import bench
    from tests.helpers import done, hello

    runs = tmp_path / os.fsdecode(b"l\xe4ufe")
    run_dir = runs / "20260101T000000Z-fp32"
    run_dir.mkdir(parents=True)
    lines = ev.encode(hello(run_id=run_dir.name, run_dir=str(run_dir))) + ev.encode(done())
    (run_dir / records.EVENTS_FILE).write_bytes(lines)
    stream = tmp_path / "stream.jsonl"
    stream.write_bytes(lines)

    def engine(*args, **kwargs) -> list[str]:  # prints the record's lines, as the engine does
        return [
            sys.executable,
            "-c",
            f"import sys; sys.stdout.buffer.write(open({str(stream)!r}, 'rb').read())",
        ]

    rec = bench.run_one("fp32", [], runs, command=engine)
    assert b"\\xe4" in lines  # the line names the folder escaped
    assert rec.done is not None and rec.done.status == "ok" and rec.path == run_dir


@pytest.mark.subprocess
def test_a_chatty_engine_cannot_deadlock_the_bench(tmp_path: Path) -> None:
    """An engine that writes megabytes to stderr before its stdout closes must not hang bench."""
    from ampscope.cli import bench

    script = tmp_path / "chatty.py"
    script.write_text(CHATTY_ENGINE)

    def chatty(*args, **kwargs) -> list[str]:  # the engine's command line
        return [sys.executable, str(script)]

    result: list[records.RunRecord] = []
    worker = threading.Thread(
        target=lambda: result.append(bench.run_one("fp32", [], tmp_path, command=chatty))
    )
    worker.start()
    worker.join(timeout=120)  # a deadlock, not a speed limit: the fake engine needs ~0.1 s
    if worker.is_alive():
        for child in psutil.Process().children(recursive=True):
            if str(script) in " ".join(child.cmdline()):
                child.kill()
        worker.join(timeout=30)
        pytest.fail("bench.run_one deadlocked on a full stderr pipe")
    (rec,) = result
    assert rec.done is not None and rec.done.status == "failed"
    assert rec.done.error == "fatal: the chatty engine gave up"


@pytest.mark.unit
def test_one_run_each_shows_the_figures_but_no_speed_verdict() -> None:
    rows = comparison.compare(
        [
            comparison.row_from_runs("fp32", [record("fp32", done(100.0, 1000, 2.0))]),
            comparison.row_from_runs("amp-bf16", [record("amp-bf16", done(50.0, 600, 2.0))]),
        ],
        "fp32",
    )
    assert rows[1].speedup == 2.0 and rows[1].significant is None
    text = comparison.render(rows, "fp32")
    assert "2.00x ?" in text and "faster" not in text and "slower" not in text
    # What a lecturer reads aloud first is that there is no verdict, not the untested figure.
    assert (
        "amp-bf16: no speed verdict without 3 or more interleaved runs of each (--repeats 3); "
        "an untested 2x the speed of fp32" in " ".join(text.split())
    )
    assert "2x the speed of fp32, untested" not in text
    assert "--repeats 3" in text


def record_of(preset: str, medians: tuple[float, ...], **workload) -> list[records.RunRecord]:
    """Runs with a hello event saying what ran (the GPT's small size unless told otherwise)."""
    wl = {"kind": "gpt", "size": "auto", "layers": 2, "width": 64, "heads": 4} | workload
    conf = {"workload": wl, "batch_size": 32, "steps": 100}
    out = []
    for ms in medians:
        r = record(preset, done(ms, 1000, 2.0))
        r.hello = hello(preset=preset, config=conf, device_name="NVIDIA H100 80GB HBM3")
        out.append(r)
    return out


@pytest.mark.unit
def test_different_workloads_are_not_comparable_and_only_the_differences_are_named() -> None:
    medians = (100.0, 101.0, 99.0)
    rows = comparison.compare(
        [
            comparison.row_from_runs("fp32", record_of("fp32", medians)),
            comparison.row_from_runs(
                "mlp-demo", record_of("mlp-demo", (9.0, 9.1, 8.9), kind="mlp")
            ),
            comparison.row_from_runs("wide", record_of("wide", (50.0, 51.0, 49.0), width=128)),
            comparison.row_from_runs("bf16", record_of("bf16", (50.0, 51.0, 49.0))),
        ],
        "fp32",
    )
    by = {r.preset: r for r in rows}
    assert by["mlp-demo"].differs == ["workload"] and by["wide"].differs == ["sizes"]
    assert by["mlp-demo"].speedup is None and by["mlp-demo"].loss_change is None
    assert by["bf16"].differs == [] and by["bf16"].significant
    text = comparison.render(rows, "fp32")
    assert "not comparable: workload" in text and "not comparable: sizes" in text
    lines = comparison.verdicts(rows, "fp32")
    assert "mlp-demo: different workload from fp32: not comparable (workload mlp vs gpt)." in lines
    wide = next(line for line in lines if line.startswith("wide:"))
    assert "different sizes from fp32: not comparable" in wide and "width=128" in wide
    assert "batch" not in wide and "device" not in wide and "steps" not in wide


@pytest.mark.unit
def test_a_run_on_several_processes_is_not_compared_with_one_on_one() -> None:
    """torchrun's ranks each train the preset's batch, so a step of two ranks does twice the
    work of a step of one: their step times are no speed-up. The same preset, the same setup
    per rank, in History's Compare: not comparable, and said why."""
    medians = (100.0, 101.0, 99.0)
    one = record_of("amp-bf16", medians)
    two = record_of("amp-bf16", medians)
    for r in two:
        assert r.hello is not None
        r.hello = msgspec.structs.replace(r.hello, world_size=2, backend="gloo", strategy="ddp")
    rows = comparison.compare(
        [comparison.row_from_runs("one", one), comparison.row_from_runs("two", two)], "one"
    )
    by = {r.preset: r for r in rows}
    assert by["two"].speedup is None and by["two"].differs == ["processes"]
    assert "two: different processes from one: not comparable (processes 2 vs 1)." in (
        comparison.verdicts(rows, "one")
    )


@pytest.mark.unit
def test_the_default_repeats_give_a_verdict_and_help_says_so(capsys) -> None:
    from ampscope.cli.main import build_parser
    from ampscope.core.comparison import significance

    args = build_parser().parse_args(["bench"])
    assert args.repeats >= significance.MIN_REPEATS
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--help"])
    assert f"(default: {args.repeats})" in " ".join(capsys.readouterr().out.split())


@pytest.mark.unit
def test_a_run_that_ended_on_nan_shows_nan_as_its_final_loss_in_the_table() -> None:
    """Not an earlier finite loss: the shipped fp16 record went NaN at its first step."""
    example = Path(__file__).resolve().parent.parent / "ampscope" / "example_runs" / "fp16-nan"
    row = comparison.row_from_runs("fp16", [records.load_run(example)])
    assert comparison.cells(row)["loss"] == "nan at step 1"


@pytest.mark.unit
@pytest.mark.parametrize("columns", [80, 120])
def test_bench_prose_fits_the_terminal_between_words(columns: int) -> None:
    """The verdicts and the legend under bench's table are wrapped to the terminal between
    words: left to the terminal, a long verdict breaks mid-word ("interle / aved"). The words
    are the unfitted text's, in order."""
    rows = fixed_rows()
    full = comparison.render(rows, "fp32")
    fitted = comparison.render(rows, "fp32", width=columns)
    prose = fitted.rsplit("\n\n", 1)[1]
    assert all(len(line) <= columns for line in prose.splitlines()), prose
    assert prose.split() == full.rsplit("\n\n", 1)[1].split()
    assert any(line.startswith("  ") for line in prose.splitlines())  # a note's second line


def _printed(text: str, preset: str) -> tuple[float, float]:
    """The step time (ms) and speed-up a row of the text table shows."""
    line = next(ln for ln in text.splitlines() if ln.startswith(preset + " "))
    shown = re.match(rf"{preset} +([0-9.]+) ms \(.*?\) +([0-9.]+)x", line)
    assert shown is not None, line
    return float(shown[1]), float(shown[2])


@pytest.mark.unit
def test_the_printed_speedup_is_the_ratio_of_the_printed_step_times() -> None:
    """The README's own sample once printed 2.41x beside 93.8 and 45.9 ms (2.04x): the step
    time was the median of the repeats, the speed-up the geometric mean of their ratios."""
    rows = comparison.compare(
        [
            comparison.row_from_runs("fp32", runs("fp32", (37.3, 93.8, 357.7), 1000, 2.0)),
            comparison.row_from_runs("bf16", runs("bf16", (13.1, 45.9, 148.6), 1000, 2.0)),
        ],
        "fp32",
    )
    text = comparison.render(rows, "fp32")
    base_ms, _ = _printed(text, "fp32")
    bf16_ms, speedup = _printed(text, "bf16")
    assert speedup == pytest.approx(base_ms / bf16_ms, abs=0.01)
    assert "across repeats their geometric mean" in " ".join(text.split())


@pytest.mark.unit
def test_a_rows_rates_are_its_step_time_seen_per_second() -> None:
    """A row once showed 7.77 ms (the geometric mean of the repeats) beside 1.09k samples/s
    (the median repeat's, which implies 3.66 ms). Each run here does 4 samples and 2 GFLOP a
    step: the row's rates times its step time give back a step's work."""

    def run(ms: float) -> records.RunRecord:
        d = done(ms, 1000, 2.0)
        d.samples_per_s, d.tflops, d.mfu = 4 * 1000 / ms, 2e9 / ms / 1e9, 2e9 / ms / 1e9 / 50
        return record("fp32", d)

    row = comparison.row_from_runs("fp32", [run(3.66), run(7.77), run(9.0)])
    assert row.step_ms == pytest.approx((3.66 * 7.77 * 9.0) ** (1 / 3))  # 6.35 ms
    assert row.samples_per_s is not None and row.tflops is not None and row.mfu is not None
    assert row.samples_per_s * row.step_ms / 1000 == pytest.approx(4)
    assert row.tflops * 1e12 * row.step_ms / 1000 == pytest.approx(2e9)
    assert row.mfu == pytest.approx(row.tflops / 50)
    shown = comparison.cells(row)
    assert shown["step"].startswith("6.35 ms") and shown["samples"] == "630"  # 4 / 6.35 ms,
    # where the median repeat's own rate is 4 / 7.77 ms = 515 samples/s


@pytest.mark.unit
def test_a_speedup_from_fewer_repeats_than_the_step_time_says_so() -> None:
    fp16 = runs("fp16", (50.0, 50.0, 50.0, 51.0, 20.0), 1000, 2.0)
    fp16[4].done = ev.empty_done("failed", "boom")
    base = runs("fp32", (100.0, 101.0, 99.0, 100.0, 98.0), 1000, 2.0)
    base[1].done = ev.empty_done("failed", "boom")
    rows = comparison.compare(
        [comparison.row_from_runs("fp32", base), comparison.row_from_runs("fp16", fp16)], "fp32"
    )
    assert "fp16: speedup from the 3 repeats that ran in both it and fp32" in comparison.render(
        rows, "fp32"
    )


@pytest.mark.unit
def test_a_preset_given_twice_runs_once_and_bench_says_so(tmp_path: Path, capsys):
    from ampscope.cli import bench
    from ampscope.cli.main import command_args

    ran: list[str] = []

    def fake_run(name, overrides, runs_dir, on_line=None, launch=None):
        ran.append(name)
        return record(name, done(100.0, 1000, 2.0))

    args = command_args(["bench", "fp32", "fp32", "--repeats", "1", "--runs-dir", str(tmp_path)])
    code = bench.cmd_bench(args, fake_run, keep_sweep=lambda *a: tmp_path / "sweep")
    assert code == 0 and ran == ["fp32"]
    assert "fp32 given 2 times: it runs once per repeat" in capsys.readouterr().err


@pytest.mark.unit
def test_ctrl_c_before_the_first_run_finishes_says_so_and_exits_130(tmp_path: Path, capsys) -> None:
    """It ended in TypeError: 'int' object is not iterable, with nothing to compare."""
    from ampscope.cli import bench
    from ampscope.cli.main import command_args

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    argv = ["bench", "fp32", "mlp-demo", "--device", "cpu", "--runs-dir", str(tmp_path)]
    code = bench.cmd_bench(command_args(argv), interrupted)
    said = capsys.readouterr()
    assert code == 130, said.err
    assert "stopped before its first run finished" in said.err and "Traceback" not in said.err
    assert said.out == "" and not list(tmp_path.glob("*sweep*"))  # no empty table or sweep


@pytest.mark.unit
def test_sigterm_stops_the_sweep_as_ctrl_c_does_with_the_runs_done_kept(
    tmp_path: Path, capsys
) -> None:
    """'kill' or timeout(1) ended bench without a word and without the finished runs' table;
    SIGTERM now stops it as Ctrl+C does, and leaves its own handler as it found it."""
    import signal

    from ampscope.cli import bench
    from ampscope.cli.main import command_args

    def fake_run(name, overrides, runs_dir, on_line=None, launch=None):
        if name == "mlp-demo":
            os.kill(os.getpid(), signal.SIGTERM)  # arrives while the second run trains
        return record(name, done(100.0, 1000, 2.0))

    kept: list[object] = []
    argv = ["bench", "fp32", "mlp-demo", "--device", "cpu", "--runs-dir", str(tmp_path)]
    before = signal.getsignal(signal.SIGTERM)
    code = bench.cmd_bench(
        command_args(argv), fake_run, keep_sweep=lambda *a: kept.append(a) or tmp_path
    )
    said = capsys.readouterr()
    assert code == 130, said.err
    assert "fp32" in said.out and len(kept) == 1  # the run done is in the table, kept
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.unit
def test_a_stop_after_a_runs_done_line_keeps_that_finished_run_in_the_table(
    tmp_path: Path, capsys
) -> None:
    """SIGTERM right after the first run's ``done`` (its engine not yet reaped) said "bench
    stopped before its first run finished: nothing to compare" of a run that had finished."""
    from ampscope.cli import bench
    from ampscope.cli.main import command_args

    def fake_run(name, overrides, runs_dir, on_line=None, launch=None):
        run_dir = write_finished_record(runs_dir, name, median=12.0)
        for event in records.load_run(run_dir).events:
            on_line(event)
        if name == "fp32":
            raise KeyboardInterrupt  # the engine has said done; bench has not read its record
        raise AssertionError("the sweep goes on after a stop")

    kept: list[object] = []
    argv = ["bench", "fp32", "mlp-demo", "--device", "cpu", "--runs-dir", str(tmp_path)]
    code = bench.cmd_bench(
        command_args(argv), fake_run, keep_sweep=lambda *a: kept.append(a) or tmp_path
    )
    said = capsys.readouterr()
    assert code == 130 and "before its first run finished" not in said.err, said.err
    (row,) = [line for line in said.out.splitlines() if line.startswith("fp32")]
    assert "12.0 ms" in row and len(kept) == 1


@pytest.mark.unit
def test_a_stop_during_a_run_leaves_that_run_out_as_before(tmp_path: Path, capsys) -> None:
    """A run stopped under way (its ``done`` says stopped, or no ``done`` came) is not in the
    table: only runs that finished before the stop are."""
    from ampscope.cli import bench
    from ampscope.cli.main import command_args

    def fake_run(name, overrides, runs_dir, on_line=None, launch=None):
        run_dir = write_finished_record(runs_dir, name)
        for event in records.load_run(run_dir).events[:-1]:  # no done yet
            on_line(event)
        raise KeyboardInterrupt

    argv = ["bench", "fp32", "mlp-demo", "--device", "cpu", "--runs-dir", str(tmp_path)]
    code = bench.cmd_bench(command_args(argv), fake_run)
    said = capsys.readouterr()
    assert code == 130 and "stopped before its first run finished" in said.err
    assert said.out == ""


@pytest.mark.unit
def test_a_preset_that_fails_its_first_run_is_not_run_again_and_bench_exits_1(
    tmp_path: Path, capsys
) -> None:
    """A preset that failed was run again at every repeat, and bench exited 0."""
    from ampscope.cli import bench
    from ampscope.cli.main import command_args

    ran: list[str] = []

    def fake_run(name, overrides, runs_dir, on_line=None, launch=None):
        ran.append(name)
        if name == "fp16":
            return record(name, ev.empty_done("failed", "Loss became nan at step 3."))
        return record(name, done(100.0 if name == "fp32" else 60.0, 1000, 2.0))

    argv = ["bench", "fp32", "fp16", "amp-bf16", "--repeats", "3", "--runs-dir", str(tmp_path)]
    code = bench.cmd_bench(command_args(argv), fake_run, keep_sweep=lambda *a: tmp_path / "s")
    said = capsys.readouterr()
    assert code == 1
    assert ran == ["fp32", "fp16", "amp-bf16", "fp32", "amp-bf16", "fp32", "amp-bf16"]
    assert "fp16 failed on its first run: its other repeats are not run" in said.err
    counted = [line.split("]")[0] + "]" for line in said.err.splitlines() if line.startswith("[")]
    assert counted == ["[1/9]", "[2/9]", "[3/7]", "[4/7]", "[5/7]", "[6/7]", "[7/7]"]  # no gaps
    table = said.out.splitlines()
    assert next(line for line in table if line.startswith("fp16")).endswith(
        "failed: Loss became nan at step 3."
    )
    assert "fp16 failed: Loss became nan at step 3." in said.out
    assert "amp-bf16: 1.7x faster than fp32" in said.out  # the others still compared


@pytest.mark.unit
def test_a_runs_folder_that_cannot_be_made_is_refused_before_anything_runs(
    tmp_path: Path, capsys
) -> None:
    """Before: every run failed to keep its record, then keeping the sweep ended in a
    FileNotFoundError traceback."""
    from ampscope.cli import bench
    from ampscope.cli.main import command_args

    ran: list[str] = []

    def fake_run(name, overrides, runs_dir, on_line=None, launch=None):
        ran.append(name)
        return record(name, done(100.0, 1000, 2.0))

    (tmp_path / "a-file").write_text("")
    argv = ["bench", "fp32", "--repeats", "1", "--runs-dir", str(tmp_path / "a-file" / "runs")]
    code = bench.cmd_bench(command_args(argv), fake_run)
    err = capsys.readouterr().err
    assert code == 2 and ran == []
    assert f"--runs-dir {tmp_path / 'a-file' / 'runs'}: cannot create the folder" in err
    assert "is a file, not a folder" in err and "Traceback" not in err


@pytest.mark.unit
def test_a_sweep_record_that_cannot_be_written_keeps_the_table_and_says_so(
    tmp_path: Path, capsys
) -> None:
    """Before: a full disk at the end of a sweep ended in an OSError traceback."""
    from ampscope.cli import bench
    from ampscope.cli.main import command_args

    def fake_run(name, overrides, runs_dir, on_line=None, launch=None):
        return record(name, done(100.0, 1000, 2.0))

    def full_disk(*args):
        raise OSError(28, "No space left on device")

    argv = ["bench", "fp32", "--repeats", "1", "--runs-dir", str(tmp_path)]
    code = bench.cmd_bench(command_args(argv), fake_run, keep_sweep=full_disk)
    said = capsys.readouterr()
    assert code == 1 and "fp32" in said.out
    assert "the table above is not kept: the sweep record cannot be written in" in said.err
    assert "No space left on device" in said.err


@pytest.mark.unit
def test_the_sweep_records_path_is_shown_literally(tmp_path: Path, capsys) -> None:
    """Before: a runs folder named with an escape sequence reached the terminal raw in the
    'sweep record:' line, and recoloured it."""
    from ampscope.cli import bench
    from ampscope.cli.main import command_args

    def fake_run(name, overrides, runs_dir, on_line=None, launch=None):
        return record(name, done(100.0, 1000, 2.0))

    runs_dir = tmp_path / "odd\x1b[31mfolder"
    argv = ["bench", "fp32", "--repeats", "1", "--runs-dir", str(runs_dir)]
    assert bench.cmd_bench(command_args(argv), fake_run) == 0
    said = capsys.readouterr()
    assert "\x1b" not in said.err
    assert "sweep record: " + str(tmp_path) + "/odd\\x1b[31mfolder/" in said.err


@pytest.mark.unit
@pytest.mark.parametrize("fmt", [[], ["--markdown"], ["--csv"]])
def test_a_presets_path_and_a_records_error_are_shown_literally(
    fmt: list[str], tmp_path: Path, capsys
) -> None:
    """Before: a failed run's error message (from the record, as the user's code raised it) and
    a preset given as a path with an escape sequence in its name reached the terminal raw in
    bench's progress, table and verdict lines."""
    from ampscope.cli import bench
    from ampscope.cli.main import command_args
    from ampscope.core.presets import shipped_presets_dir

    odd = tmp_path / "odd\x1b[31m.toml"
    odd.write_text((shipped_presets_dir() / "fp32.toml").read_text())
    message = "ValueError: \x1b[2J gone \x1b]0;title\x07"

    def fake_run(name, overrides, runs_dir, on_line=None, launch=None):
        if name == "fp32":
            return record(name, done(100.0, 1000, 2.0))
        failed = record(name, done(100.0, 1000, 2.0, status="failed", error=message))
        failed.events = [ev.ErrorEvent(kind="exception", message=message, t=1.0)]
        return failed

    argv = ["bench", "fp32", str(odd), "--repeats", "1", "--runs-dir", str(tmp_path), *fmt]
    assert bench.cmd_bench(command_args(argv), fake_run) == 1
    said = capsys.readouterr()
    assert "\x1b" not in said.out + said.err
    assert "ValueError: \\x1b[2J gone \\x1b]0;title\\x07" in said.out
    assert "odd\\x1b[31m.toml" in said.out and "odd\\x1b[31m.toml" in said.err


@pytest.mark.unit
def test_a_row_with_one_measured_repeat_says_its_brackets_are_its_steps_spread() -> None:
    """Three repeats of fp32, but amp-bf16's last two failed: its brackets held one run's
    p10-p90 where the legend promised the fastest and slowest repeat."""
    base = runs("fp32", (100.0, 101.0, 99.0), 1000, 2.0)
    bf16 = [
        record("amp-bf16", done(42.0, 620, 2.0, p10=30.0, p90=60.0)),
        record("amp-bf16", ev.empty_done("failed", "out of memory")),
        record("amp-bf16", ev.empty_done("failed", "out of memory")),
    ]
    rows = comparison.compare(
        [comparison.row_from_runs("fp32", base), comparison.row_from_runs("amp-bf16", bf16)],
        "fp32",
    )
    text = comparison.render(rows, "fp32")
    assert "42.0 ms (30.0 ms-60.0 ms)" in text
    assert (
        "(the fastest and slowest repeat's in brackets; amp-bf16: one repeat measured, its "
        "steps' p10-p90)" in " ".join(text.split())
    )
    whole = comparison.render(
        comparison.compare([comparison.row_from_runs("fp32", base)], "fp32"), "fp32"
    )
    assert "one repeat measured" not in whole
