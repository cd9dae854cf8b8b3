"""ampscope.watch on a user's own loop, in-process: the record, its figures, and its troubles.

Figures are checked against what the loop itself knows (its losses, the scaler's scale read
directly, torch's own norm) or against arithmetic (FLOPs of linear layers, a gradient with a
known share of zeros).
"""

from __future__ import annotations

import json
import math
import os
import threading
import warnings
from pathlib import Path

import pytest
import torch

import ampscope
from ampscope.cli.main import main as cli_main
from ampscope.core import comparison, records
from ampscope.core import events as ev
from ampscope.core.memory import measured
from ampscope.watching import WatchWarning
from ampscope.watching.monitor import Monitor
from ampscope.watching.opening import Surroundings
from ampscope.watching.options import Options
from ampscope.watching.readout import WIDTH, DeviceReadout, StepValues
from tests.helpers import (
    events_of,
    held_at_first_call,
    linear_flops,
    second_while_first_held,
    tiny_model,
)

pytestmark = pytest.mark.unit


# --------------------------------------------------------------------------- a user's loop


def watch_in(world: Surroundings, model, opt, **options) -> Monitor:
    """``ampscope.watch(model, opt, **options)``, its record made and its figures started by
    ``world`` (a full disk, no NVML, a tick that never comes)."""
    return Monitor(model, opt, options=Options.of(options), world=world)


def train(mon, model, opt, steps=12, scaler=None, inf_at=None, nan_at=None, fail_at=None):
    """A user's training loop, written as users write them. Returns the losses it saw."""
    torch.manual_seed(1)
    losses = []
    for i in range(steps):
        x = torch.randn(16, 32)
        y = torch.randint(0, 4, (16,))
        with torch.autocast("cpu", dtype=torch.float16, enabled=scaler is not None):
            logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.float(), y)
        if i == inf_at:
            loss = loss * math.inf
        if i == nan_at:
            loss = loss * math.nan
        if i == fail_at:
            raise RuntimeError(f"boom at {i}")
        losses.append(loss.item())
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        opt.zero_grad()
        mon.step(loss, samples=16, tokens=16 * 7)
    return losses


def test_a_training_loop_leaves_a_record_every_reader_accepts(tmp_path: Path, capsys) -> None:
    model, opt = tiny_model()
    with ampscope.watch(model, opt, name="mine", runs_dir=tmp_path, steps=12) as mon:
        losses = train(mon, model, opt)

    run = records.load_run(mon.run_dir)
    assert run.state == "ok" and run.hello is not None and run.done is not None
    assert run.hello.source == "watch" and run.hello.allow_stop is False
    assert run.hello.preset == "mine" and run.hello.device == "cpu"
    assert run.hello.param_count == sum(p.numel() for p in model.parameters())
    steps = [e for e in run.events if isinstance(e, ev.StepEvent)]
    assert [s.step for s in steps] == list(range(12))
    assert [s.loss for s in steps] == pytest.approx(losses)
    assert all(s.tokens_per_s == pytest.approx(16 * 7e3 / s.step_ms, rel=1e-3) for s in steps)
    assert run.done.steps_done == 12 and run.done.skipped_steps == 0
    assert run.done.loss_first == pytest.approx(losses[0])
    assert run.done.loss_final == pytest.approx(losses[-1])
    assert run.unreadable_lines == 0
    order = [type(e).__name__ for e in run.events if not isinstance(e, ev.SysEvent)]
    assert order[:4] == ["PhaseEvent", "HelloEvent", "PhaseEvent", "PhaseEvent"]
    assert order[-2:] == ["PhaseEvent", "DoneEvent"]
    assert json.loads((mon.run_dir / records.CONFIG_FILE).read_text())["source"] == "watch"
    assert not (mon.run_dir / records.LIVE_FILE).exists()

    # the summary, as `ampscope runs`, History and Compare read it
    summary = records.load_run(mon.run_dir, with_events=False)
    assert summary.done is not None and summary.done.steps_done == 12
    capsys.readouterr()
    assert cli_main(["runs", "--json", "--runs-dir", str(tmp_path)]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["state"], row["preset"], row["steps"]) == ("ok", "mine", 12)
    row = comparison.row_from_runs("mine", [run])
    assert row.status == "ok" and row.loss_final == pytest.approx(losses[-1])
    assert measured.compare_run(mon.run_dir).params == run.hello.param_count


def test_flops_counted_on_the_first_step_match_the_arithmetic(tmp_path: Path) -> None:
    model, opt = tiny_model()
    with ampscope.watch(model, opt, runs_dir=tmp_path, count_flops=True, peak_tflops=1.0) as mon:
        train(mon, model, opt, steps=3)
    # forward 2mnk per linear, backward twice that, minus the first layer's input gradient
    assert mon.flops_per_step == linear_flops(batch=16, widths=(32, 64, 4))
    steps = events_of(mon.run_dir, ev.StepEvent)
    for s in steps:
        assert s.tflops == pytest.approx(mon.flops_per_step / s.step_ms / 1e9, rel=1e-3)
        assert s.mfu == pytest.approx(s.tflops / 1.0)


