"""``ampscope plan fp8`` on a model: torchao's six casts as torchao makes them, the planted
outlier token, the command's JSON and text, and its refusals."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path

import msgspec
import pytest
import torch

from ampscope.cli.main import main
from ampscope.core.plan import plan_layers
from ampscope.core.plan.decide import LayerFacts
from ampscope.core.plan.report import FITS_BAND, RecipeNumerics
from ampscope.core.plan.speed import datasheet_machine, find_gpu
from ampscope.engine.plan.casts import CAST_PLANS, CASTS, LayerCasts, outlier_rows, round_trip

MODELS = Path(__file__).parent / "data" / "plan_models.py"
# These models serve one fixed batch: one step shows what eight would, at an eighth of the time
# (tests/test_plan_steps.py plans trouble that only a later step brings).
HANG_S = 60.0
"""Far past what writing a plan's files takes (milliseconds): only a write that waits for
ever on a FIFO exceeds it."""
PLANNED = ["--tokens", "65536", "--gpu", "h200", "--steps", "1"]


def plan_json(capsys, tmp_path: Path, factory: str, *flags: str) -> dict:
    spec = f"{MODELS}:{factory}"
    code = main(["plan", "fp8", "--model", spec, *flags, "--out", str(tmp_path), "--json"])
    out = capsys.readouterr().out
    assert code == 0
    return json.loads(out)  # stdout is the JSON alone


def layer(plan: dict, name: str) -> dict:
    return next(entry for entry in plan["layers"] if entry["name"] == name)


# ---------------------------------------------------------------------------------------------
# The casts, against torchao's own


@pytest.mark.unit
def test_every_cast_of_every_recipe_is_torchaos_own() -> None:
    """Each cast's round trip equals torchao's (``hp_tensor_to_float8_dynamic`` with the
    recipe's config, on the tensor as torchao's linear holds it), outliers and tiny rows
    included; a GEMM a recipe keeps in high precision is torchao's DISABLED cast."""
    float8 = pytest.importorskip("torchao.float8")
    from torchao.float8.config import ScalingGranularity, ScalingType
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
    from torchao.float8.float8_training_tensor import GemmInputRole, LinearMMConfig

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 48, generator=g) * torch.logspace(-6, 2, 64).unsqueeze(1)
    x[3, :] *= 1e4  # an outlier token
    w = torch.randn(32, 48, generator=g) * torch.logspace(-3, 1, 48)
    grad = torch.randn(64, 32, generator=g) * torch.logspace(-8, 0, 64).unsqueeze(1)
    # (config attribute, the tensor torchao casts, its axiswise dim, how to compare with ours)
    torchao_casts = {
        "input": ("cast_config_input", x, -1, lambda t: t),
        "weight": ("cast_config_weight", w.t(), 0, lambda t: t.t()),
        "grad_output": ("cast_config_grad_output", grad, -1, lambda t: t),
        "weight_for_grad_input": ("cast_config_weight_for_grad_input", w.t(), -1, lambda t: t.t()),
        "input_for_grad_weight": ("cast_config_input_for_grad_weight", x, 0, lambda t: t),
        "grad_output_for_grad_weight": (
            "cast_config_grad_output_for_grad_weight",
            grad,
            0,
            lambda t: t,
        ),
    }
    ours = {"input": x, "weight": w, "grad_output": grad}
    ours |= {"weight_for_grad_input": w, "input_for_grad_weight": x}
    ours["grad_output_for_grad_weight"] = grad
    for recipe, plans in CAST_PLANS.items():
        config = float8.Float8LinearConfig.from_recipe_name(recipe)
        for cast in CASTS:
            attr, tensor, dim, back = torchao_casts[cast]
            cc = getattr(config, attr)
            mine = round_trip(ours[cast], plans[cast])
            if cc.scaling_type is ScalingType.DISABLED:
                assert plans[cast].format is None, (recipe, cast)
                assert torch.equal(mine, ours[cast])
                continue
            axiswise = cc.scaling_granularity is ScalingGranularity.AXISWISE
            theirs = hp_tensor_to_float8_dynamic(
                tensor,
                cc.target_dtype,
                LinearMMConfig(),
                gemm_input_role=GemmInputRole.INPUT,
                scaling_granularity=cc.scaling_granularity,
                axiswise_dim=dim if axiswise else None,
                round_scales_to_power_of_2=config.round_scales_to_power_of_2,
            ).to_original_precision()
            torch.testing.assert_close(mine, back(theirs), rtol=0, atol=0, msg=f"{recipe} {cast}")


