"""What the dashboard knows of a run and draws from it: RunState, stat cards, plot series."""

from __future__ import annotations

import math
import time

import msgspec
import pytest

from ampscope.core import events as ev
from ampscope.tui.model.figures import (
    cards,
    loss_series,
    memory_series,
    step_time_series,
    thin,
    util_series,
)
from ampscope.tui.model.replay import RecordSource
from ampscope.tui.model.run_state import MAX_POINTS, RunState
from tests.helpers import done, hello, step


@pytest.mark.unit
def test_run_state_cards_from_a_synthetic_stream() -> None:
    state = RunState(label="fp32")
    assert state.status == "starting"
    state.ingest(ev.PhaseEvent(phase="setup", state="start"))
    state.ingest(hello())
    state.ingest(ev.PhaseEvent(phase="train", state="start", step=0))
    # 40 steps: the first 20 slow (100 ms), the last 20 alternate 10/30 ms -> median 20 ms
    for i in range(40):
        ms = 100.0 if i < 20 else (10.0 if i % 2 else 30.0)
        scale = 2.0**16 if i < 35 else 2.0**15
        state.ingest(step(i, ms, loss_scale=scale, skipped=i in (35, 36)))
    state.ingest(ev.WarningEvent(code="skipped-step", message="GradScaler skipped", step=35))
    assert state.status == "training"
    assert state.median_step_ms() == pytest.approx(20.0)
    shown = {c.key: c for c in cards(state)}
    assert shown["step_ms"].value == "20.0 ms"
    assert shown["skipped"].value == "2"
    assert shown["loss_scale"].value == "32.8k" and shown["loss_scale"].sub == "2^15"
    assert shown["throughput"].title == "Samples/s" and shown["throughput"].value == "800"
    assert "no NVIDIA GPU" in shown["util"].sub
    assert shown["memory"].value == "150 MiB"  # peak allocated, never the reserved 200 MiB
    assert shown["memory"].title == "Peak allocated" and shown["memory"].sub == "resv 200 MiB"
    levels = [(e.level, e.step) for e in state.log]
    assert ("skipped", 35) in levels and ("skipped", 36) in levels and ("warning", 35) in levels
    (lx, _ly), (sx, sy) = loss_series(state, 1000)
    assert len(lx) == 40 and sy[0] == 16 and sy[-1] == 15  # scale plotted as log2
    assert "40/100 steps" in state.header() and "training" in state.header()
    state.ingest(done("ok", 40))
    assert state.status == "done" and state.finished


@pytest.mark.unit
def test_a_compiled_gpu_runs_memory_card_shows_the_compile_peak_once_it_ends() -> None:
    state = RunState()
    state.ingest(hello(config={"precision": "amp-bf16", "compile": "default", "steps": 3}))
    for i in range(3):
        state.ingest(step(i))  # an allocator's figures: 150 MiB peak, 200 MiB reserved
    memory = {c.key: c for c in cards(state)}["memory"]
    assert (memory.value, memory.sub) == ("150 MiB", "resv 200 MiB")
    state.ingest(msgspec.structs.replace(done(steps=3), mem_peak_compile=3 << 30))
    memory = {c.key: c for c in cards(state)}["memory"]
    assert (memory.title, memory.value, memory.sub) == (
        "Peak allocated",
        "150 MiB",
        "compile 3 GiB",
    )
    assert state.log[-1].text.endswith("compile peak 3 GiB")  # the 80x24 cards hide the sub


@pytest.mark.unit
def test_the_step_card_shows_the_wait_for_batches_when_the_engine_reports_it() -> None:
    state = RunState(label="fp32")
    state.ingest(hello())
    state.ingest(step(0, 40.0))  # an older record: no data_ms
    assert {c.key: c for c in cards(state)}["step_ms"].sub == "median"
    for i in range(1, 4):
        state.ingest(step(i, 40.0, data_ms=12.0 + i))  # 13, 14, 15 ms of 40
    card = {c.key: c for c in cards(state)}["step_ms"]
    # both figures are medians of the recent steps, and the card says so (never a bare "of 4")
    assert card.title == "Step time · last 4" and card.value == "40.0 ms"
    assert card.sub == "median · data 14.0 ms"
    assert max(len(card.title), len(card.sub)) <= 22  # a card's width at 120 columns
    assert card.short == ("Step · last 4", "40.0 ms")  # 80x24: no sub line, 14 columns


