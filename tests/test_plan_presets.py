"""The preset fields a plan is applied with: ``[fp8] layers`` and ``layer_recipes``, the
``rowwise_with_gw_hp`` recipe; and what the plan's capture lists (a layer called twice is one
layer; layers fp8 cannot take, with today's reasons)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from ampscope.core import presets
from ampscope.core.plan.steps import STEPS
from ampscope.core.presets.fp8_recipes import RECIPES, layers_line
from ampscope.core.workload import ModelContext
from ampscope.engine.device import DeviceInfo
from ampscope.engine.plan.capture import capture_fp8
from ampscope.engine.step import fp8
from ampscope.engine.workloads.user import UserWorkload, build_user_workload

pytestmark = pytest.mark.unit

CPU = DeviceInfo(torch.device("cpu"), "cpu", None, None, None, None)
ZOO = Path(__file__).parent / "data" / "zoo.py"


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(32, 64, bias=False), nn.Linear(64, 48), nn.Linear(48, 20), nn.Linear(20, 16)
    )


def fp8_preset(*overrides: str) -> presets.Preset:
    return presets.load_preset("fp8-tensorwise", ["fp8.emulate=true", *overrides])


def kinds(model: nn.Module) -> dict[str, str]:
    from torchao.float8.float8_linear import Float8Linear

    out = {}
    for name, module in model.named_modules():
        if isinstance(module, Float8Linear):
            gw = module.config.cast_config_input_for_grad_weight.scaling_type.value
            out[name] = (
                "gw_hp"
                if gw == "disabled"
                else module.config.cast_config_input.scaling_granularity.value
            )
    return out


def test_fp8_layers_converts_exactly_the_listed_layers_the_head_too() -> None:
    pytest.importorskip("torchao")
    model = mlp()
    report = fp8.convert_for_fp8(model, fp8_preset("fp8.layers=['1', '0']"), CPU)
    assert report is not None and report.converted == ["0", "1"]  # the model's order
    assert report.skipped == {
        "2": "48 -> 20 features, not multiples of 16",
        "3": "20 -> 16 features, not multiples of 16",
    }
    assert kinds(model) == {"0": "tensorwise", "1": "tensorwise"}
    head = mlp()
    head[3] = nn.Linear(48, 16)  # now the head can run in fp8: listed, it does, skip_head or not
    head[2] = nn.Identity()
    report = fp8.convert_for_fp8(head, fp8_preset("fp8.layers=['3']"), CPU)
    assert report is not None and report.converted == ["3"]
    assert report.skipped["0"] == "not listed in fp8.layers"


def test_layer_recipes_mix_recipes_and_the_run_says_so() -> None:
    pytest.importorskip("torchao")
    model = mlp()
    overrides = ["fp8.layers=['0', '1']", "fp8.layer_recipes={'1' = 'rowwise_with_gw_hp'}"]
    report = fp8.convert_for_fp8(model, fp8_preset(*overrides), CPU)
    assert report is not None and report.recipes == {"1": "rowwise_with_gw_hp"}
    assert kinds(model) == {"0": "tensorwise", "1": "gw_hp"}
    assert layers_line(report).startswith(
        "fp8 tensorwise + rowwise_with_gw_hp (1) emulated: 2 of 4 linear layers in fp8"
    )


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["fp8.layers=['7']"], "fp8.layers lists '7', which is not a linear layer of this model"),
        (["fp8.layers=['2']"], "fp8.layers lists '2', which cannot run in fp8: 48 -> 20 features"),
    ],
)
def test_a_listed_layer_the_model_lacks_or_cannot_convert_is_a_user_error(
    overrides: list[str], said: str
) -> None:
    pytest.importorskip("torchao")
    with pytest.raises(presets.ConfigError) as caught:
        fp8.convert_for_fp8(mlp(), fp8_preset(*overrides), CPU)
    assert said in str(caught.value) and caught.value.key == "fp8.layers"


def test_a_layer_recipe_for_an_unlisted_layer_is_refused_before_anything_is_built() -> None:
    with pytest.raises(presets.ConfigError) as caught:
        fp8_preset("fp8.layers=['0']", "fp8.layer_recipes={'1' = 'rowwise'}")
    assert "fp8.layer_recipes gives a recipe to '1', but fp8.layers does not list it" in str(
        caught.value
    )


def test_a_preset_with_layers_saves_and_loads_back(tmp_path: Path) -> None:
    preset = fp8_preset(
        "fp8.layers=['blocks.0.mlp.up']", "fp8.layer_recipes={'blocks.0.mlp.up' = 'rowwise'}"
    )
    path = tmp_path / "saved.toml"
    path.write_text(presets.to_toml(preset))
    again = presets.load_preset(str(path))
    assert again.fp8.layers == ["blocks.0.mlp.up"]
    assert again.fp8.layer_recipes == {"blocks.0.mlp.up": "rowwise"}


def test_rowwise_with_gw_hp_keeps_the_weight_gradient_in_high_precision() -> None:
    """Its forward is rowwise's (per-token input, per-output-feature weight, e4m3); its
    weight gradient is the plain matmul of the gradient and the input, no fp8 rounding, where
    rowwise's is not."""
    pytest.importorskip("torchao")
    recipe = RECIPES["rowwise_with_gw_hp"]
    assert recipe.grad_weight_high_precision and recipe.scale_per == "row"
    assert "the weight-gradient matmul in bf16" in recipe.describe()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 64, generator=g) * torch.logspace(-2, 2, 32).unsqueeze(1)
    grad = torch.randn(32, 16, generator=g)
    weights = {}
    for name in ("rowwise", "rowwise_with_gw_hp"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 16, bias=False))
        model.add_module("pad", nn.Identity())
        fp8.convert_for_fp8(model, fp8_preset(f"fp8.recipe='{name}'", "fp8.skip_head=false"), CPU)
        model(x).backward(grad)
        weights[name] = model[0].weight.grad
    exact = grad.t() @ x
    torch.testing.assert_close(weights["rowwise_with_gw_hp"], exact, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(weights["rowwise"], exact, rtol=1e-3, atol=1e-3)


class Shared(nn.Module):
    """One linear layer called twice, on two inputs of different rows."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(32, 32)
        self.head = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.proj(x)
        b = self.proj(x[: x.shape[0] // 2])
        return self.head(torch.cat([a, b]))


def workload_of(model: nn.Module, batch: tuple) -> UserWorkload:
    answer = {
        "model": model,
        "batches": lambda step: batch,
        "loss": lambda out, y: out.float().pow(2).mean(),
    }
    workload = UserWorkload(answer, "test:make", torch.device("cpu"))
    workload.prepare()
    return workload


def test_a_layer_called_twice_is_one_layer_with_both_calls() -> None:
    torch.manual_seed(0)
    capture = capture_fp8(workload_of(Shared(), (torch.randn(4, 8, 32), None)))
    facts = {f.name: f for f in capture.layers}
    assert list(facts) == ["proj", "head"]
    # leading dimensions flattened; the calls of every step observed
    assert facts["proj"].calls == [(32, 32, 32), (16, 32, 32)] * STEPS
    assert facts["head"].calls == [(48, 32, 16)] * STEPS
    assert capture.rows == 48 and capture.rows_from.startswith("the most rows")


def test_layers_fp8_cannot_take_are_listed_with_todays_reasons() -> None:
    """The zoo's ViT: nn.MultiheadAttention's q/k/v Parameter and its out_proj (never called
    as a module), the 12 -> 32 patch embedding; the zoo's unused head, never called."""
    ctx = ModelContext(torch.device("cpu"), None, 0, "fp32")
    vit = build_user_workload(f"{ZOO}:make_vit", ctx)
    vit.prepare()
    why = {f.name: f.why_not for f in capture_fp8(vit).layers}
    assert "nn.MultiheadAttention's q/k/v projection" in why["blocks.0.attn.in_proj_weight"]
    assert "F.multi_head_attention_forward" in why["blocks.0.attn.out_proj"]
    assert why["embed"] == "12 -> 32 features, not multiples of 16"
    assert why["blocks.0.fc1"] is None
    unused = build_user_workload(f"{ZOO}:make_unused", ctx)
    unused.prepare()
    why = {f.name: f.why_not for f in capture_fp8(unused).layers}
    assert why["aux_head"] == f"never called in the {STEPS} fp32 steps observed"


def test_gemms_timed_on_this_gpu_are_the_plans_speed_where_it_is_the_target() -> None:
    """On the GPU planned for, the distinct shapes (at the M planned) go to the timer, once
    each, and every figure says it was measured; planning for another GPU times nothing."""
    from ampscope.core.plan.speed import RECIPES as SPEED_RECIPES
    from ampscope.engine.plan import planner

    asked: list[list[tuple[int, int, int]]] = []

    def timer(shapes):
        asked.append(shapes)
        return {
            (shape, kernel): (1e-3, 1e-3, 1e-3) if kernel == "bf16" else (4e-4, 4e-4, 4e-4)
            for shape in shapes
            for kernel in ("bf16", "tensorwise", "rowwise")
        }

    torch.manual_seed(0)
    workload = workload_of(Shared(), (torch.randn(4, 8, 32), None))
    target = planner.choose_gpu(None, ("NVIDIA H100 80GB HBM3", (9, 0)))
    plan, _ = planner.plan_fp8(workload, target, "auto", 4800, timer)
    assert asked == [[(1600, 32, 32), (3200, 32, 32), (4800, 32, 16)]]
    assert plan.speed_source == "measured"
    assert all(layer.speed_from == "measured" for layer in plan.layers)
    assert set(plan.layers[0].speedups) == set(SPEED_RECIPES)
    assert (
        "predicted from GEMMs timed here" in plan.layers[0].reason
        or plan.layers[0].decision == "bf16"
    )
    elsewhere = planner.choose_gpu("h200", ("NVIDIA H100 80GB HBM3", (9, 0)))
    asked.clear()
    other, _ = planner.plan_fp8(workload, elsewhere, "auto", 4800, timer)
    assert asked == [] and other.speed_source == "model"