def test_flops_counted_on_the_first_step_follow_a_batch_size_that_changes(tmp_path: Path) -> None:
    model, opt = tiny_model()
    sizes = [16, 4, 16, 64, 4, 64]
    with ampscope.watch(model, opt, runs_dir=tmp_path, count_flops=True, warmup_steps=0) as mon:
        for n in sizes:
            loss = torch.nn.functional.cross_entropy(
                model(torch.randn(n, 32)), torch.zeros(n).long()
            )
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.step(loss, samples=n)
    flops = [s.tflops * 1e9 * s.step_ms for s in events_of(mon.run_dir, ev.StepEvent)]
    assert flops == pytest.approx([linear_flops(n, (32, 64, 4)) for n in sizes], rel=1e-3)
    (done,) = events_of(mon.run_dir, ev.DoneEvent)  # the median step's: 16 samples
    assert done.tflops * 1e9 * done.step_ms_median == pytest.approx(
        linear_flops(16, (32, 64, 4)), rel=1e-3
    )


def test_a_count_that_ran_a_kernel_torch_cannot_count_says_it_is_a_lower_bound(
    tmp_path: Path,
) -> None:
    """nn.LSTM runs one oneDNN kernel on a CPU, which FlopCounterMode has no formula for: the
    count holds only the head's matmuls, and the record (and count_flops) say so, naming it."""
    torch.manual_seed(0)
    lstm, head = torch.nn.LSTM(8, 16, batch_first=True), torch.nn.Linear(16, 4)
    model = torch.nn.ModuleDict({"lstm": lstm, "head": head})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 5, 8), torch.randint(0, 4, (4, 5))

    def step() -> torch.Tensor:
        loss = torch.nn.functional.cross_entropy(head(lstm(x)[0]).flatten(0, 1), y.flatten())
        loss.backward()
        return loss

    with ampscope.watch(model, opt, runs_dir=tmp_path, count_flops=True) as mon:
        for _ in range(2):
            loss = step()
            opt.step()
            opt.zero_grad()
            mon.step(loss)
    head_only = 6 * 4 * 5 * 16 * 4  # the head's forward, input and weight gradients
    assert mon.flops_per_step == head_only
    (warning,) = [w for w in events_of(mon.run_dir, ev.WarningEvent) if w.code == "flops-partial"]
    assert warning.message.startswith(f"The FLOP count ({head_only:.4g} a step) is a lower bound")
    assert "aten.mkldnn_rnn_layer" in warning.message and "flops_per_step=" in warning.message
    with pytest.warns(UserWarning, match="mkldnn_rnn_layer"):
        assert ampscope.count_flops(step) == head_only


def test_amp_fp16_skipped_step_is_recorded_at_its_step(tmp_path: Path) -> None:
    model, opt = tiny_model()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    with ampscope.watch(model, opt, scaler=scaler, runs_dir=tmp_path, grad_norm=True) as mon:
        train(mon, model, opt, steps=8, scaler=scaler, inf_at=5)
    steps = events_of(mon.run_dir, ev.StepEvent)
    assert [s.step for s in steps if s.skipped] == [5]
    assert [s.loss_scale for s in steps] == [1024.0] * 5 + [512.0] * 3  # halved by update()
    assert steps[5].loss is None
    # optimizer.step() never ran on the skipped step, so it has no gradient norm
    assert [s.grad_norm is None for s in steps] == [False] * 5 + [True] + [False] * 2
    (warning,) = [w for w in events_of(mon.run_dir, ev.WarningEvent) if w.code == "skipped-step"]
    assert warning.step == 5 and "1024 -> 512" in warning.message
    assert records.load_run(mon.run_dir).done.skipped_steps == 1  # type: ignore[union-attr]
    assert not [e for e in events_of(mon.run_dir, ev.ErrorEvent)]  # a skip is no NaN error


def test_a_nan_loss_is_an_error_event_and_the_loop_goes_on(tmp_path: Path) -> None:
    model, opt = tiny_model()
    with ampscope.watch(model, opt, runs_dir=tmp_path) as mon:
        losses = train(mon, model, opt, steps=6, nan_at=2)
    assert len(losses) == 6
    (error,) = events_of(mon.run_dir, ev.ErrorEvent)
    assert (error.kind, error.step) == ("nan", 2)
    assert "Your loop goes on" in error.message
    assert records.load_run(mon.run_dir).status == "ok"


