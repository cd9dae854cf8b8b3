"""What ``mon.step(loss)`` does with a loss that is not one number: one step is told about, the
rest of the run is recorded as before."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import torch

import ampscope
from ampscope.core import events as ev
from ampscope.core import records
from ampscope.watching import WatchWarning
from tests.helpers import events_of, tiny_model

pytestmark = pytest.mark.unit


class Unprintable(Exception):
    def __str__(self) -> str:
        raise ZeroDivisionError("its __str__ fails too")


class Floatless:
    """A loss-like object of a user's whose float() and repr() both raise."""

    def __float__(self) -> float:
        raise Unprintable()

    def __repr__(self) -> str:
        raise Unprintable()


def run_steps(tmp_path: Path, steps: list[dict], precision: str | None = None) -> tuple[Path, list]:
    """A loop of len(steps) real steps whose ``mon.step`` is given ``steps[i]`` (its ``loss``,
    or the step's own loss where none or None); the run folder and the WatchWarnings raised."""
    model, opt = tiny_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ampscope.watch(model, opt, runs_dir=tmp_path, precision=precision) as mon:
            for figures in steps:
                loss = model(torch.randn(8, 32)).square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                given = dict(figures)
                value = given.pop("loss", None)
                mon.step(loss if value is None else value, **given)
    return mon.run_dir, [w for w in caught if issubclass(w.category, WatchWarning)]


def run_with(tmp_path: Path, losses: list, precision: str | None = None) -> tuple[Path, list]:
    """``run_steps`` handing ``losses[i]`` (or its own loss, for None) and samples=8."""
    return run_steps(tmp_path, [{"loss": loss, "samples": 8} for loss in losses], precision)


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        ("abc", "a str ('abc')"),
        (1j, "a complex (1j)"),
        (10**400, "an int too large for a float"),
        (True, "a bool (True)"),  # was recorded as a loss of 1.0
        (torch.tensor(True), "a bool tensor (torch.bool)"),  # a comparison, not a loss
        # its __float__ raised an exception whose str() raises too: that exception reached
        # the user's loop from ampscope's own warning, and no later step was recorded
        (Floatless(), "a Floatless whose float() raised Unprintable"),
    ],
    ids=["str", "complex", "huge-int", "bool", "bool-tensor", "float-raises"],
)
def test_a_loss_of_the_wrong_type_costs_one_step_not_the_rest(tmp_path, bad, said) -> None:
    run_dir, caught = run_with(tmp_path, [None, bad, None, None, bad, None])
    run = records.load_run(run_dir)
    steps = [e for e in run.events if isinstance(e, ev.StepEvent)]
    assert [s.step for s in steps] == list(range(6))  # every step is recorded
    assert [s.loss is None for s in steps] == [False, True, False, False, True, False]
    assert run.status == "ok" and run.done is not None and run.done.steps_done == 6
    assert run.done.loss_final == pytest.approx(steps[-1].loss)
    (warning,) = [w for w in events_of(run_dir, ev.WarningEvent) if w.code == "loss-unreadable"]
    assert warning.step == 1  # said once, where it began
    assert said in warning.message and "takes a tensor or a real number" in warning.message
    assert [w for w in caught if said in str(w.message)]  # on stderr too
    assert not events_of(run_dir, ev.ErrorEvent)


ODD_TENSORS = {
    "meta": (lambda: torch.tensor(1.0, device="meta"), "a tensor on the meta device"),
    "sparse": (lambda: torch.tensor([1.0, 2.0]).to_sparse(), "a sparse_coo tensor"),
    "sparse-csr": (lambda: torch.eye(2).to_sparse_csr(), "a sparse_csr tensor"),
    "nested": (
        lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged),
        "a nested tensor",
    ),
    "quantized": (
        lambda: torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8),
        "a quantized tensor (torch.qint8)",
    ),
}


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch's own: sparse CSR is beta, and so on
@pytest.mark.parametrize("kind", list(ODD_TENSORS))
def test_a_tensor_no_number_can_be_read_from_costs_one_step_not_the_rest(tmp_path, kind) -> None:
    """A meta, sparse, nested or quantized tensor given as the loss (or tokens=, grad_norm=)
    stopped the recording of every later step: its .item() or mean raised inside ampscope."""
    make, said = ODD_TENSORS[kind]
    steps = [{}, {"loss": make()}, {"tokens": make()}, {"grad_norm": make()}, {}]
    run_dir, caught = run_steps(tmp_path, steps)
    run = records.load_run(run_dir)
    recorded = [e for e in run.events if isinstance(e, ev.StepEvent)]
    assert [s.step for s in recorded] == list(range(5))  # every step is recorded
    assert [s.loss is None for s in recorded] == [False, True, False, False, False]
    assert recorded[2].tokens_per_s is None and recorded[3].grad_norm is None
    assert run.status == "ok" and run.done is not None and run.done.steps_done == 5
    warnings_said = [w.message for w in events_of(run_dir, ev.WarningEvent)]
    assert any(f"Step 1's loss is {said}" in m for m in warnings_said)
    assert any(f"Step 2's tokens= is {said}" in m for m in warnings_said)
    assert any(f"Step 3's grad_norm= is {said}" in m for m in warnings_said)
    assert not [w for w in caught if "no longer recorded" in str(w.message)]


