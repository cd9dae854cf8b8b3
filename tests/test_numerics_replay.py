"""The first inf/NaN of a step that is not sampled: the step is run again, hooks on, and named."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from ampscope.core import comparison, records
from ampscope.core import events as ev
from ampscope.engine.lifecycle.run import EXIT_FAILED, EXIT_OK, run

MODEL = Path(__file__).parent / "data" / "skipped_numerics.py"
CPU = ["device='cpu'", "warmup_steps=0"]


def run_model(preset: str, factory: str, *overrides: str, code: int = EXIT_OK) -> list[ev.Event]:
    seen: list[ev.Event] = []
    spec = f"workload.model='{MODEL}:{factory}'"
    assert run(preset, [*CPU, spec, *overrides], record=False, on_event=seen.append) == code
    return seen


def of(seen: list[ev.Event], kind: type) -> list:
    return [e for e in seen if isinstance(e, kind)]


@pytest.mark.unit
def test_a_skipped_step_between_samples_is_run_again_and_names_the_module():
    """Step 3 is skipped and step 4, at the halved scale, is finite: only a rerun of step 3
    sees where the inf was. Training is the same as with numerics off."""
    on = run_model("amp-fp16", "make_skip", "steps=6", "numerics.every=1000")
    off = run_model("amp-fp16", "make_skip", "steps=6", "numerics.every=0")
    steps = of(on, ev.StepEvent)
    assert [s.skipped for s in steps] == [False, False, False, True, False, False]
    numerics = of(on, ev.NumericsEvent)
    assert [(e.step, e.replayed) for e in numerics] == [(0, False), (3, True)]
    replayed = numerics[1]
    assert replayed.first_nonfinite == ev.FirstNonfinite(
        step=3, module="lin", pass_="backward", dtype="float16"
    )
    assert replayed.loss_scale == 65536.0  # the scale step 3 ran with, not the halved one
    lin = next(m for m in replayed.modules if m.name == "lin")
    assert lin.gradient is not None and lin.gradient.nonfinite == 16
    loss = lambda seen: [(e.loss, e.grad_norm) for e in of(seen, ev.StepEvent)]  # noqa: E731
    assert loss(on) == loss(off)


@pytest.mark.unit
def test_an_inf_born_in_a_weight_gradient_names_that_weight():
    """Every output and output gradient is finite; lin's weight gradient overflows fp16 (a
    sum over 64 rows, computed in fp16 under autocast and cast back to the fp32 weight's)."""
    seen = run_model("amp-fp16", "make_weight_inf", "steps=4", "numerics.every=1000")
    assert [s.skipped for s in of(seen, ev.StepEvent)][:3] == [False, False, True]
    replayed = [e for e in of(seen, ev.NumericsEvent) if e.replayed]
    first = replayed[0].first_nonfinite
    assert first == ev.FirstNonfinite(
        step=2,
        module="lin",
        pass_="backward",
        source="parameter",
        parameter="weight",
        dtype="float16",
    )
    assert first.place() == "lin.weight's gradient"
    lin = next(m for m in replayed[0].modules if m.name == "lin")
    assert lin.gradient.nonfinite == 0 and lin.activation.nonfinite == 0
    assert lin.parameters["weight"].nonfinite > 0


@pytest.mark.unit
def test_without_a_scaler_an_inf_born_in_a_weight_gradient_is_named_at_its_step_and_pass():
    """Step 3's loss is finite but wlin's weight gradient overflows fp16; its update spoils the
    weight and step 4's loss is NaN. The run names step 3's backward pass, as 'ampscope
    numerics' does, not step 4's forward; training is the same as with numerics off."""
    on = run_model(
        "amp-fp16-noscale", "make_grad_inf", "steps=6", "numerics.every=1000", code=EXIT_FAILED
    )
    error = of(on, ev.ErrorEvent)[0]
    assert error.step == 4
    assert "inf/NaN first appears in wlin.weight's gradient (backward pass) at step 3." in (
        error.message
    )
    replayed = [e for e in of(on, ev.NumericsEvent) if e.replayed]
    assert [e.first_nonfinite for e in replayed] == [
        ev.FirstNonfinite(
            step=3,
            module="wlin",
            pass_="backward",
            source="parameter",
            parameter="weight",
            dtype="float16",
        )
    ]
    every = run_model(
        "amp-fp16-noscale", "make_grad_inf", "steps=6", "numerics.every=1", code=EXIT_FAILED
    )
    assert of(every, ev.ErrorEvent)[0].message == error.message
    off = run_model(
        "amp-fp16-noscale", "make_grad_inf", "steps=6", "numerics.every=0", code=EXIT_FAILED
    )
    loss = lambda seen: [(e.loss, e.grad_norm) for e in of(seen, ev.StepEvent)]  # noqa: E731
    assert loss(on) == loss(off) == loss(every) and len(loss(on)) == 5