def test_an_exception_in_the_loop_ends_the_record_failed(tmp_path: Path) -> None:
    model, opt = tiny_model()
    with pytest.raises(RuntimeError, match="boom at 4"):  # noqa: SIM117 - the raise is the test
        with ampscope.watch(model, opt, runs_dir=tmp_path) as mon:
            train(mon, model, opt, steps=8, fail_at=4)
    run = records.load_run(mon.run_dir)
    assert run.status == "failed" and run.done is not None
    assert run.done.error == "RuntimeError: boom at 4" and run.done.steps_done == 4
    (error,) = events_of(mon.run_dir, ev.ErrorEvent)
    assert error.kind == "exception" and "raise RuntimeError" in (error.traceback or "")


class Unprintable(Exception):
    def __str__(self) -> str:
        raise ZeroDivisionError("its __str__ fails too")


def test_an_exception_that_cannot_be_printed_still_ends_the_record_with_its_steps(
    tmp_path: Path,
) -> None:
    """A loop's exception whose __str__ raises failed the record's finish: its steps, queued
    for the disk, and its done were lost, and the run stayed listed as live."""
    model, opt = tiny_model()
    with pytest.raises(Unprintable), warnings.catch_warnings():  # noqa: SIM117
        warnings.simplefilter("error", WatchWarning)  # 'finishing the record failed' fails it
        with ampscope.watch(model, opt, runs_dir=tmp_path) as mon:
            train(mon, model, opt, steps=3)
            raise Unprintable()
    run = records.load_run(mon.run_dir)
    assert run.status == "failed" and run.done is not None
    assert run.done.error == "Unprintable: <exception str() failed>"
    assert run.done.steps_done == 3 and len(events_of(mon.run_dir, ev.StepEvent)) == 3
    (error,) = events_of(mon.run_dir, ev.ErrorEvent)
    assert error.message == "Unprintable: <exception str() failed>"


def test_a_loop_in_a_generator_closed_early_ends_ok(tmp_path: Path) -> None:
    """A generator's loop whose reader stopped after two steps (a ``break``, or the generator
    collected) ended failed, with "GeneratorExit: " as its error and a traceback."""
    model, opt = tiny_model()
    run_dirs = []

    def steps():
        with ampscope.watch(model, opt, runs_dir=tmp_path) as mon:
            run_dirs.append(mon.run_dir)
            for i in range(10):
                train(mon, model, opt, steps=1)
                yield i

    for i in steps():
        if i == 1:
            break
    run = records.load_run(run_dirs[0])
    assert run.status == "ok" and run.done is not None and run.done.error is None
    assert run.done.steps_done == 2 and not events_of(run_dirs[0], ev.ErrorEvent)


def test_an_exception_of_megabytes_still_lists_the_run_as_failed(tmp_path: Path) -> None:
    """A loop's exception whose message held 2 MB (a dataset's repr) was written whole into
    done and summary.json, which readers do not take past 1 MiB: the run listed as crashed."""
    model, opt = tiny_model()
    with pytest.raises(ValueError):  # noqa: SIM117 - the raise is the test
        with ampscope.watch(model, opt, runs_dir=tmp_path) as mon:
            train(mon, model, opt, steps=2)
            raise ValueError("bad batch " + "x" * 2_000_000)
    (listed,) = records.list_runs(tmp_path)
    assert listed.state == "failed" and listed.done is not None
    assert listed.done.error is not None and listed.done.error.startswith("ValueError: bad batch x")
    assert listed.done.error.endswith("more characters)") and len(listed.done.error) < 20_000
    (error,) = events_of(mon.run_dir, ev.ErrorEvent)
    assert error.traceback is not None and len(error.traceback) < 20_000


@pytest.mark.parametrize("blank", ["", " "])
def test_an_empty_runs_dir_is_the_default_folder(tmp_path: Path, monkeypatch, blank) -> None:
    """runs_dir="" (a loop's os.environ.get("RUNS", "")) made the record straight in the
    current folder, beside the user's files, not in $AMPSCOPE_RUNS_DIR or ./runs; " " made a
    folder named " "."""
    monkeypatch.setenv("AMPSCOPE_RUNS_DIR", str(tmp_path / "kept"))
    monkeypatch.chdir(tmp_path)
    model, opt = tiny_model()
    with ampscope.watch(model, opt, runs_dir=blank, name="blank") as mon:
        train(mon, model, opt, steps=2)
    assert mon.run_dir.parent == tmp_path / "kept"
    assert [p.name for p in tmp_path.iterdir()] == ["kept"]


def test_hello_is_on_disk_when_watch_returns(tmp_path: Path) -> None:
    """A process that ends before the monitor's first tick still leaves a record that says
    what ran."""
    model, opt = tiny_model()
    no_tick = Surroundings(tick_s=3600.0)  # no tick comes: only watch() writes
    mon = watch_in(no_tick, model, opt, runs_dir=tmp_path)
    try:
        (hello,) = events_of(mon.run_dir, ev.HelloEvent)
        assert hello.preset == mon.run_dir.name.split("-", 1)[-1]
    finally:
        mon.close()


