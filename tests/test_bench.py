"""ampscope bench: the comparison table, its exports, interleaving and the spoken verdict."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from ampscope.cli.main import main
from ampscope.core import comparison, records
from ampscope.core import events as ev
from tests.helpers import step


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


def fixed_rows() -> list[comparison.Row]:
    rows = [
        comparison.row_from_runs("fp32", [record("fp32", done(100.0, 1000, 2.000))]),
        comparison.row_from_runs("amp-bf16", [record("amp-bf16", done(41.7, 620, 2.004))]),
        comparison.row_from_runs("tf32", [record("tf32", done(99.0, 1000, 2.000, 90.0, 110.0))]),
        comparison.row_from_runs(
            "amp-fp16-noscale", [record("amp-fp16-noscale", done(45.0, 640, 2.3), 0.41)]
        ),
        comparison.row_from_runs(
            "fp16", [record("fp16", ev.empty_done("failed", "Loss became nan at step 3."))]
        ),
    ]
    return comparison.compare(rows, "fp32")


def test_verdict_is_derived_from_the_numbers() -> None:
    lines = comparison.verdicts(fixed_rows(), "fp32")
    assert "amp-bf16: 2.4x faster than fp32, 38% less peak memory, final loss within 0.2%." in lines
    assert any(line.startswith("tf32: no significant speed difference from fp32") for line in lines)
    assert (
        "amp-fp16-noscale lost 41% of its output-gradient values to underflow (exact zeros)."
        in lines
    )
    assert "fp16 failed: Loss became nan at step 3." in lines
    assert not any(line.startswith("fp32") for line in lines)


def test_baseline_speedup_is_one_and_a_failed_preset_is_a_row_with_its_reason() -> None:
    rows = {r.preset: r for r in fixed_rows()}
    assert rows["fp32"].speedup == 1.0 and rows["fp32"].mem_change == 0.0
    assert rows["fp16"].status == "failed" and "nan" in (rows["fp16"].reason or "")
    text = comparison.render(list(rows.values()), "fp32")
    header = text.splitlines()[0]
    for title, _ in comparison.COLUMNS:
        assert title in header
    assert "failed: Loss became nan" in text
    assert "1.00x" in text and "~" in text  # tf32's difference is within its spread


def test_exports_parse() -> None:
    rows = fixed_rows()
    data = json.loads(comparison.render(rows, "fp32", "json"))
    assert data["baseline"] == "fp32" and len(data["rows"]) == 5 and data["verdict"]
    table = list(csv.DictReader(io.StringIO(comparison.render(rows, "fp32", "csv"))))
    assert [r["preset"] for r in table] == [r.preset for r in rows]
    assert float(table[1]["speedup"]) > 2
    markdown = comparison.render(rows, "fp32", "markdown").splitlines()
    assert markdown[0].startswith("| preset |") and set(markdown[1]) <= {"|", "-"}


def test_repeats_are_interleaved() -> None:
    assert comparison.interleaved(["a", "b", "c"], 2) == ["a", "b", "c", "a", "b", "c"]


def test_repeats_use_the_spread_across_runs() -> None:
    runs = [record("x", done(ms, 1, 1.0)) for ms in (40.0, 50.0, 60.0)]
    row = comparison.row_from_runs("x", runs)
    assert (row.step_ms, row.spread_lo, row.spread_hi, row.runs) == (50.0, 40.0, 60.0, 3)


def test_a_real_sweep_on_the_cpu(tmp_path: Path, capsys) -> None:
    code = main(
        [
            "bench",
            "mlp-demo",
            "fp32",
            "fp16",
            "--steps",
            "6",
            "--set",
            "workload.kind='mlp'",
            "--set",
            "device='cpu'",
            "--set",
            "warmup_steps=2",
            "--runs-dir",
            str(tmp_path),
            "--json",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    data = json.loads(out)
    rows = {r["preset"]: r for r in data["rows"]}
    assert list(rows) == ["fp32", "mlp-demo", "fp16"]  # the baseline goes first
    assert rows["fp32"]["speedup"] == 1.0 and rows["mlp-demo"]["status"] == "ok"
    assert rows["fp16"]["status"] == "failed" and "nan" in rows["fp16"]["reason"].lower()
    (sweep,) = tmp_path.glob("*-sweep")
    assert json.loads((sweep / comparison.SWEEP_FILE).read_text())["order"] == [
        "fp32",
        "mlp-demo",
        "fp16",
    ]
    assert len(records.list_runs(tmp_path)) == 3


def test_unknown_preset_is_refused_before_anything_runs(tmp_path: Path, capsys) -> None:
    code = main(["bench", "fp32", "nope", "--runs-dir", str(tmp_path)])
    assert code == 2 and "Unknown preset 'nope'" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