@pytest.mark.unit
def test_a_casts_figures_count_what_the_cast_did() -> None:
    """underflow is the share of non-zero values that came back zero, rel_error the RMS error
    over the RMS, summed over calls; the weight counts once however often it is used."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 32, generator=g)
    x[0] *= 1e7  # one token 1e7 times the others
    casts = LayerCasts()
    casts.add("input", x)
    casts.add("input", x)  # a second call, the same input
    casts.add("weight", torch.randn(16, 32, generator=g))
    casts.add("weight", torch.zeros(16, 32))  # the same layer's weight again: not counted
    numerics = casts.numerics()
    y = round_trip(x, CAST_PLANS["tensorwise"]["input"])
    flushed = int(((x != 0) & (y == 0)).sum())
    figures = numerics["tensorwise"].casts["input"]
    assert figures.underflow == flushed / int((x != 0).sum()) and figures.underflow > 0.9
    assert figures.rel_error == pytest.approx(float((y - x).norm() / x.norm()), rel=1e-6)
    assert figures.outlier_tokens == 1 == outlier_rows(x)
    assert numerics["rowwise"].casts["input"].underflow == 0  # each token its own scale
    assert numerics["rowwise"].casts["weight"].underflow == 0  # not the zeros' weight
    assert not numerics["tensorwise"].fits and numerics["rowwise_with_gw_hp"].fits


# ---------------------------------------------------------------------------------------------
# The planted outlier token


@pytest.mark.slow
def test_a_single_outlier_token_is_found_named_and_never_given_tensorwise_or_rowwise(
    capsys, tmp_path: Path
) -> None:
    """blocks.0.mlp.up's input carries one token 1e7 times the others: tensorwise flushes most
    of the rest, rowwise holds it per token but flushes it again in its grad-weight cast,
    rowwise_with_gw_hp holds it. The plan says so, and whatever --recipe, never gives that
    layer tensorwise or rowwise, while its neighbours go to tensorwise."""
    plan = plan_json(capsys, tmp_path, "make_outlier", *PLANNED)
    up = layer(plan, "blocks.0.mlp.up")
    numerics = up["numerics"]
    assert numerics["tensorwise"]["casts"]["input"]["underflow"] > 0.9
    assert numerics["tensorwise"]["casts"]["input"]["outlier_tokens"] == 1
    assert numerics["rowwise"]["casts"]["input"]["underflow"] == 0
    assert numerics["rowwise"]["casts"]["input_for_grad_weight"]["underflow"] > 0.9
    assert not numerics["tensorwise"]["fits"] and not numerics["rowwise"]["fits"]
    assert numerics["rowwise_with_gw_hp"]["fits"]
    assert (up["decision"], up["recipe"]) == ("fp8", "rowwise_with_gw_hp")
    assert up["deciding_cast"] == {
        "recipe": "tensorwise",
        "cast": "input",
        "underflow": numerics["tensorwise"]["casts"]["input"]["underflow"],
        "nonfinite": 0,
    }
    assert "one token's outlier sets the tensorwise scale" in up["reason"]
    assert "rowwise flushes" in up["reason"] and "in the grad-weight GEMM" in up["reason"]
    assert layer(plan, "blocks.0.mlp.gate")["recipe"] == "tensorwise"  # no outlier there
    # Every --recipe: the decision is core's, from the same figures (no second step needed).
    facts = [
        LayerFacts(
            e["name"],
            e["kind"],
            [(e["gemm"]["M"] // 2048, e["gemm"]["K"], e["gemm"]["N"])],
            None,
            {r: msgspec.convert(v, RecipeNumerics) for r, v in e["numerics"].items()},
        )
        for e in plan["layers"]
    ]
    machine = datasheet_machine(find_gpu("h200"))
    for recipe in ("tensorwise", "rowwise", "rowwise_with_gw_hp", "auto"):
        decided = {p.name: p for p in plan_layers(facts, machine, recipe, factor=2048)}
        assert decided["blocks.0.mlp.up"].recipe in (None, "rowwise_with_gw_hp"), recipe
    rowwise = {p.name: p for p in plan_layers(facts, machine, "rowwise", factor=2048)}
    why = rowwise["blocks.0.mlp.up"].reason
    assert why.startswith("bf16: one token's outlier sets the rowwise per-feature scales")
    assert "rowwise_with_gw_hp holds it, at 1.10x predicted" in why


# ---------------------------------------------------------------------------------------------
# The command


@pytest.mark.slow
def test_the_plan_mixes_fp8_and_bf16_says_why_and_writes_the_contracts_json(
    capsys, tmp_path: Path
) -> None:
    """The wide MLP in fp8, the narrow k/v and the head in bf16, each with a reason, in the
    terminal; plan.json holds docs/plan.md's fields, in order."""
    code = main(
        ["plan", "fp8", "--model", f"{MODELS}:make_llama", *PLANNED, "--out", str(tmp_path)]
    )
    out, err = capsys.readouterr()
    assert code == 0
    assert "measuring one fp32 training step" in err and "measuring" not in out
    assert "blocks.0.mlp.down  65536,2048,512" in out
    assert "fp8 tensorwise" in out and "why:" in out
    assert f"train it: ampscope run {tmp_path / 'plan.toml'}" in out
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert list(plan)[:7] == [
        "version",
        "target",
        "gpu",
        "gpu_source",
        "speed_source",
        "recipe",
        "model",
    ]
    assert {"layers", "files", "verify", "notes", "tokens", "constants"} <= set(plan)
    assert (plan["target"], plan["gpu"], plan["speed_source"]) == ("fp8", "H200 SXM", "model")
    assert plan["tokens"] == {"measured": 128, "planned": 65536}
    entry = layer(plan, "blocks.0.mlp.down")
    assert set(entry) >= {
        "name",
        "kind",
        "gemm",
        "predicted_speedup",
        "numerics",
        "decision",
        "recipe",
        "reason",
    }
    assert entry["gemm"] == {"M": 65536, "K": 2048, "N": 512} and entry["kind"] == "Linear"
    assert set(entry["numerics"]) == {"tensorwise", "rowwise", "rowwise_with_gw_hp"}
    assert set(entry["numerics"]["rowwise"]["casts"]) == set(CASTS)
    decisions = {e["name"]: e["decision"] for e in plan["layers"]}
    assert decisions["blocks.0.mlp.down"] == "fp8" and decisions["blocks.0.attn.k"] == "bf16"
    assert decisions["head"] == "bf16"
    for e in plan["layers"]:
        assert e["reason"].startswith(e["decision"]) and f"{e['name']}: {e['reason']}" in " ".join(
            out.split()
        )
        if e["recipe"]:
            assert all(
                f["underflow"] <= FITS_BAND for f in e["numerics"][e["recipe"]]["casts"].values()
            )
    for key in ("preset", "torchao", "json"):
        assert Path(plan["files"][key]).is_file()