def test_a_backlog_of_steps_reaches_the_record_whole(tmp_path: Path, monkeypatch) -> None:
    """Steps that pile up before the monitor's thread writes them (here: no tick before the
    close; in a loop, a thread starved of the GIL) are every one recorded, however many: the
    bound on queued lines is for a disk that stalls, and this one does not."""
    from ampscope.core.records import writer

    monkeypatch.setattr(writer, "MAX_QUEUED_BYTES", 4 << 20)  # 9 MB of step lines below
    model, opt = tiny_model()
    no_tick = Surroundings(tick_s=3600.0)
    mon = watch_in(no_tick, model, opt, runs_dir=tmp_path)
    count = 20_000
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for i in range(count):
            mon.step(1.0 / (i + 1))
        mon.close()
    assert [str(w.message) for w in said if issubclass(w.category, WatchWarning)] == []
    steps = events_of(mon.run_dir, ev.StepEvent)
    assert [s.step for s in steps] == list(range(count))
    (done,) = events_of(mon.run_dir, ev.DoneEvent)
    assert done.status == "ok" and done.steps_done == count


def test_a_close_while_the_monitors_thread_reports_keeps_each_step_once_in_order(
    tmp_path: Path,
) -> None:
    """A loop of thousands of steps a second ends while the monitor's own thread is still
    turning its backlog into lines (here: held inside its first step): the close reports the
    rest after it, not beside it, so no step is written after ``done``, out of order, or lost
    to two readers of one queue (an IndexError warned that steps were no longer recorded)."""
    model, opt = tiny_model()
    mon = watch_in(Surroundings(tick_s=3600.0), model, opt, runs_dir=tmp_path)
    count = 2_000
    for i in range(count):
        mon.step(1.0 / (i + 1))
    inside, go = threading.Event(), threading.Event()
    mon._steps.report = held_at_first_call(mon._steps.report, inside, go)  # type: ignore[method-assign]
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        # the monitor's thread held inside its first step; a close beside it
        second_while_first_held(mon._tick, mon.close, inside, go, grace_s=2.0)
    assert [str(w.message) for w in said if issubclass(w.category, WatchWarning)] == []
    lines = [json.loads(line) for line in (mon.run_dir / records.EVENTS_FILE).open()]
    assert [e["step"] for e in lines if e["type"] == "step"] == list(range(count))
    assert lines[-1]["type"] == "done" and lines[-1]["steps_done"] == count


def test_a_backlog_being_reported_still_refreshes_the_heartbeat(
    tmp_path: Path, monkeypatch
) -> None:
    """A backlog of landed steps (a loop faster than its reporter) kept the monitor's thread
    writing lines without once refreshing live.json: 'ampscope runs' and attach called the
    run stalled while it trained. Each batch of lines written now beats too."""
    from ampscope.watching import monitor

    monkeypatch.setattr(monitor, "REPORT_BATCH", 10)
    model, opt = tiny_model()
    mon = watch_in(Surroundings(tick_s=3600.0), model, opt, runs_dir=tmp_path)
    for i in range(45):
        mon.step(1.0 / (i + 1))
    assert mon._record is not None
    beats: list[int] = []
    tick = mon._record.tick

    def counted() -> None:
        beats.append(1)
        tick()

    mon._record.tick = counted  # type: ignore[method-assign]
    mon._report_landed()
    mon.close()
    assert len(beats) >= 4  # one a batch of 10, 45 steps
    steps = [e.step for e in events_of(mon.run_dir, ev.StepEvent)]
    assert steps == list(range(45))


class Exited(BaseException):
    """What the stand-in for the process's own ``os._exit`` raises, with its status."""


@pytest.mark.parametrize(("status", "outcome"), [(0, "ok"), (3, "failed")])
def test_os_exit_after_a_watched_loop_ends_its_record_first(
    tmp_path: Path, monkeypatch, status: int, outcome: str
) -> None:
    def process_exit(code: int):
        raise Exited(code)

    monkeypatch.setattr(os, "_exit", process_exit)  # what watch() finds, and calls last
    model, opt = tiny_model()
    mon = ampscope.watch(model, opt, runs_dir=tmp_path)
    train(mon, model, opt, steps=7)
    with pytest.raises(Exited) as exited:
        os._exit(status)
    assert exited.value.args == (status,)  # the process goes as asked
    assert os._exit is process_exit  # and ours is gone with the run
    run = records.load_run(mon.run_dir)
    assert run.status == outcome and run.done is not None and run.done.steps_done == 7
    assert len(events_of(mon.run_dir, ev.StepEvent)) == 7
    assert not (mon.run_dir / records.LIVE_FILE).exists()
    assert records.load_run(mon.run_dir, with_events=False).done is not None  # summary.json
    if status:
        assert run.done.error == "ProcessExit: os._exit(3) ended the process"


