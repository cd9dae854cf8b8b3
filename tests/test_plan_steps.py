"""``ampscope plan`` watches several fp32 training steps, not the first batch alone: trouble
that comes with a later batch changes the decision, an MoE's late experts are planned like the
others, a layer no step runs is named so with the count, and ``--steps`` is checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ampscope.cli.main import main
from ampscope.core.plan.report import CastFigures, LayerPlan, RecipeNumerics
from ampscope.core.plan.steps import STEPS, merge_numerics, worst
from ampscope.engine.plan import choose_gpu, plan_fp8, plan_fp16
from ampscope.engine.plan.capture import build
from tests.data.plan_models import LATE_STEP
from tests.data.zoo import LATE_EXPERTS, LATE_FROM

DATA = Path(__file__).parent / "data"
MODELS = DATA / "plan_models.py"
ZOO = DATA / "zoo.py"
CPU = torch.device("cpu")


def fp8_layers(spec: str, steps: int, gpu: str, recipe: str = "auto") -> dict[str, LayerPlan]:
    plan, _ = plan_fp8(build(spec, CPU), choose_gpu(gpu, None), recipe, 65536, None, steps)
    assert plan.steps == steps
    return {layer.name: layer for layer in plan.layers}


def fp16_layers(spec: str, steps: int) -> dict[str, LayerPlan]:
    plan, _ = plan_fp16(build(spec, CPU), steps)
    assert plan.steps == steps
    return {layer.name: layer for layer in plan.layers}


@pytest.mark.slow
def test_an_outlier_token_from_a_later_step_rules_out_tensorwise() -> None:
    """The batches carry an outlier token from step 3 on: watched for 3 steps, ``up`` trains
    in tensorwise fp8; watched for the default 8, tensorwise flushes its input, so the layer
    stays in bf16, saying why, and auto takes the recipe that holds it."""
    spec, gpu = f"{MODELS}:make_late_outlier", "h200"
    early = fp8_layers(spec, LATE_STEP, gpu, "tensorwise")["up"]
    assert (early.decision, early.recipe) == ("fp8", "tensorwise")
    up = fp8_layers(spec, STEPS, gpu, "tensorwise")["up"]
    assert (up.decision, up.recipe) == ("bf16", None)
    assert up.deciding_cast is not None and up.deciding_cast.recipe == "tensorwise"
    assert up.reason.startswith("bf16: one token's outlier sets the tensorwise scale")
    assert up.numerics is not None and not up.numerics["tensorwise"].fits
    assert up.numerics["rowwise_with_gw_hp"].fits
    assert up.calls == STEPS  # one call a step, every step counted


@pytest.mark.unit
def test_an_fp16_overflow_from_a_later_step_keeps_the_module_in_fp32() -> None:
    """The batch grows beyond fp16's 65504 from step 3 on: 3 steps keep ``up`` in fp16, the
    default 8 keep it in fp32 and say what reached past the range."""
    early = fp16_layers(f"{MODELS}:make_late_overflow", LATE_STEP)["up"]
    assert early.decision == "fp16"
    up = fp16_layers(f"{MODELS}:make_late_overflow", STEPS)["up"]
    assert up.decision == "fp32"
    assert "its input reaches" in up.reason and "beyond fp16's 65504" in up.reason
    assert up.calls == STEPS


@pytest.mark.slow
def test_the_moes_late_experts_are_planned_and_never_called_unused() -> None:
    """The zoo's MoE routes its first tokens to experts 6 and 7 at step 4: the default 8 steps
    see them run and plan them on their own figures; 4 steps name them never called, with
    the count."""
    late = [f"experts.{e}.{fc}" for e in LATE_EXPERTS for fc in ("fc1", "fc2")]
    layers = fp8_layers(f"{ZOO}:make_moe", STEPS, "h100")
    for name in late:
        layer = layers[name]
        assert layer.calls == STEPS - LATE_FROM, name
        assert layer.gemm is not None and layer.numerics is not None, name
        assert layer.predicted_speedup is not None, name
        assert "never called" not in layer.reason, layer.reason
    modules = fp16_layers(f"{ZOO}:make_moe", STEPS)
    assert all(modules[name].calls == STEPS - LATE_FROM for name in late)
    assert all("never called" not in modules[name].reason for name in late)
    early = fp8_layers(f"{ZOO}:make_moe", LATE_FROM, "h100")
    assert [early[name].reason for name in late] == [
        f"bf16: never called in the {LATE_FROM} fp32 steps observed"
    ] * len(late)
    assert early["experts.0.fc1"].calls == LATE_FROM


@pytest.mark.unit
def test_a_layer_no_step_runs_is_named_unused_with_the_step_count() -> None:
    """The zoo's auxiliary head never runs: after all 8 steps both plans still say so."""
    fp8 = fp8_layers(f"{ZOO}:make_unused", STEPS, "h100")
    assert fp8["aux_head"].reason == "bf16: never called in the 8 fp32 steps observed"
    assert fp8["aux_head"].gemm is None and fp8["aux_head"].calls == 0
    fp16 = fp16_layers(f"{ZOO}:make_unused", STEPS)
    for name in ("aux_head", "spare"):
        assert fp16[name].reason == "fp16: never called in the 8 fp32 steps observed", name
        assert fp16[name].calls == 0
    assert fp16["head"].calls == STEPS