@pytest.mark.unit
def test_bare_gemm_shapes_are_planned_from_the_model_alone(capsys) -> None:
    code = main(
        [
            "plan",
            "fp8",
            "--gemm",
            "8192,4096,14336",
            "--gemm",
            "1024,1024,1024",
            "--gpu",
            "h100",
            "--recipe",
            "rowwise",
            "--json",
        ]
    )
    plan = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [e["name"] for e in plan["layers"]] == ["8192,4096,14336", "1024,1024,1024"]
    assert all(e["numerics"] is None and e["kind"] == "GEMM" for e in plan["layers"])
    assert [e["decision"] for e in plan["layers"]] == ["fp8", "bf16"]
    assert plan["layers"][0]["reason"].startswith("fp8 rowwise: ")
    assert plan["files"] == {"preset": None, "torchao": None, "torchtitan": None, "json": None}
    main(["plan", "fp8", "--gemm", "1024,1024,1024"])  # no --gpu on a CPU: assumed, and said
    assert "assumed: no GPU here; --gpu names another" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["plan", "fp8", "--gemm", "8192,4096"],
            "--gemm 8192,4096: not a GEMM shape. Accepted: M,K,N",
        ),
        (["plan", "fp8", "--gemm", "1,2,3", "--verify", "5"], "--gemm with --verify: a bare shape"),
        (
            ["plan", "fp8", "--gemm", "1,2,3", "--gpu", "h1000"],
            "--gpu h1000: not a GPU the peak table knows",
        ),
        (["plan", "fp8", "--gemm", "1,2,3", "--gpu", "v100"], "has no fp8 Tensor Cores"),
        (["plan", "fp16", "--model", "x.py:make", "--gpu", "h100"], "plan fp16 takes no --gpu"),
        (["plan", "fp8"], "plan fp8 needs a model: --model FILE.py:FUNCTION"),
        (["plan", "fp8", "--model", "missing.py:make"], "the file missing.py does not exist"),
        (
            ["plan", "fp8", "--model", f"{MODELS}:make_llama", "--tokens", "0"],
            "--tokens 0: accepted",
        ),
        (  # it planned M = 999999999999999983222784 at 1.00x after 40 s of measuring
            ["plan", "fp8", "--model", f"{MODELS}:make_llama", "--tokens", "10" + "0" * 23],
            "from 1 to 16,777,216 (the most rows a GEMM is planned at",
        ),
        (["plan", "fp8", "--model", f"{MODELS}:nope"], "nope"),
    ],
)
@pytest.mark.unit
def test_a_bad_flag_or_model_exits_2_with_one_paragraph(capsys, argv: list[str], said: str) -> None:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert said in err and err.startswith("ampscope: ") and "Traceback" not in err