def test_a_stop_whose_figures_cannot_be_summed_still_ends_the_record_stopped(
    tmp_path: Path, monkeypatch
) -> None:
    """A SIGTERM can land anywhere in the user's step, ampscope's own code included. Whatever
    it leaves half done, the record still ends with its ``done``: once a watched script's
    record was left 'incomplete' after a SIGTERM (a CI run, under load)."""
    from ampscope.core.records.tally import StepTally

    model, opt = tiny_model()
    mon = ampscope.watch(model, opt, runs_dir=tmp_path)
    train(mon, model, opt, steps=4)

    def broken(*args, **kwargs):
        raise IndexError("a step half recorded")

    monkeypatch.setattr(StepTally, "done", broken)
    mon.note_signal(15)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mon.close()
    run = records.load_run(mon.run_dir)
    assert run.status == "stopped" and run.done is not None
    assert not (mon.run_dir / records.LIVE_FILE).exists()
    (said,) = [w for w in caught if issubclass(w.category, WatchWarning)]
    assert "summing up the run failed" in str(said.message) and "IndexError" in str(said.message)


def test_an_unwritable_runs_folder_costs_one_warning_and_nothing_else(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    model, opt = tiny_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mon = ampscope.watch(model, opt, runs_dir=blocker / "runs")
        losses = train(mon, model, opt, steps=5)
        mon.close()
    assert len(losses) == 5 and mon.run_dir is None
    ours = [w for w in caught if issubclass(w.category, WatchWarning)]
    assert len(ours) == 1 and len(caught) == 1
    text = str(ours[0].message)
    assert str(blocker / "runs") in text and "Your training goes on" in text
    assert ours[0].filename == __file__  # the user's watch() line, not ampscope's


def test_a_warning_names_a_runs_folder_with_its_control_characters_spelled_out(
    tmp_path: Path,
) -> None:
    """A warning reaches the user's terminal as it is: an escape sequence in the runs
    folder it names would retitle or clear it."""
    blocker = tmp_path / "runs\x1b]0;pwned\x07"
    blocker.write_text("not a folder")
    model, opt = tiny_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mon = ampscope.watch(model, opt, runs_dir=blocker)
        mon.close()
    (said,) = [str(w.message) for w in caught if issubclass(w.category, WatchWarning)]
    assert f"cannot create a run record under {tmp_path}/runs\\x1b]0;pwned\\x07 (" in said
    assert "\x1b" not in said and "\x07" not in said
    assert caught[0].filename == __file__  # still the user's watch() line


def test_a_full_disk_costs_one_warning_and_the_loop_completes(tmp_path: Path) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (Linux) to fill the disk")
    new_run_dir = records.new_run_dir

    def onto_a_full_disk(root: Path, name: str) -> Path:
        path = new_run_dir(root, name)
        (path / records.EVENTS_FILE).symlink_to("/dev/full")
        return path

    full = Surroundings(new_run_dir=onto_a_full_disk)
    model, opt = tiny_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with watch_in(full, model, opt, runs_dir=tmp_path) as mon:
            losses = train(mon, model, opt, steps=6)
    assert len(losses) == 6
    (warning,) = caught
    assert issubclass(warning.category, WatchWarning) and "No space left" in str(warning.message)
    assert not (mon.run_dir / records.LIVE_FILE).exists()  # type: ignore[operator]


def test_telemetry_that_cannot_start_costs_one_warning(tmp_path: Path) -> None:
    def broken(*args, **kwargs):
        raise OSError("libnvidia-ml.so: cannot open shared object file")

    no_nvml = Surroundings(start_for_run=broken)
    model, opt = tiny_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with watch_in(no_nvml, model, opt, runs_dir=tmp_path) as mon:
            losses = train(mon, model, opt, steps=4)
    (warning,) = caught
    assert "device and host figures are unavailable" in str(warning.message)
    assert len(losses) == 4 and records.load_run(mon.run_dir).status == "ok"
    assert len(events_of(mon.run_dir, ev.StepEvent)) == 4


def test_grad_norm_and_zero_gradients_on_request(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    norms, zeros = [], []
    with ampscope.watch(model, opt, runs_dir=tmp_path, grad_norm=True, grad_zero_every=2) as mon:
        for _ in range(4):
            out = model(torch.randn(4, 8))
            out[:, :3].square().sum().backward()  # 7 of the 10 output columns get no gradient
            norms.append(
                torch.linalg.vector_norm(
                    torch.cat([p.grad.flatten() for p in model.parameters()])
                ).item()
            )
            zeros.append(7 / 10)
            opt.step()
            opt.zero_grad()
            mon.step()
    steps = events_of(mon.run_dir, ev.StepEvent)
    assert [s.grad_norm for s in steps] == pytest.approx(norms, rel=1e-5)
    assert [s.grad_zero_frac for s in steps] == [pytest.approx(0.7), None, pytest.approx(0.7), None]
    assert all(s.loss is None for s in steps)  # no loss given: none recorded, no NaN error
    assert not events_of(mon.run_dir, ev.ErrorEvent)


def test_compile_counters_moving_become_compile_events(tmp_path: Path) -> None:
    from torch._dynamo.utils import counters

    model, opt = tiny_model()
    counters.clear()
    try:
        with ampscope.watch(model, opt, runs_dir=tmp_path) as mon:
            train(mon, model, opt, steps=2)
            counters["frames"]["total"] += 2  # as a compile with a graph break would
            counters["stats"]["unique_graphs"] += 1
            counters["graph_break"]["a data-dependent branch"] += 2
            train(mon, model, opt, steps=2)
            counters["frames"]["total"] += 1  # a recompile
            counters["stats"]["unique_graphs"] += 1
            train(mon, model, opt, steps=1)
    finally:
        counters.clear()
    compiles = events_of(mon.run_dir, ev.CompileEvent)
    assert [(c.step, c.graphs, c.recompiles, c.graph_breaks) for c in compiles] == [
        (2, 1, 0, 2),
        (4, 2, 1, 2),
    ]
    assert [w.step for w in events_of(mon.run_dir, ev.WarningEvent) if w.code == "recompile"] == [4]


def test_count_flops_refuses_a_compiled_model_instead_of_breaking_it(tmp_path: Path) -> None:
    model, opt = tiny_model()
    model._orig_mod = torch.nn.Identity()  # what torch.compile's wrapper carries
    with ampscope.watch(model, opt, runs_dir=tmp_path, count_flops=True) as mon:
        train(mon, model, opt, steps=2)
    assert mon.flops_per_step is None
    codes = [w.code for w in events_of(mon.run_dir, ev.WarningEvent)]
    assert "flops-not-counted" in codes and "flops-unknown" in codes
    phases = [(p.phase, p.state) for p in events_of(mon.run_dir, ev.PhaseEvent)]
    assert ("compile", "end") in phases  # the first step of a compiled model is its compile


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"precision": "fp12"}, "precision='fp12'"),
        ({"steps": 0}, "steps=0"),
        ({"telemetry_hz": 100}, "telemetry_hz=100"),
        ({"grad_zero_every": -1}, "grad_zero_every=-1"),
        ({"flops_per_step": float("nan")}, "flops_per_step=nan"),
        ({"flops_per_step": 10**400}, "flops_per_step=about 10**400"),  # was an OverflowError
        ({"flops_per_step": 1e308}, "flops_per_step=1e+308"),  # TFLOP/s was inf
        ({"steps": 10**5000}, "steps=about 10**5000"),  # was a ValueError from repr()
        ({"warmup_steps": 10**30}, "warmup_steps=about 10**30 is not accepted"),  # was accepted
    ],
    ids=[
        "precision",
        "steps",
        "hz",
        "grad-zero",
        "nan",
        "huge-flops",
        "flops-near-floats-range",
        "huge-steps",
        "huge-warmup",
    ],
)
def test_a_bad_argument_names_itself_and_what_is_accepted(kwargs, named, tmp_path) -> None:
    model, opt = tiny_model()
    with pytest.raises(ValueError, match="Accepted") as info:
        ampscope.watch(model, opt, runs_dir=tmp_path, **kwargs)
    assert named in str(info.value)
    assert not list(tmp_path.iterdir())  # nothing recorded for a call that was refused


