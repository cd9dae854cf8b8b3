"""``ampscope plan fp16`` and the preset field it writes, ``fp32_modules``: the planted overflow
that makes amp-fp16 skip every step trains once its layers stay in fp32 (the lecture's
ending, docs/lecture.md step 7; trained in tests/test_plan_verify.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from ampscope.cli.main import main
from ampscope.core import events as ev
from ampscope.core import presets
from ampscope.engine.lifecycle.run import EXIT_USAGE, run
from ampscope.engine.step.fp32_modules import keep_in_fp32
from tests.helpers import ROOT

pytestmark = pytest.mark.unit

OVERFLOW = f"{ROOT / 'examples' / 'fp16_overflow.py'}:make"
ZOO = Path(__file__).parent / "data" / "zoo.py"
CPU = ["device='cpu'", "numerics.every=0", "warmup_steps=0"]


def plan16(capsys, out: Path, spec: str) -> dict:
    code = main(["plan", "fp16", "--model", spec, "--out", str(out), "--json"])
    assert code == 0
    return json.loads(capsys.readouterr().out)


def test_the_planted_overflow_and_the_layer_that_takes_it_stay_in_fp32(capsys, tmp_path) -> None:
    """amplify's outputs reach about 2e5: it stays in fp32, and so does the LayerNorm whose
    input that is (fed in fp32 to an op in fp16 it would overflow there); the rest is fp16."""
    plan = plan16(capsys, tmp_path, OVERFLOW)
    decisions = {e["name"]: e["decision"] for e in plan["layers"]}
    assert decisions == {
        "inp": "fp16",
        "amplify": "fp32",
        "norm": "fp32",
        "hidden": "fp16",
        "head": "fp16",
    }
    amplify = next(e for e in plan["layers"] if e["name"] == "amplify")
    output = amplify["numerics"]["fp16"]["casts"]["output"]
    assert (
        output["amax"] > 65504
        and output["overflow"] > 0
        and not amplify["numerics"]["fp16"]["fits"]
    )
    assert amplify["reason"].startswith("fp32: its output reaches 2.")
    assert "beyond fp16's 65504" in amplify["reason"]
    preset = presets.load_preset(plan["files"]["preset"])
    assert preset.precision == "amp-fp16" and preset.fp32_modules == ["amplify", "norm"]
    assert plan["files"]["torchao"] is None and plan["files"]["torchtitan"] is None


def test_an_overflow_in_the_models_own_forward_points_to_amp_bf16(capsys, tmp_path) -> None:
    """The zoo's root_overflow multiplies by its own 1e5-scaled matrix in the root's forward:
    no module holds the product, so no fp32_modules can; the plan says so and writes amp-bf16."""
    plan = plan16(capsys, tmp_path, f"{ZOO}:make_root_overflow")
    assert any("outside every submodule" in n and "amp-bf16" in n for n in plan["notes"])
    assert plan["preset_precision"] == "amp-bf16"
    assert presets.load_preset(plan["files"]["preset"]).precision == "amp-bf16"


class Overflowing(nn.Module):
    """A container whose own code (no submodule) overflows fp16: x @ big."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(16, 16)
        self.big = nn.Parameter(torch.full((16, 16), 1e4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh((self.inner(x) @ self.big) / 1e6)


def test_fp32_modules_computes_those_modules_in_fp32_under_autocast() -> None:
    """Inside a kept module autocast is off and floating inputs are fp32; the others still
    compute in the autocast format. A container's own matmul is kept with it."""
    model = nn.Sequential(nn.Linear(16, 16), Overflowing(), nn.Linear(16, 4))
    x = torch.randn(8, 16)
    seen = {}
    for name, module in model.named_modules():
        if name:
            module.register_forward_hook(
                lambda m, a, out, name=name: seen.__setitem__(name, out.dtype)
            )
    with torch.autocast("cpu", dtype=torch.float16):
        assert torch.isnan(model(x)).any() or seen["1"] == torch.float16
    keep_in_fp32(model, ["1"], "cpu")
    seen.clear()
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
    assert seen == {
        "0": torch.float16,
        "1.inner": torch.float32,
        "1": torch.float32,
        "2": torch.float16,
    }
    assert torch.isfinite(out).all()


def test_fp32_modules_refuses_names_the_model_lacks_and_non_amp_presets() -> None:
    model = nn.Sequential(nn.Linear(4, 4))
    model.add_module("amplify", nn.Linear(4, 4))
    with pytest.raises(presets.ConfigError) as unknown:
        keep_in_fp32(model, ["amplfy"], "cpu")
    message = str(unknown.value)
    assert "fp32_modules names 'amplfy', which is not a module of this model." in message
    assert "Did you mean 'amplify'?" in message and "'ampscope plan fp16' writes" in message
    with pytest.raises(presets.ConfigError) as pure:
        presets.load_preset("fp16", ["fp32_modules=['amplify']"])
    assert "precision = 'fp16' runs no autocast" in str(pure.value)


def test_an_unknown_fp32_module_is_exit_2_with_its_paragraph(tmp_path) -> None:
    seen: list[ev.Event] = []
    spec = f'workload.model="{OVERFLOW}"'
    code = run(
        "amp-fp16",
        [spec, *CPU, "steps=1", "fp32_modules=['amplfy']"],
        runs_dir=tmp_path,
        on_event=seen.append,
    )
    assert code == EXIT_USAGE
    (error,) = [e for e in seen if isinstance(e, ev.ErrorEvent)]
    assert "Did you mean 'amplify'?" in error.message and error.kind == "config"


def test_a_model_path_with_control_characters_is_planned_and_run(capsys, tmp_path) -> None:
    """Before: a model file whose name held an escape character made plan fp16 write its raw
    ESC into the preset's first comment, and reading the preset back raised a traceback;
    'run --model' with it looked for a function named 'make"'."""
    odd = tmp_path / "fp16\x1b[31m\nover.py"
    odd.write_text((ROOT / "examples" / "fp16_overflow.py").read_text())
    spec = f"{odd}:make"
    plan = plan16(capsys, tmp_path / "out", spec)
    preset = tmp_path / "out" / "plan.toml"
    assert plan["model"] == spec
    assert presets.load_preset(str(preset)).workload.model == spec
    assert "fp16\\x1b[31m\\nover.py:make" in preset.read_text().splitlines()[0]
    from ampscope.core.presets.workload_spec import model_override

    assert presets.load_preset("fp32", [model_override(spec)]).workload.model == spec


def test_a_model_path_that_is_not_utf8_is_refused_before_anything_runs(
    tmp_path: Path, capsys
) -> None:
    # the plan's files name the model's file, and TOML and Python hold only text: a Latin-1
    # name ended on a UnicodeEncodeError traceback once the files were written
    model = tmp_path / os.fsdecode(b"mod\xe8le.py")
    model.write_text("def make(ctx):\n    raise AssertionError('never built')\n")
    out = tmp_path / "plan"
    assert main(["plan", "fp16", "--model", f"{model}:make", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ampscope: --model ") and "not UTF-8 text" in err
    assert "Traceback" not in err and "never built" not in err
    assert not out.exists()