def test_a_loss_that_is_no_scalar_is_said_and_its_mean_recorded(tmp_path) -> None:
    run_dir, caught = run_with(tmp_path, [torch.ones(3), torch.tensor([2.0, 4.0]), None])
    steps = events_of(run_dir, ev.StepEvent)
    assert [s.loss for s in steps[:2]] == [1.0, 3.0]
    (warning,) = [w for w in events_of(run_dir, ev.WarningEvent) if w.code == "loss-not-scalar"]
    assert warning.step == 0 and "shape (3,), not a scalar" in warning.message
    assert "records the mean of its 3 elements" in warning.message
    assert any("not a scalar" in str(w.message) for w in caught)


def test_an_empty_or_complex_tensor_is_no_loss(tmp_path) -> None:
    run_dir, _ = run_with(tmp_path, [torch.tensor([]), torch.tensor(1j), None])
    steps = events_of(run_dir, ev.StepEvent)
    assert [s.loss is None for s in steps] == [True, True, False]
    messages = [w.message for w in events_of(run_dir, ev.WarningEvent)]
    assert any("an empty tensor" in m for m in messages)
    assert any("a complex tensor (torch.complex64)" in m for m in messages)
    assert not events_of(run_dir, ev.ErrorEvent)  # the empty one's mean is no NaN loss


@pytest.mark.parametrize("precision", ["fp32", None])
def test_a_nan_loss_in_fp32_is_the_losss_own_not_a_range_issue(tmp_path, precision) -> None:
    run_dir, _ = run_with(tmp_path, [None, math.nan, None], precision=precision)
    (error,) = events_of(run_dir, ev.ErrorEvent)
    assert (error.kind, error.step) == ("nan", 1)
    assert "the loss itself is NaN" in error.message and "no range issue" in error.message
    assert "left the format's range" not in error.message


def test_a_nan_loss_under_fp16_autocast_still_points_at_the_range(tmp_path) -> None:
    run_dir, _ = run_with(tmp_path, [None, math.nan], precision="amp-fp16")
    (error,) = events_of(run_dir, ev.ErrorEvent)
    assert "left the format's range" in error.message


def test_an_inf_loss_in_fp32_is_not_told_to_use_a_wider_format(tmp_path) -> None:
    """fp32 is as wide as training goes: the advice is the learning rate, clipping, the data."""
    run_dir, _ = run_with(tmp_path, [None, math.inf, None], precision="fp32")
    (error,) = events_of(run_dir, ev.ErrorEvent)
    assert "use a wider format" not in error.message
    assert "clip_grad_norm_" in error.message  # a watched loop has no grad_clip field
    assert "a wider format gives no more room: lower the learning rate" in error.message


@pytest.mark.parametrize("name", ["tokens", "samples", "grad_norm"])
@pytest.mark.parametrize(
    ("bad", "said"),
    [("x", "a str ('x')"), (10**400, "an int too large for a float"), (True, "a bool (True)")],
    ids=["str", "huge-int", "bool"],
)
def test_a_bad_figure_in_mon_step_costs_its_step_not_the_rest(tmp_path, name, bad, said) -> None:
    """One bad tokens=, samples= or grad_norm= stopped recording for the rest of the run."""
    good = {"tokens": 64, "samples": 8, "grad_norm": torch.tensor(0.5)}[name]
    run_dir, caught = run_steps(tmp_path, [{name: bad if i in (2, 5) else good} for i in range(8)])
    run = records.load_run(run_dir)
    steps = [e for e in run.events if isinstance(e, ev.StepEvent)]
    assert [s.step for s in steps] == list(range(8))  # every step is recorded
    assert run.status == "ok" and run.done is not None and run.done.steps_done == 8
    figure = {"tokens": "tokens_per_s", "samples": "samples_per_s", "grad_norm": "grad_norm"}
    kept = [getattr(s, figure[name]) is not None for s in steps]
    if name == "samples":  # a step without samples= has the batch size known from before
        assert all(kept)
    else:
        assert kept == [True, True, False, True, True, False, True, True]
    (warning,) = [w for w in events_of(run_dir, ev.WarningEvent) if name in w.message]
    assert warning.code == "figure-unreadable" and warning.step == 2  # said once
    assert f"Step 2's {name}= is {said}" in warning.message
    assert f"mon.step({name}=) takes" in warning.message
    assert [w for w in caught if said in str(w.message)]
    assert not events_of(run_dir, ev.ErrorEvent)