@pytest.mark.parametrize(
    ("which", "named", "hint"),
    [
        ("parameters", "optimizer=generator", "the model's parameters"),
        ("string", "optimizer='adam'", "a torch.optim.Optimizer"),
        ("scaler-as-optimizer", "optimizer=GradScaler", "pass it as scaler="),
        ("bad-scaler", "scaler='yes'", "a torch.amp.GradScaler"),
        ("bad-model", "model='net'", "torch.nn.Module"),
    ],
)
def test_a_wrong_object_for_the_model_optimizer_or_scaler_is_a_value_error_naming_it(
    which, named, hint, tmp_path
) -> None:
    """watch(model, model.parameters()) raised a raw internal AttributeError."""
    model, opt = tiny_model()
    args: dict = {
        "parameters": dict(model=model, optimizer=model.parameters()),
        "string": dict(model=model, optimizer="adam"),
        "scaler-as-optimizer": dict(model=model, optimizer=torch.amp.GradScaler("cpu")),
        "bad-scaler": dict(model=model, optimizer=opt, scaler="yes"),
        "bad-model": dict(model="net", optimizer=opt),
    }[which]
    with pytest.raises(ValueError, match="Accepted") as info:
        ampscope.watch(runs_dir=tmp_path, **args)
    assert named in str(info.value) and hint in str(info.value)
    assert not list(tmp_path.iterdir())
    ampscope.watch(model, opt, runs_dir=tmp_path, scaler=torch.amp.GradScaler("cpu")).close()