@pytest.mark.unit
def test_the_step_card_and_the_runs_last_line_say_which_median_each_is() -> None:
    """At the end of a run the card (its last 20 steps) and the log's last line (the whole
    run) differ; each says which steps it is of, so neither reads as a wrong figure."""
    state = RunState(label="fp32")
    state.ingest(hello())
    for i in range(40):
        state.ingest(step(i, 100.0 if i < 20 else 50.0))
    state.ingest(msgspec.structs.replace(done(steps=40), step_ms_median=75.0))
    card = {c.key: c for c in cards(state)}["step_ms"]
    assert (card.title, card.value, card.sub) == ("Step time · last 20", "50.0 ms", "median")
    assert "median step of the run 75.0 ms" in state.log[-1].text


@pytest.mark.unit
def test_run_state_gpu_sys_events_and_phases() -> None:
    state = RunState()
    state.ingest(ev.PhaseEvent(phase="compile", state="start", step=0, t=1.0))
    assert state.phase_label(now=time.monotonic() + 5).startswith("compiling ")
    state.ingest(
        ev.SysEvent(
            t=2.0,
            gpu_util=87.0,
            cpu_util=12.0,
            gpu_mem_used=3 << 30,
            gpu_mem_total=80 << 30,
            power_w=300.0,
        )
    )
    card = {c.key: c for c in cards(state)}["util"]
    assert card.value == "GPU 87%" and "300 W" in card.sub
    assert set(memory_series(state, 100)) == {"device used", "device total"}
    assert set(util_series(state, 100)) == {"GPU", "CPU"}


@pytest.mark.unit
def test_host_figures_come_from_the_engines_sys_events_alone() -> None:
    """No sampler of the dashboard's own: without sys events there are no host figures."""
    state = RunState()
    state.ingest(hello())
    for i in range(5):
        state.ingest(step(i))
    assert {c.key: c for c in cards(state)}["util"].value == "-"
    assert util_series(state, 100) == {}
    state.ingest(ev.SysEvent(t=2.0, cpu_util=40.0, proc_cpu=90.0, sys_mem_used=1 << 30))
    card = {c.key: c for c in cards(state)}["util"]
    assert card.value == "CPU 40%" and "engine 90%" in card.sub
    # the engine's own CPU is in cores (it can pass 100 %), never on the percent axis
    assert util_series(state, 100) == {"CPU": ([2.0], [40.0]), "engine CPU": ([2.0], [0.9])}


@pytest.mark.unit
def test_ring_buffers_stay_bounded() -> None:
    state = RunState(maxlen=256)
    for i in range(5000):
        state.ingest(step(i, ms=float(i % 7), skipped=i % 10 == 0))
    assert len(state.steps) == 256 and state.steps["step"][0] == 5000 - 256
    assert all(len(state.steps[name]) == 256 for name in state.steps.names)
    assert len(state.log) <= 1000 and state.skipped == 500
    assert RunState().steps.maxlen == MAX_POINTS


@pytest.mark.unit
def test_thinning_keeps_two_points_a_column_and_the_spikes() -> None:
    xs = list(range(4096))
    ys = [1.0] * 4096
    ys[1234] = 50.0  # a single stalled step must survive thinning
    columns = 60
    tx, ty = thin(xs, ys, 2 * columns)
    assert len(tx) <= 2 * columns and len(tx) >= columns
    assert max(ty) == 50.0 and tx == sorted(tx)
    assert thin([1, 2, 3], [3, 2, 1], 100) == ([1, 2, 3], [3, 2, 1])
    state = RunState()
    for i in range(3000):
        state.ingest(step(i, loss=math.nan if i == 5 else 1.0))
    xs2, _ = step_time_series(state, 2 * columns)
    assert len(xs2) <= 2 * columns
    (lx, _), _ = loss_series(state, 10_000)
    assert 5 not in lx  # non-finite losses are not plotted


@pytest.mark.unit
def test_replay_of_a_record_without_done_is_incomplete() -> None:
    state = RecordSource([hello(), step(0), step(1)], label="fp32").state
    assert state.read_only and state.status == "incomplete" and state.step == 1


@pytest.mark.unit
def test_process_exit_without_error_event_shows_stderr() -> None:
    state = RunState()
    state.process_exited(1, ["Traceback (most recent call last):", "ImportError: boom"])
    assert state.status == "failed" and "code 1" in (state.error or "")
    assert any("ImportError: boom" in e.text for e in state.log)