@pytest.mark.unit
def test_the_fp16_plan_says_why_attentions_out_proj_never_runs_as_the_fp8_plan_does() -> None:
    """nn.MultiheadAttention multiplies out_proj's weight itself: the layer is never called,
    whatever the data. The fp16 plan said only "never called in the 8 steps"."""
    out_proj = fp16_layers(f"{ZOO}:make_vit", 2)["blocks.0.attn.out_proj"]
    assert out_proj.calls == 0 and out_proj.decision == "fp16"
    assert out_proj.reason.startswith("fp16: never called in the 2 fp32 steps observed: ")
    assert "F.multi_head_attention_forward" in out_proj.reason


@pytest.mark.unit
def test_steps_merge_worst_first_and_sum_what_turned_inf() -> None:
    """A cast is as bad as its worst step (a scale is set per step): one step that flushes
    30 % makes the steps' figure 30 %, not a pooled share; inf/NaN values add up; a recipe
    fits only where it fit every step."""
    fine = CastFigures(underflow=0.001, rel_error=0.03, nonfinite=0, outlier_tokens=0, amax=2.0)
    bad = CastFigures(underflow=0.3, rel_error=0.5, nonfinite=2, outlier_tokens=1, amax=1e7)
    both = worst(worst(fine, bad), CastFigures(underflow=0.0, rel_error=0.0, nonfinite=1))
    assert (both.underflow, both.rel_error, both.nonfinite) == (0.3, 0.5, 3)
    assert (both.outlier_tokens, both.amax) == (1, 1e7)
    steps = [
        {"tensorwise": RecipeNumerics(casts={"input": fine}, fits=True)},
        {"tensorwise": RecipeNumerics(casts={"input": bad}, fits=False)},
        {"tensorwise": RecipeNumerics(casts={"input": fine}, fits=True)},
    ]
    merged = None
    for step in steps:
        merged = merge_numerics(merged, step)
    assert merged is not None and not merged["tensorwise"].fits
    assert merged["tensorwise"].casts["input"].underflow == 0.3


@pytest.mark.unit
def test_the_json_says_how_many_steps_were_watched(capsys, tmp_path: Path) -> None:
    spec = f"{ZOO}:make_moe"
    code = main(["plan", "fp8", "--model", spec, "--steps", "2", "--out", str(tmp_path), "--json"])
    out, err = capsys.readouterr()
    assert code == 0 and "measuring 2 fp32 training steps" in err
    plan = json.loads(out)
    assert plan["steps"] == 2
    late = next(layer for layer in plan["layers"] if layer["name"] == "experts.6.fc1")
    assert late["reason"] == "bf16: never called in the 2 fp32 steps observed"


@pytest.mark.unit
@pytest.mark.parametrize("value", ["0", "-3", "10001"])
def test_steps_out_of_range_is_one_paragraph_naming_it(capsys, value: str) -> None:
    code = main(["plan", "fp16", "--model", f"{ZOO}:make_moe", "--steps", value])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"ampscope: --steps {value}: ") and err.count("\n") == 1
    assert "from 1 to 10,000 (default 8)" in err and "Traceback" not in err


@pytest.mark.unit
def test_steps_is_refused_beside_a_bare_gemm(capsys) -> None:
    assert main(["plan", "fp8", "--gemm", "8192,4096,4096", "--steps", "4"]) == 2
    assert "--gemm with --steps" in capsys.readouterr().err


@pytest.mark.unit
def test_a_later_step_that_fails_is_named_with_the_steps_that_ran(capsys, tmp_path: Path) -> None:
    """Their batches fail at step 2: exit 2 naming that step, not the first, and the --steps
    that plans from the steps that ran."""
    factory = tmp_path / "late_fail.py"
    factory.write_text(
        "import torch\nfrom torch import nn\n\n"
        "def make(ctx):\n"
        "    x = torch.randn(8, 32)\n"
        "    def batches(step):\n"
        "        if step == 2:\n"
        "            raise ValueError('no batch 2 here')\n"
        "        return (x, x)\n"
        "    return {'model': nn.Linear(32, 32), 'batches': batches,\n"
        "            'loss': nn.functional.mse_loss}\n"
    )
    argv = ["plan", "fp16", "--model", f"{factory}:make", "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "fp32 step 2 failed (steps 0 to 1 ran" in err
    assert "ValueError: no batch 2 here" in err and "--steps 2 to plan from" in err
    assert main([*argv, "--steps", "2"]) == 0


@pytest.mark.unit
def test_an_fp32_loss_that_is_nan_is_refused_not_planned_as_fp16s_fault(
    capsys, tmp_path: Path
) -> None:
    """A model whose loss is NaN in fp32 itself was planned: the fp16 plan kept its module in
    fp32 'because fp16's range runs out' and wrote a preset to train."""
    factory = tmp_path / "nan_loss.py"
    factory.write_text(
        "import torch\nfrom torch import nn\n\n"
        "def make(ctx, nan_from=0):\n"
        "    x = torch.randn(8, 32)\n"
        "    def loss(out, target, seen=[0]):\n"
        "        seen[0] += 1\n"
        "        scale = float('nan') if seen[0] > nan_from else 1.0\n"
        "        return nn.functional.mse_loss(out, target) * scale\n"
        "    return {'model': nn.Linear(32, 32), 'batches': lambda step: (x, x), 'loss': loss}\n\n"
        "def make_late(ctx):\n"
        "    return make(ctx, nan_from=2)\n"
    )
    out = tmp_path / "out"
    for command in ("fp16", "fp8"):
        assert main(["plan", command, "--model", f"{factory}:make", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert "the loss of fp32 step 0 is nan (before any update)" in err
        assert "not a number format" in err and not out.exists()
    argv = ["plan", "fp16", "--model", f"{factory}:make_late", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "the loss of fp32 step 2 is nan (steps 0 to 1 were finite; --steps 2 plans" in err
    assert main([*argv, "--steps", "2"]) == 0