def test_ampscope_watch_is_a_plain_function_whichever_import_came_first(tmp_path) -> None:
    import inspect

    import ampscope.watching.options  # noqa: F401 - the package loaded first: watch stays

    assert inspect.isfunction(ampscope.watch) and ampscope.watch.__module__ == "ampscope.watching"
    assert ampscope.count_flops and ampscope.WatchWarning and ampscope.Monitor
    model, opt = tiny_model()
    with pytest.raises(TypeError, match="unexpected option 'grad_zeros'.*grad_zero_every"):
        ampscope.watch(model, opt, runs_dir=tmp_path, grad_zeros=10)  # type: ignore[call-arg]


def test_the_keyword_types_name_the_options_as_the_one_list_of_them() -> None:
    """``Options`` holds the options; the keyword types that type checkers read (watch's and
    the trainer callbacks') name the same ones."""
    import dataclasses
    import typing

    from ampscope.watching.options import Options, RecordOptions, WatchOptions

    fields = {f.name for f in dataclasses.fields(Options)}
    assert set(typing.get_type_hints(WatchOptions)) == fields
    assert set(typing.get_type_hints(RecordOptions)) == fields - {"precision", "steps", "grad_norm"}


# --------------------------------------------------------------------------- the CUDA path, faked


class LateProbe:
    """Hands a step back one step late, as the CUDA probe does once its copy has landed."""

    def __init__(self) -> None:
        from ampscope.engine.step.timer import FinishedStep

        self.finished = FinishedStep
        self.waiting: list = []
        self.begun = 0

    def begin(self) -> None:
        self.begun += 1

    def end(self, step: int, metrics: torch.Tensor) -> None:
        assert metrics.shape == (WIDTH,)
        self.waiting.append(self.finished(step, 10.0 + step, metrics.tolist()))

    def poll(self) -> list:
        ready, self.waiting = self.waiting[:-1], self.waiting[-1:]
        return ready

    def drain(self) -> list:
        ready, self.waiting = self.waiting, []
        return ready


def test_figures_that_land_late_belong_to_their_own_step() -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    scaler._lazy_init_scale_growth_tracker(torch.device("cpu"))
    probe = LateProbe()
    readout = DeviceReadout(torch.device("cpu"), scaler, probe=probe)
    for step, (loss, scale) in enumerate([(3.0, 8.0), (2.0, 4.0), (1.5, 4.0)]):
        scaler._scale.fill_(scale)  # as update() leaves it
        readout.end(step, torch.tensor(loss), 0.5, None, torch.tensor(100), 4, 1e-3)
    assert [raw[0] for raw in readout.landed] == [0, 1]  # step 2 is still in flight
    readout.drain()
    got = [StepValues.from_raw(raw) for raw in readout.landed]
    assert [(v.step, v.loss, v.scale_before, v.scale) for v in got] == [
        (0, 3.0, 8.0, 8.0),
        (1, 2.0, 8.0, 4.0),  # the scale dropped across this step's update(): skipped
        (2, 1.5, 4.0, 4.0),
    ]
    assert [(v.step_ms, v.grad_norm, v.tokens, v.samples) for v in got][1] == (11.0, 0.5, 100, 4)
    assert probe.begun == 4  # at the start, then after every step


def test_a_ctrl_c_inside_ampscopes_own_code_ends_its_traceback_at_the_users_call() -> None:
    """The handler's frame and the ampscope frames the signal interrupted are cut: the user
    sees the line of theirs that called into ampscope, as for any call that was interrupted."""
    import traceback

    from ampscope.watching import exits
    from tests.data import signal_inside

    ours = str(Path(signal_inside.__file__).parent) + "/"  # its frames stand for ampscope's

    def users_loop() -> None:
        signal_inside.step_of_ours()

    try:
        users_loop()
    except KeyboardInterrupt as exc:
        exits._hide_handler_frame(ours)
        last = traceback.extract_tb(exc.__traceback__)[-1]
        assert last.name == "users_loop" and last.filename == __file__
    else:
        raise AssertionError("no KeyboardInterrupt")


