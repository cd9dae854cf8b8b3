"""``ampscope plan --verify``: the plan trained beside what it is measured against, on a CPU
(eager, fp8 emulated), through the command as a user runs it. Slow: each verify trains three or
four short runs in this process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ampscope.cli.main import main
from tests.helpers import ROOT

pytestmark = pytest.mark.slow

MODELS = Path(__file__).parent / "data" / "plan_models.py"
OVERFLOW = f"{ROOT / 'examples' / 'fp16_overflow.py'}:make"
STEPS = 2


def verified(capsys, tmp_path: Path, target: str, spec: str, *flags: str) -> tuple[int, dict, str]:
    code = main(
        ["plan", target, "--model", spec, *flags, "--steps", "2", "--verify", str(STEPS)]
        + ["--out", str(tmp_path)]
    )  # planned from 2 fp32 steps: the models' trouble is there from the first batch
    out, err = capsys.readouterr()
    plan = json.loads((tmp_path / "plan.json").read_text())
    return code, plan, out + err


def rows(plan: dict) -> dict[str, dict]:
    return {row["name"]: row for row in plan["verify"]}


@pytest.mark.parametrize("factory", ["make_small", "make_small_outlier"])
def test_fp8_verify_trains_the_plan_beside_bf16_every_layer_and_torchaos_filter(
    capsys, tmp_path: Path, factory: str
) -> None:
    """Four rows in order, the same steps each, the plan's run ok with a finite loss near the
    baseline's; the table and its verdicts printed; step times said to mean nothing here."""
    code, plan, text = verified(
        capsys, tmp_path, "fp8", f"{MODELS}:{factory}", "--tokens", "65536", "--gpu", "rtx 4090 d"
    )
    assert {e["decision"] for e in plan["layers"]} == {"fp8", "bf16"}
    assert code == 0
    assert [r["name"] for r in plan["verify"]] == [
        "baseline (amp-bf16)", "every layer in fp8", "torchao auto filter", "the plan"
    ]  # fmt: skip
    by = rows(plan)
    assert by["baseline (amp-bf16)"]["loss_gap"] == 0.0
    mine = by["the plan"]
    assert mine["status"] == "ok" and mine["skipped_steps"] == 0
    assert mine["final_loss"] is not None and abs(mine["loss_gap"]) < 0.1
    assert by["every layer in fp8"]["status"] == "ok"
    auto = by["torchao auto filter"]
    assert auto["status"] == "ok" or auto["verdict"].startswith("torchao auto filter: not run: ")
    assert any(
        "eager" in n and "fp8 emulated" in n and "judge the losses" in n for n in plan["notes"]
    )
    assert "verify (4 runs, same seed and batches):" in text and "the plan: " in text
    assert len(list((tmp_path / "verify").iterdir())) == sum(
        r["status"] != "not run" for r in plan["verify"]
    )


def test_the_planted_fp16_overflow_fails_in_amp_fp16_and_trains_with_the_plan(
    capsys, tmp_path
) -> None:
    """The lecture's ending: amp-fp16 skips every step and fails; the plan (amp-fp16 with
    amplify and the LayerNorm after it in fp32) trains, its loss as amp-bf16's."""
    code, plan, text = verified(capsys, tmp_path, "fp16", OVERFLOW)
    assert code == 0
    by = rows(plan)
    assert [r["name"] for r in plan["verify"]] == ["amp-fp16", "the plan", "amp-bf16"]
    assert by["amp-fp16"]["status"] == "failed" and by["amp-fp16"]["skipped_steps"] == STEPS
    assert by["amp-fp16"]["final_loss"] is None
    assert by["the plan"]["status"] == "ok" and by["the plan"]["skipped_steps"] == 0
    assert abs(by["the plan"]["loss_gap"]) < 0.02  # against amp-bf16, the baseline
    assert by["amp-bf16"]["verdict"] == "amp-bf16: the baseline."
    assert "amp-fp16 failed: " in text
