"""The preset's ``[optimizer]`` table: AdamW fused, foreach or per tensor, as asked, validated,
and an error in a ``--set`` that names the ``--set``."""

from __future__ import annotations

import pytest

from ampscope.core import presets
from ampscope.core.presets.optimizer import implementation
from tests.helpers import FAST, cli

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("sets", "fused", "foreach"),
    [
        ([], None, None),  # a CPU: torch's default, per tensor
        (["optimizer.fused=true"], True, None),
        (["optimizer.foreach=true"], None, True),
        (["optimizer.fused=false", "optimizer.foreach=false"], False, False),
    ],
)
def test_adamw_gets_the_flags_the_preset_asks_for(sets, fused, foreach) -> None:
    import torch

    from ampscope.engine.step.precision import precision_policy
    from ampscope.engine.step.setup import make_optimizer

    preset = presets.load_preset("fp32", [*FAST, *sets])
    model = torch.nn.Linear(4, 4)
    optimizer = make_optimizer(model, preset, precision_policy(preset, on_cuda=False))
    assert (optimizer.defaults["fused"], optimizer.defaults["foreach"]) == (fused, foreach)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()  # torch takes the flags on this device


def test_auto_is_fused_on_cuda_and_torchs_default_elsewhere() -> None:
    auto = presets.load_preset("fp32").optimizer
    assert implementation(auto, on_cuda=True, auto_fused=True) == "fused"
    assert implementation(auto, on_cuda=True, auto_fused=False) == "foreach"  # sharded scaler
    assert implementation(auto, on_cuda=False, auto_fused=False) == "per-tensor"
    foreach = presets.load_preset("fp32", ["optimizer.foreach=true"]).optimizer
    assert implementation(foreach, on_cuda=True, auto_fused=True) == "foreach"


def test_a_run_trains_with_fused_adamw_on_a_cpu() -> None:
    from ampscope.engine.lifecycle.run import EXIT_OK, run

    sets = [*FAST, "steps=3", "workload.width=16", "batch_size=4", "optimizer.fused=true"]
    assert run("fp32", sets, record=False, on_event=lambda e: None) == EXIT_OK


def test_fused_and_foreach_together_are_refused(capsys) -> None:
    said = cli(
        capsys, "run", "fp32", "--steps", "1", "--set", "optimizer.fused=true",
        "--set", "optimizer.foreach=true",
    )  # fmt: skip
    assert said.returncode == 2 and "Traceback" not in said.stderr
    assert said.stderr.startswith(
        "ampscope: --set optimizer.foreach=true: optimizer.fused = true and optimizer.foreach "
        "= true cannot both be set"
    )


def test_fused_beside_a_sharded_scaler_is_refused() -> None:
    with pytest.raises(presets.ConfigError, match="fused AdamW cannot take the sharded scaler"):
        presets.load_preset("amp-fp16", ["parallel.strategy='fsdp2'", "optimizer.fused=true"])
    presets.load_preset("amp-bf16", ["parallel.strategy='fsdp2'", "optimizer.fused=true"])


def test_an_unknown_table_from_a_set_names_the_set_not_the_shipped_preset(capsys) -> None:
    """'.../ampscope/presets/fp32.toml: unknown field 'optimizer'' read as if the shipped
    file were wrong."""
    said = cli(capsys, "run", "fp32", "--steps", "1", "--set", "optimiser.fused=true")
    assert said.returncode == 2
    assert said.stderr.startswith(
        "ampscope: --set optimiser.fused=true: unknown field 'optimiser'. Did you mean 'optimizer'?"
    )
    assert "fp32.toml" not in said.stderr
    bad = cli(capsys, "run", "fp32", "--steps", "1", "--set", "optimizer.fused=yes")
    assert bad.returncode == 2
    assert "--set optimizer.fused=yes" in bad.stderr and "true or false or 'auto'" in bad.stderr