NARROW_MODEL = """
import torch
import ampscope


def make(ctx):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    batches = [(torch.randn(4, 8), torch.randint(0, 4, (4,)))]
    loss = torch.nn.functional.cross_entropy
    return ampscope.Workload(model=model, batches=batches, loss=loss)
"""


@pytest.mark.unit
def test_tokens_beside_layers_fp8_cannot_take_say_why_never_that_none_ran(
    capsys, tmp_path: Path
) -> None:
    """Before: --tokens on a model whose layers all ran, none a multiple of 16, said 'no
    linear layer ran in the steps'."""
    model = tmp_path / "narrow.py"
    model.write_text(NARROW_MODEL)
    argv = ["plan", "fp8", "--model", f"{model}:make", "--steps", "1", "--tokens", "4096"]
    code = main([*argv, "--out", str(tmp_path / "plan")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "no linear layer ran" not in out
    assert "--tokens 4096: no layer fp8 can take ran in the steps" in out


@pytest.mark.unit
@pytest.mark.parametrize(
    ("out", "said"), [("file", "it is a file, not a folder"), ("file/sub", "file is a file")]
)
def test_an_out_folder_that_cannot_be_written_is_refused_before_measuring(
    capsys, tmp_path: Path, out: str, said: str
) -> None:
    """--out naming a file measured the model first and refused only when writing."""
    (tmp_path / "file").write_text("")
    code = main(["plan", "fp8", "--model", f"{MODELS}:make_llama", "--out", str(tmp_path / out)])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.startswith(f"ampscope: --out {tmp_path / out}: ") and said in captured.err
    assert "measuring" not in captured.err


@pytest.mark.unit
def test_a_fifo_where_a_plan_file_goes_is_replaced_not_waited_on(tmp_path: Path) -> None:
    """A FIFO under --out named plan.toml (or the filter, or plan.json) was opened for writing
    as a file is: that waits for a reader for ever, so the plan hung after its measuring."""
    from ampscope.core import presets
    from ampscope.core.plan import files as plan_files
    from ampscope.core.plan.report import LayerPlan, Plan

    fifos = [
        tmp_path / name
        for name in (plan_files.PRESET_FILE, plan_files.TORCHAO_FILE, plan_files.JSON_FILE)
    ]
    for fifo in fifos:
        os.mkfifo(fifo)
    layers = [
        LayerPlan(
            name="fc", kind="Linear", gemm=None, calls=1, predicted_speedup=None, speedups={},
            speed_from=None, numerics=None, decision="fp8", recipe="rowwise",
            deciding_cast=None, reason="",
        )
    ]  # fmt: skip
    plan = Plan(target="fp8", gpu=None, gpu_source=None, speed_source=None, recipe="rowwise",
                model=f"{MODELS}:make_llama", tokens=None, layers=layers)  # fmt: skip
    where = plan_files.Where(cuda=False, fp8_hardware=False)
    failed: list[BaseException] = []

    def write() -> None:
        try:
            plan_files.write(plan, tmp_path, "plan-fp8-fc", where, ["fc"])
        except BaseException as exc:  # noqa: BLE001 - the test's to report
            failed.append(exc)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    thread.join(HANG_S)
    stuck = thread.is_alive()
    while thread.is_alive():  # a writer stuck on a FIFO is let go: a reader comes and goes
        for fifo in fifos:
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        thread.join(0.1)
    assert not stuck and not failed, failed
    assert all(fifo.is_file() for fifo in fifos)
    assert presets.load_preset(str(tmp_path / plan_files.PRESET_FILE)).name == "plan-fp8-fc"
    assert json.loads((tmp_path / plan_files.JSON_FILE).read_text())["layers"][0]["name"] == "fc"
