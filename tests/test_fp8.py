"""FP8 training through torchao: presets, refusals, which layers run in fp8, and emulated training.

The numbers are checked against an fp8 round trip written here with torch's own casts (scale
by max/amax, saturate, cast, scale back), so a recipe that used another format or another
scaling would fail, not just a crash.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from torch import nn

from ampscope.cli.console import ConsoleReporter
from ampscope.cli.main import main
from ampscope.core import events as ev
from ampscope.core import presets
from ampscope.core.formats import catalog
from ampscope.core.memory import measured, plan
from ampscope.core.presets.fp8_recipes import INSTALL_HINT, RECIPES, layers_line
from ampscope.engine.device import DeviceInfo
from ampscope.engine.lifecycle.parts import Parts
from ampscope.engine.lifecycle.run import EXIT_OK, EXIT_USAGE, run
from ampscope.engine.step import fp8
from ampscope.engine.step import setup as engine_setup
from ampscope.engine.step.validation import Facts, read_facts
from ampscope.engine.workloads import build_workload
from ampscope.tui.model.run_state import RunState
from tests.helpers import hello

CPU = DeviceInfo(torch.device("cpu"), "AMD EPYC 7B13", None, None, None, None)
TORCH_DTYPES = {"fp8-e4m3fn": torch.float8_e4m3fn, "fp8-e5m2": torch.float8_e5m2}
# A run that takes seconds on two CPU cores: the small gpt, a small batch, emulated fp8.
EMULATED = ["device='cpu'", "compile='off'", "fp8.emulate=true", "batch_size=8"]
SMALL_GPT_LINEARS = [f"blocks.{i}.{n}" for i in (0, 1) for n in ("qkv", "proj", "fc", "out")]


def gpu(name: str, capability: tuple[int, int]) -> DeviceInfo:
    return DeviceInfo(torch.device("cuda", 0), name, capability, 80 << 30, 700.0, None)


def fp8_preset(recipe: str = "tensorwise", *overrides: str) -> presets.Preset:
    return presets.load_preset(f"fp8-{recipe}", list(overrides))


def of(events: list, kind: type) -> list:
    return [e for e in events if isinstance(e, kind)]


# ---------------------------------------------------------------------------------------------
# Presets and the [fp8] table


@pytest.mark.unit
def test_fp8_presets_say_what_their_names_say() -> None:
    for name, recipe, compiled in (
        ("fp8-tensorwise", "tensorwise", True),
        ("fp8-rowwise", "rowwise", True),
        ("fp8-eager", "tensorwise", False),
    ):
        preset = presets.load_preset(name)
        assert preset.precision == "fp8" and preset.fp8.recipe == recipe
        assert (preset.compile != "off") == compiled
        assert not preset.fp8.emulate and preset.fp8.skip_head
    names = [p.name for p in presets.list_presets()]
    assert names.index("compile-max-autotune") < names.index("fp8-tensorwise")


@pytest.mark.unit
def test_an_unknown_recipe_names_the_accepted_ones(capsys) -> None:
    code = main(["run", "fp8-rowwise", "--no-record", "--set", "fp8.recipe='blockwise'"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE
    assert "fp8.recipe" in err and "'tensorwise' | 'rowwise'" in err and "Traceback" not in err


@pytest.mark.unit
def test_an_edited_fp8_preset_saves_and_loads_back(tmp_path: Path) -> None:
    preset = fp8_preset("rowwise", "fp8.emulate=true", "fp8.skip_head=false")
    saved = tmp_path / "mine.toml"
    saved.write_text(presets.to_toml(preset))
    again = presets.load_preset(str(saved))
    assert again.fp8 == preset.fp8 and again.precision == "fp8"


# ---------------------------------------------------------------------------------------------
# Refusals: exit 2, one paragraph naming the capability or the package


@pytest.mark.unit
@pytest.mark.parametrize(
    "info,named",
    [
        (CPU, "the CPU (AMD EPYC 7B13)"),
        (gpu("NVIDIA A100-SXM4-80GB", (8, 0)), "NVIDIA A100-SXM4-80GB has compute capability 8.0"),
        (gpu("Tesla T4", (7, 5)), "Tesla T4 has compute capability 7.5"),
        (gpu("NVIDIA A10", (8, 6)), "NVIDIA A10 has compute capability 8.6"),
    ],
)
def test_a_device_without_fp8_tensor_cores_is_refused(info: DeviceInfo, named: str) -> None:
    with pytest.raises(presets.ConfigError) as caught:
        fp8.require_support(fp8_preset().fp8, info, has_torchao=True)
    message = str(caught.value)
    assert named in message and "8.9 or newer" in message
    assert "--set fp8.emulate=true" in message and "amp-bf16" in message
    assert "torchao" not in message and "\n" not in message


@pytest.mark.unit
@pytest.mark.parametrize("capability", [(8, 9), (9, 0), (10, 0)])
def test_ada_hopper_and_blackwell_pass(capability: tuple[int, int]) -> None:
    fp8.require_support(fp8_preset().fp8, gpu("NVIDIA H100 80GB HBM3", capability), True)


@pytest.mark.unit
def test_emulation_needs_no_fp8_hardware_but_does_need_torchao() -> None:
    emulated = fp8_preset("rowwise", "fp8.emulate=true").fp8
    fp8.require_support(emulated, CPU, has_torchao=True)
    with pytest.raises(presets.ConfigError) as caught:
        fp8.require_support(emulated, CPU, has_torchao=False)
    message = str(caught.value)
    assert INSTALL_HINT in message and "pip install 'ampscope[fp8]'" in message
    assert "capability" not in message and "amp-bf16" in message


@pytest.mark.unit
def test_no_fp8_hardware_and_no_torchao_names_both() -> None:
    with pytest.raises(presets.ConfigError) as caught:
        fp8.require_support(fp8_preset().fp8, CPU, has_torchao=False)
    message = str(caught.value)
    assert "the CPU" in message and "ampscope[fp8]" in message
    assert "--set fp8.emulate=true once torchao is installed" in message


@pytest.mark.unit
def test_ampscope_run_on_the_cpu_exits_2_with_the_paragraph(capsys) -> None:
    code = main(["run", "fp8-eager", "--no-record", "--device", "cpu", "--steps", "2"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ampscope: precision = 'fp8'"), err
    assert "this run's device is the CPU" in err and "--set fp8.emulate=true" in err


@pytest.mark.unit
def test_a_gpu_below_8_9_is_refused_before_anything_is_built() -> None:
    a100 = gpu("NVIDIA A100-SXM4-40GB", (8, 0))
    on_an_a100 = Parts(resolve_device=lambda spec, ranks=None: a100)
    seen: list[ev.Event] = []
    code = run("fp8-tensorwise", [], record=False, on_event=seen.append, parts=on_an_a100)
    (error,) = of(seen, ev.ErrorEvent)
    assert code == EXIT_USAGE and error.kind == "config"
    assert "NVIDIA A100-SXM4-40GB has compute capability 8.0" in error.message
    assert not of(seen, ev.HelloEvent) and of(seen, ev.DoneEvent)[0].status == "failed"


@pytest.mark.unit
def test_a_token_count_not_a_multiple_of_16_is_refused_before_building(capsys) -> None:
    """torch._scaled_mm needs batch x sequence rows in multiples of 16, not only the weights."""
    h100 = gpu("NVIDIA H100 80GB HBM3", (9, 0))
    built: list[object] = []
    parts = Parts(
        resolve_device=lambda spec, ranks=None: h100, make_workload=lambda *a: built.append(a)
    )
    # what `ampscope run fp8-tensorwise --no-record --set batch_size=3 --set
    # workload.seq_len=100 --steps 2` prints
    sets = ["batch_size=3", "workload.seq_len=100", "steps=2"]
    code = run("fp8-tensorwise", sets, record=False, on_event=ConsoleReporter(), parts=parts)
    err = capsys.readouterr().err
    assert code == EXIT_USAGE and not built, err
    assert "batch_size x workload.seq_len = 3 x 100 = 300" in err
    assert "batch_size = 4 or workload.seq_len = 112" in err and "fp8.emulate=true" in err


@pytest.mark.unit
def test_token_counts_that_fit_pass_and_emulation_needs_none() -> None:
    h100 = gpu("NVIDIA H100 80GB HBM3", (9, 0))
    fp8.require_token_multiple(fp8_preset("tensorwise", "batch_size=3"), h100)  # 3 x 1024
    odd = fp8_preset("tensorwise", "batch_size=3", "workload.seq_len=100")
    with pytest.raises(presets.ConfigError):
        fp8.require_token_multiple(odd, h100)
    emulated = fp8_preset("tensorwise", "batch_size=3", "workload.seq_len=100", "fp8.emulate=true")
    fp8.require_fp8_support(emulated, CPU)


@pytest.mark.unit
def test_without_torchao_the_run_says_how_to_install_it() -> None:
    def no_torchao(info: DeviceInfo, grouped: bool) -> Facts:
        return dataclasses.replace(read_facts(info, grouped), has_torchao=False)

    seen: list[ev.Event] = []
    parts = Parts(facts=no_torchao)
    code = run("fp8-rowwise", EMULATED, record=False, on_event=seen.append, parts=parts)
    (error,) = of(seen, ev.ErrorEvent)
    assert code == EXIT_USAGE and error.kind == "config"
    assert "torchao" in error.message and "pip install 'ampscope[fp8]'" in error.message


# ---------------------------------------------------------------------------------------------
# Which layers run in fp8


@pytest.mark.unit
def test_the_head_and_layers_not_multiples_of_16_stay_in_bf16() -> None:
    dims = {"layers": 2, "width": 64, "heads": 4, "seq_len": 16, "vocab": 1024}
    gpt = build_workload("gpt", dims, 2, torch.device("cpu"), 0).model
    converted, skipped = fp8.choose_layers(gpt, skip_head=True)
    assert converted == SMALL_GPT_LINEARS and list(skipped) == ["head"]
    converted, skipped = fp8.choose_layers(gpt, skip_head=False)
    assert converted == [*SMALL_GPT_LINEARS, "head"] and not skipped
    odd = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 48), nn.Linear(48, 10))
    converted, skipped = fp8.choose_layers(odd, skip_head=True)
    assert converted == ["2"]
    assert skipped == {
        "0": "20 -> 32 features, not multiples of 16",
        "3": "the output head (fp8.skip_head = true)",
    }


@pytest.mark.unit
def test_a_model_with_nothing_to_convert_is_a_user_error() -> None:
    pytest.importorskip("torchao")
    model = nn.Sequential(nn.Linear(20, 30), nn.Linear(30, 10))
    with pytest.raises(presets.ConfigError) as caught:
        fp8.convert_for_fp8(model, fp8_preset("tensorwise", "fp8.emulate=true"), CPU)
    assert "none of this workload's linear layers" in str(caught.value)
    assert "0: 20 -> 30 features" in str(caught.value)


# ---------------------------------------------------------------------------------------------
# The recipes' formats: torchao, the explorer and the planner agree


def fp8_round_trip(t: torch.Tensor, key: str, dim: int | None, power_of_two: bool) -> torch.Tensor:
    """t cast to fp8 and back with a dynamic scale (max / amax), per tensor or along ``dim``."""
    dtype = TORCH_DTYPES[key]
    fmax = torch.finfo(dtype).max
    amax = t.abs().amax() if dim is None else t.abs().amax(dim=dim, keepdim=True)
    scale = (fmax / amax.double().clamp(min=1e-12)).float()
    if power_of_two:
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    return (t.float() * scale).clamp(-fmax, fmax).to(dtype).float() / scale


@pytest.mark.unit
def test_recipes_match_torchao_and_the_explorer() -> None:
    float8 = pytest.importorskip("torchao.float8")
    for name, recipe in RECIPES.items():
        config = float8.Float8LinearConfig.from_recipe_name(name)
        used = {
            "input": config.cast_config_input.target_dtype,
            "weight": config.cast_config_weight.target_dtype,
            "grad_output": config.cast_config_grad_output.target_dtype,
        }
        assert used == {k: TORCH_DTYPES[v] for k, v in recipe.formats.items()}, name
        assert config.round_scales_to_power_of_2 == recipe.power_of_two_scales
        per_row = config.cast_config_input.scaling_granularity.value == "axiswise"
        assert (recipe.scale_per == "row") == per_row
        kept = config.cast_config_input_for_grad_weight.scaling_type.value == "disabled"
        assert recipe.grad_weight_high_precision == kept, name
        for key in recipe.formats.values():  # the explorer's format is torch's format
            assert catalog.FORMATS[key].max == torch.finfo(TORCH_DTYPES[key]).max


@pytest.mark.unit
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_a_converted_layer_computes_with_the_recipes_formats(recipe: str) -> None:
    pytest.importorskip("torchao")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32, bias=False), nn.Linear(32, 16))
    report = fp8.convert_for_fp8(model, fp8_preset(recipe, "fp8.emulate=true"), CPU)
    assert report is not None and report.converted == ["0"] and list(report.skipped) == ["1"]
    x = (torch.randn(24, 64) * torch.logspace(-2, 2, 24).unsqueeze(1)).requires_grad_()
    y = model[0](x)
    grad = torch.randn_like(y)
    y.backward(grad)

    r = RECIPES[recipe]
    rows = r.scale_per == "row"
    w = model[0].weight.detach()
    xq = fp8_round_trip(x.detach(), r.input, -1 if rows else None, r.power_of_two_scales)
    wq = fp8_round_trip(w, r.weight, 1 if rows else None, r.power_of_two_scales)
    torch.testing.assert_close(y.detach(), xq @ wq.t(), rtol=1e-5, atol=1e-6)
    assert (y.detach() - x.detach() @ w.t()).abs().max() > 1e-3  # fp8 rounding did happen

    def grad_input(grad_format: str) -> torch.Tensor:
        gq = fp8_round_trip(grad, grad_format, -1 if rows else None, r.power_of_two_scales)
        return gq @ fp8_round_trip(w, r.weight, 0 if rows else None, r.power_of_two_scales)

    torch.testing.assert_close(x.grad, grad_input(r.grad_output), rtol=1e-5, atol=1e-6)
    other = "fp8-e5m2" if r.grad_output == "fp8-e4m3fn" else "fp8-e4m3fn"
    assert not torch.allclose(x.grad, grad_input(other), rtol=1e-5, atol=1e-6)


@pytest.mark.unit
def test_the_planner_follows_the_recipe() -> None:
    assert plan.workload_from_preset("fp8-tensorwise").regime == "fp8"
    assert plan.workload_from_preset("fp8-rowwise").regime == "fp8-rowwise"
    tensorwise, rowwise = plan.plan_regime(10**9, "fp8"), plan.plan_regime(10**9, "fp8-rowwise")
    assert (tensorwise.label, rowwise.label) == ("fp8 tensorwise", "fp8 rowwise")
    assert "e5m2 gradients" in tensorwise.note and "one scale per tensor" in tensorwise.note
    assert "e4m3 activations, weights and gradients" in rowwise.note
    assert "power-of-two scale per row" in rowwise.note and "e5m2" not in rowwise.note
    # Same bytes: fp32 master state as AMP, weights cast to fp8 (1 byte) one layer at a time.
    assert tensorwise.train_bpp == rowwise.train_bpp == 16 and rowwise.cast_bpp == 1
    assert rowwise.inference_bpp == 1


# ---------------------------------------------------------------------------------------------
# Training: emulated fp8 on the CPU


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_emulated_fp8_trains_the_small_gpt(recipe: str, tmp_path: Path) -> None:
    pytest.importorskip("torchao")
    seen: list[ev.Event] = []
    code = run(f"fp8-{recipe}", [*EMULATED, "steps=8"], runs_dir=tmp_path, on_event=seen.append)
    assert code == EXIT_OK, of(seen, ev.ErrorEvent)
    (hi,) = of(seen, ev.HelloEvent)
    assert hi.fp8 is not None and hi.fp8.recipe == recipe and hi.fp8.emulate
    assert hi.fp8.converted == SMALL_GPT_LINEARS and list(hi.fp8.skipped) == ["head"]
    assert hi.compute_dtype == "fp32"  # emulated fp8 matmuls are fp32 matmuls
    losses = [s.loss for s in of(seen, ev.StepEvent)]
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.5

    baseline: list[ev.Event] = []  # the same weights and batch in amp-bf16, one forward
    run(
        "amp-bf16",
        [*EMULATED[:2], "batch_size=8", "steps=1"],
        record=False,
        on_event=baseline.append,
    )
    first = of(baseline, ev.StepEvent)[0].loss
    assert losses[0] != first and losses[0] == pytest.approx(first, rel=1e-3)

    record = next(tmp_path.iterdir())
    expected = "fp8" if recipe == "tensorwise" else "fp8-rowwise"
    assert measured.compare_run(record).regime == expected


@pytest.mark.unit
def test_the_dashboard_and_the_console_say_how_many_layers_run_in_fp8() -> None:
    layers = ev.Fp8Layers(
        recipe="rowwise", emulate=False, converted=SMALL_GPT_LINEARS, skipped={"head": "x"}
    )
    state = RunState(label="fp8-rowwise")
    state.ingest(hello(preset="fp8-rowwise", config={"precision": "fp8", "steps": 8}, fp8=layers))
    assert "fp8 rowwise 8/9 linear" in state.header()
    line = layers_line(layers)
    assert line.startswith("fp8 rowwise: 8 of 9 linear layers in fp8")
    assert "e4m3 activations, weights and gradients" in line
    plain = RunState(label="amp-bf16")
    plain.ingest(hello(preset="amp-bf16", config={"precision": "amp-bf16", "steps": 8}))
    assert "amp-bf16" in plain.header() and "linear" not in plain.header()


@pytest.mark.subprocess
def test_doctor_says_whether_fp8_training_is_installed(capsys) -> None:
    from ampscope.cli.doctor import doctor as print_doctor
    from ampscope.engine.machine import doctor

    def with_torchao(version: str | None):
        return lambda try_compile: doctor.machine_report(try_compile, torchao=lambda: version)

    assert print_doctor(report_of=with_torchao(None)) == 0
    assert "fp8 training: torchao is not installed (pip install 'ampscope[fp8]'" in (
        capsys.readouterr().out
    )
    assert print_doctor(report_of=with_torchao("0.18.0")) == 0
    assert "fp8 training: torchao 0.18.0" in capsys.readouterr().out


@pytest.mark.unit
def test_nothing_to_convert_in_a_users_model_names_their_layers_not_workload_width(
    tmp_path,
) -> None:
    pytest.importorskip("torchao")
    model = nn.Sequential(nn.Linear(20, 30), nn.Linear(30, 10))
    (tmp_path / "m.py").write_text("def make(ctx): ...\n")
    spec = f'workload.model="{tmp_path / "m.py"}:make"'
    with pytest.raises(presets.ConfigError) as caught:
        fp8.convert_for_fp8(model, fp8_preset("tensorwise", "fp8.emulate=true", spec), CPU)
    assert "workload.width" not in str(caught.value)
    assert "give your model's linear layers dimensions that are multiples of 16" in str(
        caught.value
    )


REAL_MODELS = Path(__file__).parent / "data" / "real_models.py"


@pytest.mark.slow
def test_a_vit_on_multihead_attention_counts_only_the_layers_that_run_in_fp8() -> None:
    """nn.MultiheadAttention multiplies out_proj.weight itself and keeps q/k/v in a bare
    Parameter: swapped for fp8 layers, its out_proj never ran (forward hooks on the converted
    layers during the first step show it), yet the line once said 9 of 10 layers in fp8."""
    pytest.importorskip("torchao")
    from ampscope.engine.lifecycle.loop import train_step

    preset = presets.load_preset(
        "fp8-eager", [*EMULATED, f"workload.model='{REAL_MODELS}:vit'", "batch_size=16"]
    )
    s = engine_setup.build(preset, CPU)
    assert s.fp8 is not None
    ran: set[str] = set()
    for name, module in s.workload.model.named_modules():
        if type(module).__name__ == "Float8Linear":
            module.register_forward_hook(lambda *_a, name=name: ran.add(name))
    train_step(s, 0, False)
    # the reference: what the first step called, of the layers torchao converted
    assert ran == set(s.fp8.converted) and len(ran) == 7  # patch + 2 MLP layers x 3 blocks
    mha_out = [f"blocks.{i}.attn.out_proj" for i in range(3)]
    assert all("never called" in s.fp8.skipped[n] for n in mha_out)
    assert "in_proj_weight" in next(iter(k for k in s.fp8.skipped if "blocks.0.attn.in" in k))
    line = layers_line(s.fp8)
    assert line.startswith("fp8 tensorwise emulated: 7 of 14 linear layers in fp8")
    assert (
        "blocks.0.attn.out_proj, blocks.1.attn.out_proj and 1 more: nn.MultiheadAttention" in line
    )
    assert "head: the output head" in line
