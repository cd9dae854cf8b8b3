"""The last line of an fp8 plan reads as a sentence when nothing goes to fp8: a U-Net with no
nn.Linear printed "0 of 0 layers in fp8, the rest in bf16.", a small Llama whose layers are
all slower in fp8 "0 of 15 layers in fp8, the rest in bf16."."""

from __future__ import annotations

import pytest

from ampscope.core import events as ev
from ampscope.core.plan.report import LayerPlan, Plan
from ampscope.core.plan.text import render


def plan(layers: list[LayerPlan]) -> Plan:
    return Plan(
        target="fp8",
        gpu="H100 SXM",
        gpu_source="--gpu h100",
        speed_source="model",
        recipe="auto",
        model="unet.py:make",
        tokens=None,
        layers=layers,
        steps=8,
    )


def layer(name: str, decision: str, recipe: str | None = None) -> LayerPlan:
    return LayerPlan(
        name=name,
        kind="Linear",
        gemm=None,
        calls=8,
        predicted_speedup=None,
        speedups={},
        speed_from=None,
        numerics=None,
        decision=decision,
        recipe=recipe,
        deciding_cast=None,
        reason="bf16: predicted 0.92x",
    )


@pytest.mark.unit
def test_a_model_without_linear_layers_is_told_why_nothing_is_planned():
    text = render(plan([]), width=100)
    assert "0 of 0" not in text and "the rest in bf16" not in text
    assert (
        "No linear layer to plan: fp8 training converts nn.Linear layers only, so the preset "
        "trains amp-bf16." in text
    )


@pytest.mark.unit
def test_a_plan_with_no_fp8_layer_says_all_are_bf16():
    text = render(plan([layer("q", "bf16"), layer("k", "bf16")]), width=100)
    assert "No layer in fp8: all 2 in bf16." in text
    assert "the rest" not in text


@pytest.mark.unit
def test_a_mixed_plan_keeps_its_count_and_recipes():
    text = render(plan([layer("q", "fp8", "tensorwise"), layer("k", "bf16")]), width=100)
    assert "1 of 2 layers in fp8 (tensorwise 1), the rest in bf16." in text


@pytest.mark.unit
def test_a_baseline_that_failed_is_said_to_have_failed_not_named_the_baseline() -> None:
    """A failed amp-bf16 read 'amp-bf16: the baseline.' above rows compared with nothing."""
    from ampscope.core.plan.proof import Outcome, verify_rows
    from tests.test_bench import done, record

    failed = record("amp-bf16", ev.empty_done("failed", "Loss became nan at step 2."))
    trained = record("plan", done(10.0, 1000, 2.0))
    base, plan = verify_rows(
        [Outcome("amp-bf16", "amp-bf16", failed), Outcome("plan", "plan.toml", trained)],
        "amp-bf16",
    )
    assert base.verdict == (
        "amp-bf16: the baseline, failed: Loss became nan at step 2; no row is compared with it."
    )
    ok = verify_rows(
        [Outcome("amp-bf16", "amp-bf16", record("amp-bf16", done(9.0, 1000, 2.0)))], "amp-bf16"
    )
    assert ok[0].verdict == "amp-bf16: the baseline."
