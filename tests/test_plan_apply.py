"""The plan applied: its preset, its ``module_filter_fn`` and its ``filter_fqns`` each convert
exactly the layers it planned, in their recipes, as torchao itself converts them
(``isinstance(module, Float8Linear)`` after ``convert_to_float8_training``).

The model is Llama-shaped (tests/data/plan_models.py), planned for 65536 tokens a step on an
H200: the plan mixes fp8 (tensorwise and rowwise_with_gw_hp) and bf16, so each form has
layers to convert and layers to leave.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import msgspec
import pytest
import torch
from torch import nn

from ampscope.cli.main import main
from ampscope.core import presets
from ampscope.core.plan import plan_layers
from ampscope.core.plan.decide import LayerFacts
from ampscope.core.plan.files import substring_clash, torchao_text, torchtitan_text
from ampscope.core.plan.report import LayerPlan, Plan, RecipeNumerics
from ampscope.core.plan.speed import datasheet_machine, find_gpu
from ampscope.core.workload import ModelContext
from ampscope.engine.device import DeviceInfo
from ampscope.engine.step import fp8
from ampscope.engine.workloads.user import build_user_workload

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("plan-apply")]

SPEC = f"{Path(__file__).parent / 'data' / 'plan_models.py'}:make_llama"
CPU = DeviceInfo(torch.device("cpu"), "cpu", None, None, None, None)


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> tuple[dict, Path]:
    pytest.importorskip("torchao")
    out = tmp_path_factory.mktemp("plan")
    code = main(
        # one fixed batch a step: one step shows what eight would, at an eighth of the time
        ["plan", "fp8", "--model", SPEC, "--tokens", "65536", "--gpu", "h200", "--steps", "1"]
        + ["--out", str(out)]
    )
    assert code == 0
    return json.loads((out / "plan.json").read_text()), out


def fresh_model() -> nn.Module:
    return build_user_workload(SPEC, ModelContext(torch.device("cpu"), None, 0, "fp32")).model


def converted(model: nn.Module) -> dict[str, str]:
    """Each Float8Linear by name, with the recipe its config is."""
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.float8_linear import Float8Linear

    recipes = {
        r: Float8LinearConfig.from_recipe_name(r)
        for r in ("tensorwise", "rowwise", "rowwise_with_gw_hp")
    }
    out = {}
    for name, module in model.named_modules():
        if isinstance(module, Float8Linear):
            config = module.config
            out[name] = next(
                r
                for r, c in recipes.items()
                if c.cast_config_input == config.cast_config_input
                and c.cast_config_input_for_grad_weight == config.cast_config_input_for_grad_weight
                and c.cast_config_weight_for_grad_input == config.cast_config_weight_for_grad_input
            )
    return out


def plan_of(plan: dict) -> dict[str, str]:
    return {e["name"]: e["recipe"] for e in plan["layers"] if e["decision"] == "fp8"}


def load_file(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_plan_mixes_recipes_and_bf16(planned) -> None:
    plan, _ = planned
    chosen = plan_of(plan)
    assert set(chosen.values()) == {"tensorwise", "rowwise_with_gw_hp"}
    assert {"blocks.0.attn.k", "blocks.0.attn.v", "head"}.isdisjoint(chosen)
    assert plan["files"]["torchtitan"] is None  # mixed: torchtitan converts with one recipe
    assert any("mixes recipes, and torchtitan converts with one" in n for n in plan["notes"])


def test_the_preset_trains_exactly_the_planned_layers(planned) -> None:
    """``ampscope run plan.toml`` loads it and converts the planned layers, each in its
    recipe, the rest left nn.Linear (with the reason 'not listed in fp8.layers')."""
    plan, out = planned
    preset = presets.load_preset(str(out / "plan.toml"), ["device='cpu'"])
    assert preset.precision == "fp8" and preset.fp8.emulate and preset.compile == "off"
    model = fresh_model()
    report = fp8.convert_for_fp8(model, preset, CPU)
    assert report is not None
    assert converted(model) == plan_of(plan)
    assert report.skipped["blocks.0.attn.k"] == "not listed in fp8.layers"


def test_torchaos_module_filter_fns_convert_exactly_the_planned_layers(planned) -> None:
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    plan, out = planned
    written = load_file(out / "torchao_fp8_filter.py")
    model = fresh_model()
    for recipe, keep in written.FILTERS.items():  # one module_filter_fn per recipe
        config = Float8LinearConfig.from_recipe_name(recipe)
        convert_to_float8_training(model, config=config, module_filter_fn=keep)
    assert converted(model) == plan_of(plan)
    helped = written.convert(fresh_model(), emulate=True)
    assert converted(helped) == plan_of(plan)


def test_torchtitans_filter_fqns_convert_exactly_the_planned_layers(planned) -> None:
    """A single-recipe plan of the same figures (--recipe tensorwise): torchtitan's rule (an
    nn.Linear with dimensions multiples of 16 whose name holds none of filter_fqns) converts
    the planned layers and no other."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    plan, out = planned
    single = replan(plan, "tensorwise")
    assert len(single.recipes()) == 1 and single.fp8_layers
    model = fresh_model()
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    text, why = torchtitan_text(single, linears)
    assert why is None and text is not None
    path = out / "titan_single.py"
    path.write_text(text)
    titan = load_file(path)
    assert titan.RECIPE_NAME == "tensorwise"

    def torchtitan_filter(module: nn.Module, fqn: str) -> bool:
        if not isinstance(module, nn.Linear):
            return False
        sixteen = module.weight.shape[0] % 16 == 0 and module.weight.shape[1] % 16 == 0
        return sixteen and not any(f in fqn for f in titan.FILTER_FQNS)

    config = Float8LinearConfig.from_recipe_name(titan.RECIPE_NAME)
    convert_to_float8_training(model, config=config, module_filter_fn=torchtitan_filter)
    assert converted(model) == {layer.name: "tensorwise" for layer in single.fp8_layers}


