"""The fp16 verdict says what the measured run itself shows: a gradient beyond fp16's range
that autocast held in fp32 in an amp-fp16 run without any inf/NaN skipped no step (a Hugging
Face Llama's embedding gradient under amp-fp16 reaches 2.2e5 and the run skips none)."""

from __future__ import annotations

import json

import pytest

from ampscope.core import events as ev
from ampscope.core.numerics.report import NumericsSummary, verdict


def shares(over: float) -> dict[str, dict[str, float | None]]:
    zero = {"overflow": 0.0, "underflow": 0.0, "scaled_underflow": None}
    return {"fp16": {**zero, "overflow": over}, "bf16": zero, "e4m3": zero, "e5m2": zero}


def summary(dtype: str, loss_scale: float | None, first_nonfinite: dict | None) -> NumericsSummary:
    """One step of one embedding whose output gradient reaches 2.2e5, held in ``dtype``."""
    gradient = {"numel": 100, "amax": 2.2e5, "min_nonzero": 1e-3, "nonfinite": 0}
    small = {"numel": 100, "amax": 0.3, "min_nonzero": 1e-3, "nonfinite": 0}
    event = {
        "type": "numerics",
        "step": 0,
        "loss_scale": loss_scale,
        "modules": [
            {
                "name": "embed",
                "kind": "Embedding",
                "activation": {**small, "formats": shares(0.0), "dtype": "float32"},
                "gradient": {**gradient, "formats": shares(0.01), "dtype": dtype},
            }
        ],
        "modules_total": 1,
        "modules_idle": {},
        "first_nonfinite": first_nonfinite,
        "v": 1,
        "t": 0.0,
    }
    decoded = ev.decode(json.dumps(event))
    assert isinstance(decoded, ev.NumericsEvent)
    out = NumericsSummary()
    out.add(decoded)
    return out


@pytest.mark.unit
def test_an_fp32_gradient_in_a_clean_amp_fp16_run_is_not_said_to_skip_steps():
    said = verdict(summary("float32", 65536.0, None), "fp16")
    assert said.startswith("fp16: embed's gradients reach 2.2e5, beyond fp16's 65504")
    assert "will skip" not in said
    assert "autocast held it in fp32 and no inf/NaN came, so amp-fp16 skipped no step" in said


@pytest.mark.unit
@pytest.mark.parametrize(
    ("dtype", "loss_scale", "first_nonfinite"),
    [
        ("float32", None, None),  # measured in fp32: a forecast for amp-fp16
        ("float16", 65536.0, None),  # held in fp16 itself
        ("float32", 65536.0, {"step": 3, "module": "embed", "pass": "backward"}),
    ],
)
def test_the_forecast_stays_where_the_run_does_not_contradict_it(
    dtype, loss_scale, first_nonfinite
):
    said = verdict(summary(dtype, loss_scale, first_nonfinite), "fp16")
    assert "amp-fp16 will skip" in said
