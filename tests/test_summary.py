"""One rule for a run's summary: an engine run and a watched loop given the same steps write
the same ``done`` figures, so Compare sets them side by side on the same statistics."""

from __future__ import annotations

import math

import pytest

from ampscope.core.records import summary
from ampscope.core.records.tally import StepTally

# step 0 compiles, step 3 also counted gradient zeros, the last loss is NaN
STEPS = [
    # (step_ms, loss, skipped, counted zeros)
    (30_000.0, 4.0, False, False),
    (10.0, 3.5, False, False),
    (11.0, 3.0, True, False),
    (90.0, 2.5, False, True),
    (12.0, 2.0, False, False),
    (13.0, math.nan, False, False),
]
SAMPLES, TOKENS, FLOPS, PEAK = 8, 8 * 128, 2e9, 100.0


def engine_done():
    """As the engine keeps its books: compiled from the start, the same batch every step."""
    tally = StepTally(warmup_steps=1, compiled=True)
    tally.compile_s = 29.9
    for step, (ms, loss, skipped, zeros) in enumerate(STEPS):
        tally.add(step, ms, loss, skipped, instrumented=zeros)
    return tally.done("ok", FLOPS, PEAK, samples=SAMPLES, tokens=TOKENS)


def watch_done():
    """As a watched loop keeps them: the compile learned after the first step, each step's
    batch given with it."""
    tally = StepTally(warmup_steps=1)
    tally.compile_s = 29.9
    for step, (ms, loss, skipped, zeros) in enumerate(STEPS):
        tally.add(step, ms, loss, skipped, samples=SAMPLES, tokens=TOKENS, instrumented=zeros)
    return tally.done("ok", FLOPS, PEAK)


FIELDS = [
    "steps_done",
    "step_ms_median",
    "step_ms_p10",
    "step_ms_p90",
    "samples_per_s",
    "tokens_per_s",
    "tflops",
    "mfu",
    "loss_first",
    "loss_final",
    "loss_final_step",
    "loss_nonfinite",
    "skipped_steps",
    "compile_s",
]


@pytest.mark.unit
def test_an_engine_run_and_a_watched_loop_summarise_the_same_steps_alike() -> None:
    engine, watched = engine_done(), watch_done()
    assert {f: getattr(watched, f) for f in FIELDS} == {f: getattr(engine, f) for f in FIELDS}
    # the compile step and the zero-counting step are out; the median is of 10, 11, 12, 13
    assert engine.step_ms_median == 11.5 and engine.samples_per_s == pytest.approx(8 / 0.0115)
    assert engine.loss_final is None and engine.loss_nonfinite == "nan"
    assert engine.loss_final_step == 5 and engine.loss_first == 4.0


@pytest.mark.unit
def test_a_watched_loops_rates_are_a_typical_steps_so_one_odd_batch_moves_nothing() -> None:
    tally = StepTally(warmup_steps=0)
    for step, (ms, samples) in enumerate([(10.0, 8), (10.0, 8), (10.0, 8), (40.0, 4096)]):
        tally.add(step, ms, 1.0, False, samples=samples)
    done = tally.done("ok", None, None)
    assert done.step_ms_median == 10.0 and done.samples_per_s == pytest.approx(800.0)
    assert done.tokens_per_s is None and done.tflops is None  # never given: '-', not 0


@pytest.mark.unit
def test_the_timed_steps_rule() -> None:
    assert summary.timed_steps(5, 2) == [2, 3, 4]
    assert summary.timed_steps(5, 0, compiled=True) == [1, 2, 3, 4]
    assert summary.timed_steps(2, 5) == [1]  # shorter than its warm-up: the first step out
    assert summary.timed_steps(4, 1, instrumented={1, 2, 3}) == [1, 2, 3]  # none else left
    assert summary.timed_steps(6, 1, profiled={2, 3}) == [1, 4, 5]
    assert summary.timed_steps(6, 1, instrumented={4}, profiled={2, 3}) == [1, 5]
    assert summary.timed_steps(4, 1, profiled={1, 2, 3}) == [1, 2, 3]  # a profile run: all


@pytest.mark.slow
def test_profiled_steps_are_marked_and_left_out_of_the_step_time_figures() -> None:
    """torch.profiler slows the steps it profiles: their events say so, and neither done's
    median nor the dashboard's Step time card counts them."""
    import statistics

    from ampscope.core import events as ev
    from ampscope.engine.lifecycle.run import EXIT_OK, run
    from ampscope.tui.model.run_state import RunState

    seen: list[ev.Event] = []
    overrides = ["workload.kind='mlp'", "device='cpu'", "steps=9", "warmup_steps=0"]
    overrides.append("grad_zero_every=0")  # no step measures gradient zeros
    assert run("fp32", overrides, record=False, on_event=seen.append, profile=(2, 4)) == EXIT_OK
    steps = [e for e in seen if isinstance(e, ev.StepEvent)]
    assert [e.step for e in steps if e.profiled] == [2, 3, 4, 5]
    unprofiled = [e.step_ms for e in steps if not e.profiled]
    (done,) = [e for e in seen if isinstance(e, ev.DoneEvent)]
    assert done.step_ms_median == pytest.approx(statistics.median(unprofiled), abs=1e-3)
    state = RunState()
    for event in seen:
        state.ingest(event)
    recent = state.steps.recent("step_ms", 20, unless="profiled")  # what the card's median reads
    assert sorted(recent) == sorted(unprofiled)
    assert state.median_step_ms() == pytest.approx(statistics.median(unprofiled))
