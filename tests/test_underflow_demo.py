"""The underflow demonstration: ``loss_divisor`` makes every gradient that many times smaller
(the loss reported is the true one), fp16 without a loss scale flushes the small ones to
zero, a GradScaler keeps them, and the loss shows the difference."""

from __future__ import annotations

import pytest

from ampscope.core import presets
from ampscope.core.presets.errors import ConfigError

SMALL = ["device='cpu'", "workload.width=64", "warmup_steps=0"]


def first_step(preset: str, *overrides: str) -> tuple[float, float, float]:
    """(loss, gradient norm before clipping, grad zeros) of step 0, trained in this process."""
    from ampscope.engine.device import resolve_device
    from ampscope.engine.lifecycle.loop import train_step
    from ampscope.engine.step.setup import build

    s = build(presets.load_preset(preset, [*SMALL, *overrides]), resolve_device("cpu"))
    metrics, _ = train_step(s, 0, measure_zeros=True)
    loss, norm, _before, _after, zeros = metrics.tolist()
    return loss, norm, zeros


@pytest.mark.unit
def test_the_divisor_divides_the_gradients_and_leaves_the_loss_as_it_is() -> None:
    """In fp32, d(L / 4096) = dL / 4096 exactly (a power of two): the gradient norm is
    4096 times smaller, the loss reported the same."""
    loss, norm, _ = first_step("underflow-demo", "precision='fp32'", "loss_divisor=1")
    divided_loss, divided_norm, _ = first_step("underflow-demo", "precision='fp32'")
    assert divided_loss == loss
    assert divided_norm * 4096 == pytest.approx(norm, rel=1e-6)


@pytest.mark.unit
def test_fp16_without_a_scale_flushes_the_small_gradients_and_a_gradscaler_keeps_them() -> None:
    """With the preset's 4096, step 0's output gradients for the wrong classes are about
    1/(16 x 256 x 4096) = 6e-8, fp16's smallest subnormal: they flush as the model grows
    confident (18 % by step 20). With 65536 they are 4e-9 from step 0: the 15 wrong classes
    of 16 flush without a scale, none with the GradScaler's 65536, none in bf16 (fp32's
    exponent range)."""
    tiny = "loss_divisor=65536"
    _, _, lost = first_step("underflow-demo", tiny)
    _, _, scaled = first_step("underflow-demo-scaled", tiny)
    _, _, bf16 = first_step("underflow-demo", tiny, "precision='amp-bf16'")
    assert lost == pytest.approx(15 / 16, abs=0.02) and scaled == bf16 == 0.0, (lost, scaled, bf16)


@pytest.mark.unit
def test_a_divisor_below_one_is_refused_with_the_field_named() -> None:
    with pytest.raises(ConfigError) as caught:
        presets.load_preset("underflow-demo", ["loss_divisor=0.5"])
    assert "loss_divisor" in str(caught.value)


@pytest.mark.slow
def test_losing_the_small_gradients_costs_the_loss_within_80_steps() -> None:
    """What the presets' descriptions promise, already by step 80 (of the 200 a lecture runs):
    the unscaled run's loss is more than twice the scaled run's (measured 1.49 against 0.385;
    0.385 against 0.113 at step 200), and the scaled run's is fp32's within 20 % (0.385)."""
    from ampscope.engine.device import resolve_device
    from ampscope.engine.lifecycle.loop import train_step
    from ampscope.engine.step.setup import build

    def final_loss(preset: str, *overrides: str) -> float:
        s = build(presets.load_preset(preset, ["device='cpu'", *overrides]), resolve_device("cpu"))
        losses = [train_step(s, i, measure_zeros=False)[0][0].item() for i in range(80)]
        return sum(losses[-10:]) / 10

    lost = final_loss("underflow-demo")
    scaled = final_loss("underflow-demo-scaled")
    fp32 = final_loss("underflow-demo", "precision='fp32'")
    assert lost > 2 * scaled, (lost, scaled)
    assert scaled == pytest.approx(fp32, rel=0.2), (scaled, fp32)