def test_an_exclusion_that_is_part_of_a_planned_name_writes_no_filter_fqns() -> None:
    """torchtitan matches by substring: excluding the head 'out' would exclude the planned
    'blocks.0.out' too, so the list is not written, and the note says which."""
    layers = [
        LayerPlan(
            name=name, kind="Linear", gemm=None, calls=1, predicted_speedup=None, speedups={},
            speed_from=None, numerics=None, decision=decision, recipe=recipe,
            deciding_cast=None, reason="",
        )
        for name, decision, recipe in (("blocks.0.out", "fp8", "rowwise"), ("out", "bf16", None))
    ]  # fmt: skip
    plan = Plan(target="fp8", gpu=None, gpu_source=None, speed_source=None, recipe="rowwise",
                model=None, tokens=None, layers=layers)  # fmt: skip
    assert substring_clash(["out"], ["blocks.0.out"]) == ("out", "blocks.0.out")
    text, why = torchtitan_text(plan, ["blocks.0.out", "out"])
    assert text is None
    assert why is not None and "excluding 'out' would exclude the planned 'blocks.0.out'" in why
    assert substring_clash(["blocks.1.mlp.up"], ["blocks.11.mlp.up"]) is None


def test_a_model_path_with_quotes_stays_inside_the_written_files_docstrings() -> None:
    """The files' docstrings name the model's path: one holding three double quotes ended
    the docstring, and the rest of the path was code in a file the user imports."""
    import ast

    spec = 'x"""; import os; os.system("id"); """ \\ \x1b.py:make'
    layer = LayerPlan(
        name="fc", kind="Linear", gemm=None, calls=1, predicted_speedup=None, speedups={},
        speed_from=None, numerics=None, decision="fp8", recipe="rowwise",
        deciding_cast=None, reason="",
    )  # fmt: skip
    plan = Plan(target="fp8", gpu=None, gpu_source=None, speed_source=None, recipe="rowwise",
                model=spec, tokens=None, layers=[layer])  # fmt: skip
    titan, _ = torchtitan_text(plan, ["fc", "head"])
    for text in (torchao_text(plan), titan):
        assert text is not None
        tree = ast.parse(text)  # was a SyntaxError, or worse: valid code from the path
        doc = ast.get_docstring(tree) or ""
        assert doc.startswith('The fp8 plan of x""";') and "\\x1b.py:make" in doc
        assert not any(isinstance(node, ast.Name) and node.id == "os" for node in ast.walk(tree))