@pytest.mark.unit
def test_control_characters_are_spelled_out() -> None:
    from ampscope.core.text import visible

    assert visible("evil\x1b[2J\rdone\x07") == "evil\\x1b[2J\\rdone\\x07"
    assert visible("two\nlines\tand a tab", keep_newlines=True) == "two\nlines\tand a tab"
    assert visible("two\nlines") == "two\\nlines"
    assert visible("\x9b31m") == "\\x9b31m"  # the one-byte CSI too
    assert visible("fp32 · ok ✓") == "fp32 · ok ✓"


@pytest.mark.unit
def test_rates_a_watched_loop_did_not_give_are_dashes_not_zeros() -> None:
    state = RunState()
    state.ingest(hello())
    for i in range(5):  # no batch size and no FLOP count given: the step says 0 for both
        state.ingest(step(i, samples_per_s=0.0, tflops=0.0))
    by_key = {c.key: c for c in cards(state)}
    assert by_key["throughput"].value == "-" and by_key["tflops"].value == "-"
    assert by_key["tflops"].sub == "FLOPs not known"
    for i in range(5, 11):  # given from here on: the median of the recent steps has them
        state.ingest(step(i, samples_per_s=640.0, tflops=0.25))
    known = {c.key: c for c in cards(state)}
    assert known["throughput"].value != "-" and known["tflops"].value.startswith("0.")


@pytest.mark.unit
def test_the_run_header_names_the_precision_once_when_the_preset_name_says_it() -> None:
    for preset, precision in (("amp-fp16-noscale", "amp-fp16"), ("cnn-amp-bf16", "amp-bf16")):
        state = RunState(label=preset)
        state.ingest(hello(preset=preset, config={"precision": precision, "steps": 10}))
        assert state.header().count(precision) == 1, state.header()
    # a name that does not say it (pure fp16 in a preset named after AMP) still shows it
    state = RunState(label="amp-fp16-mine")
    state.ingest(hello(preset="amp-fp16-mine", config={"precision": "fp16", "steps": 10}))
    assert " · fp16 · " in state.header()


@pytest.mark.unit
def test_a_watched_loops_model_is_named_in_the_log_by_its_class() -> None:
    """A watched loop names its model by class ('ConvGRU'), with no factory: the log said
    'model ? from ConvGRU'."""
    state = RunState()
    state.ingest(hello(preset="my-run", config={"workload": {"model": "ConvGRU"}}))
    assert "model ConvGRU, " in state.log[-1].text and "?" not in state.log[-1].text
    state = RunState()
    state.ingest(hello(config={"workload": {"model": "f.py:make"}}, workload="teacher-mlp"))
    assert "model teacher-mlp from f.py:make, " in state.log[-1].text


@pytest.mark.unit
def test_a_cpu_runs_memory_card_says_it_is_the_peak_rss() -> None:
    """On a CPU the peak is the process's high-water mark (no allocator): so says the card."""
    state = RunState()
    state.ingest(hello(device="cpu"))
    state.ingest(msgspec.structs.replace(step(0), mem_reserved=None, mem_peak=300 << 20))
    memory = {c.key: c for c in cards(state)}["memory"]
    assert (memory.title, memory.value) == ("Peak RSS", "300 MiB")


@pytest.mark.unit
def test_a_loop_past_the_steps_it_planned_counts_on_without_an_eta() -> None:
    """``watch(steps=5)`` around a loop that runs on: the header read "43/5 steps" and the
    Elapsed card "ETA -"; it counts the steps done, names the plan, and has no ETA."""
    state = RunState()
    state.ingest(hello(config={"precision": "fp32", "compile": "off", "steps": 5}))
    for i in range(3):
        state.ingest(step(i, 10.0))
    assert "3/5 steps" in state.header()
    assert {c.key: c for c in cards(state)}["elapsed"].sub.startswith("ETA ")
    for i in range(3, 43):
        state.ingest(step(i, 10.0))
    assert "43 steps (5 planned)" in state.header() and "/5" not in state.header()
    assert "ETA" not in {c.key: c for c in cards(state)}["elapsed"].sub


@pytest.mark.unit
def test_a_finished_runs_header_counts_the_steps_its_done_says() -> None:
    """A record whose step lines are out of order (a damaged or hand-made one) ended on step
    98's line: the header read "99/150 steps" beside a done of 150."""
    state = RunState()
    state.ingest(hello(config={"precision": "fp32", "compile": "off", "steps": 150}))
    for i in [*range(99, 150), *range(99)]:
        state.ingest(step(i, 10.0))
    assert "99/150 steps" in state.header()
    state.ingest(done("ok", 150))
    assert "150/150 steps" in state.header()