@pytest.mark.unit
def test_a_run_whose_every_step_was_skipped_fails_and_names_where_the_inf_is(tmp_path):
    """12 steps, every one skipped, the loss finite throughout: the run never trained. It ends
    failed, not ok, naming the first inf/NaN; its bench row's status says so too."""
    seen: list[ev.Event] = []
    spec = f"workload.model='{MODEL}:make_every_skip'"
    overrides = [*CPU, spec, "steps=12", "numerics.every=1000"]
    code = run("amp-fp16", overrides, runs_dir=tmp_path, on_event=seen.append)
    assert code == EXIT_FAILED
    assert [s.skipped for s in of(seen, ev.StepEvent)] == [True] * 12
    error = of(seen, ev.ErrorEvent)[0]
    assert error.kind == "nan" and error.step == 11
    assert error.message.startswith("Every step skipped (12 of 12)")
    assert "the loss scale fell from 65536 to 16 without finding a finite step" in error.message
    assert "inf/NaN first appears in boost's gradients (backward pass) at step 0." in error.message
    done = of(seen, ev.DoneEvent)[0]
    assert done.status == "failed" and done.skipped_steps == 12 and done.error == error.message
    (record,) = [records.load_run(d) for d in tmp_path.iterdir() if d.is_dir()]
    row = comparison.row_from_runs("amp-fp16", [record])
    assert comparison.cells(row)["status"] == f"failed: {error.message}"
    unmeasured = run_model(
        "amp-fp16", "make_every_skip", "steps=12", "numerics.every=0", code=EXIT_FAILED
    )
    message = of(unmeasured, ev.ErrorEvent)[0].message
    assert message.startswith("Every step skipped (12 of 12)") and "first appears" not in message
    assert "'ampscope numerics amp-fp16', with this run's flags, names the layer" in message


@pytest.mark.unit
def test_a_run_with_some_steps_skipped_is_ok():
    """The same model's skips stop once the scale is low enough: an early skip is no failure."""
    seen = run_model("amp-fp16", "make_skip", "steps=6", "numerics.every=0")
    assert of(seen, ev.DoneEvent)[0].status == "ok"
    assert sum(s.skipped for s in of(seen, ev.StepEvent)) == 1


@pytest.mark.unit
def test_a_non_finite_loss_in_a_format_with_fp32s_range_is_not_told_to_widen_the_format():
    """The advice after a non-finite loss fits the format: fp32 and bf16 have no wider range
    to go to (lower the learning rate, clip, check the data and the loss); fp16 and fp8 do."""
    from ampscope.core import presets
    from ampscope.core.records.tally import StepTally
    from ampscope.engine.lifecycle.faults import failure
    from ampscope.engine.step.metrics import NonFiniteLoss

    def said(preset: str, *overrides: str) -> str:
        event, code = failure(
            NonFiniteLoss(7, math.inf),
            presets.load_preset(preset, list(overrides)),
            None,
            StepTally(0),
        )
        assert code == EXIT_FAILED and event.kind == "nan"
        return event.message

    for wide in ("fp32", "tf32", "amp-bf16", "bf16"):
        message = said(wide)
        assert "wider format gives no more room" in message and "use a wider" not in message
        assert "lower the learning rate" in message and "division by zero" in message
    assert "turn gradient clipping on (grad_clip = 1.0)" in said("fp32", "grad_clip=0")
    assert "clip the gradients harder (grad_clip = 1 now)" in said("fp32")
    assert "Lower the learning rate or use a wider format" in said("amp-fp16")
    assert "Lower the learning rate or use a wider format" in said("fp8-eager")


@pytest.mark.unit
def test_without_a_scaler_the_error_of_a_non_finite_loss_names_the_module():
    seen = run_model("fp32", "make_nan_loss", "steps=5", "numerics.every=1000", code=EXIT_FAILED)
    error = of(seen, ev.ErrorEvent)[0]
    assert error.kind == "nan" and error.step == 2
    assert "inf/NaN first appears in square's outputs (forward pass) at step 2" in error.message
    replayed = [e for e in of(seen, ev.NumericsEvent) if e.replayed]
    assert replayed[0].first_nonfinite == ev.FirstNonfinite(
        step=2, module="square", pass_="forward", dtype="float32"
    )


@pytest.mark.unit
def test_a_rerun_leaves_gradients_buffers_and_the_rng_as_it_found_them():
    from ampscope.engine.numerics.replay import StepKeeper, rerun

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Dropout(0.5)
    )
    x = torch.randn(8, 4)
    keeper = StepKeeper(torch.device("cpu"))
    keeper.keep(7, x, None)
    first = model(x).sum()  # the step as it ran: dropout drew its mask from the kept state
    first.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    buffers = [b.clone() for b in model.buffers()]
    torch.rand(3)  # later steps drew more: the rerun must leave the RNG where they left it
    rng = torch.get_rng_state()
    seen: list[torch.Tensor] = []

    def loss_of(step, inputs, targets):
        out = model(inputs)
        seen.append(out.detach().clone())
        return out.sum()

    rerun(model, torch.device("cpu"), keeper.find(7), float("nan"), loss_of)
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads, strict=True))
    assert all(torch.equal(b, c) for b, c in zip(model.buffers(), buffers, strict=True))
    assert torch.equal(torch.get_rng_state(), rng)
    torch.set_rng_state(keeper.find(7).cpu_rng)
    assert torch.equal(seen[0], model(x).detach())  # the same dropout mask as the step's