def replan(plan: dict, recipe: str) -> Plan:
    """The same measured figures decided for another --recipe (core's decision alone)."""
    factor = plan["tokens"]["planned"] / plan["tokens"]["measured"]
    facts = [
        LayerFacts(
            e["name"],
            e["kind"],
            [(round(e["gemm"]["M"] / factor), e["gemm"]["K"], e["gemm"]["N"])] if e["gemm"] else [],
            None if e["numerics"] else "cannot",
            {r: msgspec.convert(v, RecipeNumerics) for r, v in e["numerics"].items()}
            if e["numerics"]
            else None,
        )
        for e in plan["layers"]
    ]
    machine = datasheet_machine(find_gpu("h200"))
    layers = plan_layers(facts, machine, recipe, factor)
    return Plan(target="fp8", gpu=machine.name, gpu_source="", speed_source="model",
                recipe=recipe, model=SPEC, tokens=None, layers=layers)  # fmt: skip


def test_on_the_zoos_vit_the_filters_leave_multihead_attentions_out_proj_alone() -> None:
    """nn.MultiheadAttention's out_proj is an nn.Linear that never runs as a module: a filter
    that lets it through would convert it for nothing. With the ViT's fc1 layers planned (its
    widths pay nowhere, so they are set here), torchao's filter, torchtitan's list and the
    preset convert the fc1 layers alone."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    zoo = f"{Path(__file__).parent / 'data' / 'zoo.py'}:make_vit"
    ctx = ModelContext(torch.device("cpu"), None, 0, "fp32")

    def vit() -> nn.Module:
        return build_user_workload(zoo, ctx).model

    model = vit()
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert "blocks.0.attn.out_proj" in linears
    chosen = {"blocks.0.fc1", "blocks.1.fc1"}
    layers = [
        LayerPlan(
            name=n, kind="Linear", gemm=None, calls=1, predicted_speedup=None, speedups={},
            speed_from=None, numerics=None, decision="fp8" if n in chosen else "bf16",
            recipe="tensorwise" if n in chosen else None, deciding_cast=None, reason="",
        )
        for n in linears
    ]  # fmt: skip
    plan = Plan(target="fp8", gpu=None, gpu_source=None, speed_source=None, recipe="tensorwise",
                model=zoo, tokens=None, layers=layers)  # fmt: skip
    text, why = torchtitan_text(plan, linears)
    assert why is None and text is not None and "'blocks.0.attn.out_proj'," in text
    namespace: dict = {}
    exec(text, namespace)  # noqa: S102 - the file written, run as torchtitan would import it
    config = Float8LinearConfig.from_recipe_name("tensorwise")
    convert_to_float8_training(
        model,
        config=config,
        module_filter_fn=lambda m, fqn: (
            isinstance(m, nn.Linear) and not any(f in fqn for f in namespace["FILTER_FQNS"])
        ),
    )
    assert set(converted(model)) == chosen
    from ampscope.core.plan.files import torchao_text

    namespace = {}
    exec(torchao_text(plan), namespace)  # noqa: S102
    other = vit()
    convert_to_float8_training(other, config=config, module_filter_fn=namespace["module_filter_fn"])
    assert set(converted(other)) == chosen
    preset = presets.load_preset(
        "fp8-tensorwise", ["fp8.emulate=true", f"fp8.layers={sorted(chosen)}"]
    )
    third = vit()
    fp8.convert_for_fp8(third, preset, CPU)
    assert set(converted(third)) == chosen