def test_a_tensor_of_several_tokens_is_no_count(tmp_path) -> None:
    tokens = [torch.tensor(7), torch.tensor([3, 4]), torch.tensor(7)]
    run_dir, _ = run_steps(tmp_path, [{"tokens": t} for t in tokens])
    steps = events_of(run_dir, ev.StepEvent)
    assert [s.tokens_per_s is not None for s in steps] == [True, False, True]
    (warning,) = [w for w in events_of(run_dir, ev.WarningEvent) if w.step == 1]
    assert "tokens= is a tensor of shape (2,), not one number" in warning.message


@pytest.mark.parametrize("name", ["tokens", "samples"])
@pytest.mark.parametrize(
    "bad", [-64, -1.5, math.nan, math.inf, 1e308], ids=["int", "float", "nan", "inf", "1e308"]
)
def test_a_negative_count_in_mon_step_is_no_throughput(tmp_path, name, bad) -> None:
    """Before: mon.step(loss, tokens=-64) recorded a throughput of minus tens of thousands of
    tokens a second, and the run's summary gave it as its tokens/s; samples=inf or 1e308 made
    every step's line unreadable (an inf rate is null in JSON) and the summary fail."""
    run_dir, _ = run_steps(tmp_path, [{name: bad if i in (2, 4) else 8} for i in range(6)])
    run = records.load_run(run_dir)
    steps = [e for e in run.events if isinstance(e, ev.StepEvent)]
    assert len(steps) == 6 and run.done is not None and run.unreadable_lines == 0
    rates = [getattr(s, f"{name}_per_s") for s in steps]
    assert all(r is None or r >= 0 for r in rates), rates  # never a negative throughput
    summary = getattr(run.done, f"{name}_per_s")
    assert summary is not None and summary > 0
    (warning,) = [w for w in events_of(run_dir, ev.WarningEvent) if name in w.message]
    assert f"Step 2's {name}= is not a count" in warning.message


def test_a_learning_rate_that_is_no_number_leaves_every_step_readable(tmp_path) -> None:
    """Before: an optimizer whose lr was nan wrote every step with "lr": null, a line no
    reader of the record could read: the dashboard showed a run of 0 steps."""
    model, opt = tiny_model()
    for group in opt.param_groups:
        group["lr"] = math.nan
    with ampscope.watch(model, opt, runs_dir=tmp_path) as mon:
        for _ in range(3):
            loss = model(torch.randn(8, 32)).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.step(loss)
    run = records.load_run(mon.run_dir)
    steps = [e for e in run.events if isinstance(e, ev.StepEvent)]
    assert run.unreadable_lines == 0 and len(steps) == 3 and run.done is not None
    assert [s.lr for s in steps] == [None, None, None]


@pytest.mark.parametrize("bad", [-1.0, torch.tensor(-1.0)], ids=["number", "tensor"])
def test_a_negative_grad_norm_is_no_norm(tmp_path, bad) -> None:
    """Before: mon.step(grad_norm=-1.0) recorded a norm of -1, which no norm is."""
    run_dir, _ = run_steps(tmp_path, [{"grad_norm": bad if i == 2 else 0.5} for i in range(4)])
    steps = events_of(run_dir, ev.StepEvent)
    assert [s.grad_norm for s in steps] == [0.5, 0.5, None, 0.5]
    if isinstance(bad, float):  # a tensor is read a step late, without a word for each
        (warning,) = [w for w in events_of(run_dir, ev.WarningEvent) if "grad_norm" in w.message]
        assert "Step 2's grad_norm= is no norm (-1.0, below zero)" in warning.message