def test_a_loop_that_ignores_sigint_is_stopped_with_sigterm(tmp_path) -> None:
    """A script started with & or nohup ignores SIGINT: a viewer's stop would do nothing. Its
    record asks for SIGTERM instead, which the watch's handler ends as a stop too."""
    import signal

    from ampscope.core import records
    from ampscope.core.processes import stopping

    sent: list[int] = []
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        model, opt = tiny_model()
        with ampscope.watch(model, opt, runs_dir=tmp_path, allow_stop=True) as mon:
            live = records.read_live(mon.run_dir)
            assert live is not None and live["stop_signal"] == "SIGTERM"
            asked = stopping.ask_to_stop(
                mon.run_dir,
                live,
                os.getpid(),
                send=lambda pid, sig: sent.append(sig),
                holds=lambda pid, run_dir: True,
            )
            assert asked is False
    finally:
        signal.signal(signal.SIGINT, previous)
    assert sent == [signal.SIGTERM]
    with ampscope.watch(model, opt, runs_dir=tmp_path, allow_stop=True) as mon:
        live = records.read_live(mon.run_dir)
        assert live is not None and live["stop_signal"] == "SIGINT"  # as Ctrl+C, where it works


@pytest.mark.parametrize("every", [0, 3])
def test_the_grad_zeros_card_of_a_watched_run_says_off_when_never_measured(
    tmp_path: Path, every: int
) -> None:
    """grad_zero_every=0 (the default) means never: the card says so, not "not measured yet"."""
    from ampscope.tui.model.figures import cards
    from ampscope.tui.model.run_state import RunState

    model, opt = tiny_model()
    with ampscope.watch(model, opt, runs_dir=tmp_path, steps=6, grad_zero_every=every) as mon:
        train(mon, model, opt, steps=6)
    run = records.load_run(mon.run_dir)
    assert run.hello is not None and run.hello.config["grad_zero_every"] == every
    state = RunState()
    for event in run.events:
        state.ingest(event)
    card = {c.key: c for c in cards(state)}["grad_zeros"]
    if every == 0:
        assert (card.value, card.sub) == ("off", "grad_zero_every=0")
    else:
        assert card.value.endswith("%") and card.sub.startswith("at step ")


@pytest.mark.parametrize(
    ("code", "status", "said"),
    [
        (3, "failed", "sys.exit(3): exit code 3"),
        ("bye", "failed", "sys.exit('bye'): exit code 1"),
        (0, "ok", None),
        ("caught", "ok", None),
        ("huge", "failed", "sys.exit(about 10**5000): exit code about 10**5000"),
    ],
)
def test_a_watched_script_ending_in_sys_exit_records_its_code(code, status, said, tmp_path):
    """The atexit hook cannot see the exit code: a script ending in sys.exit(3) was
    recorded ok. Here the script's end is played in this process: sys.exit, then the
    interpreter's atexit hook."""
    import sys

    from ampscope.watching import exits

    model, opt = tiny_model()
    mon = ampscope.watch(model, opt, runs_dir=tmp_path)
    for _ in range(2):
        loss = model(torch.randn(8, 32)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.step(loss)
    with pytest.raises(SystemExit):
        sys.exit({"caught": 5, "huge": 10**5000}.get(code, code))
    if code == "caught":  # the loop caught it and went on: its later end is its own
        mon.step(model(torch.randn(8, 32)).square().mean())
    exits._at_exit()
    done = events_of(mon.run_dir, ev.DoneEvent)[-1]
    assert done.status == status
    assert (said in (done.error or "")) if said else done.error is None
    assert getattr(sys.exit, "_ampscope_noting", False) is False  # put back with the last run


def test_steps_recorded_from_several_threads_are_each_numbered_once(tmp_path) -> None:
    """Before: four threads calling one monitor's step (a loop that records from its worker
    threads) could read the same step number, and the record held duplicate steps."""
    import sys
    import threading

    model, opt = tiny_model()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as Python lets them
    try:
        with ampscope.watch(model, opt, runs_dir=tmp_path) as mon:
            threads = [
                threading.Thread(target=lambda: [mon.step(float(i)) for i in range(2000)])
                for _ in range(4)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        sys.setswitchinterval(interval)
    run = records.load_run(mon.run_dir)
    steps = [e.step for e in run.events if isinstance(e, ev.StepEvent)]
    assert sorted(steps) == list(range(8000))
    assert run.done is not None and run.done.steps_done == 8000


def test_count_flops_that_counted_nothing_does_not_advise_count_flops(tmp_path: Path) -> None:
    """A step with no matmul, convolution or attention counts 0 FLOPs: the warning advised
    'count_flops=True' to a loop that had passed it; it says what was counted and what helps."""
    scale = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([scale], lr=0.1)
    with ampscope.watch(torch.nn.Identity(), opt, runs_dir=tmp_path, count_flops=True) as mon:
        for _ in range(2):
            loss = (scale * torch.randn(4)).square().sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.step(loss=loss)
    (said,) = [
        w.message for w in events_of(mon.run_dir, ev.WarningEvent) if w.code == "flops-unknown"
    ]
    assert "count_flops=True counted no FLOPs" in said and "flops_per_step=" in said
    assert "or count_flops=True" not in said
