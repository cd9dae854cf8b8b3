"""A watched run whose record is deleted while it trains: said once, naming the folder."""

from __future__ import annotations

import shutil
import time
import warnings
from pathlib import Path

import pytest
import torch

import ampscope
from ampscope.watching import WatchWarning
from tests.helpers import tiny_model


def one_step(mon, model, opt) -> None:
    loss = model(torch.randn(8, 32)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    mon.step(loss, samples=8)


def said(caught: list) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, WatchWarning)]


@pytest.mark.slow
@pytest.mark.parametrize("what", ["runs folder", "events file"])
def test_a_record_deleted_mid_loop_is_said_once_and_the_loop_goes_on(
    tmp_path: Path, capsys, what: str
) -> None:
    model, opt = tiny_model()
    runs = tmp_path / "runs"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mon = ampscope.watch(model, opt, runs_dir=runs)
        for _ in range(3):
            one_step(mon, model, opt)
        time.sleep(0.3)  # the first lines are on disk
        assert mon.run_dir is not None
        if what == "runs folder":
            shutil.rmtree(runs)
        else:
            (mon.run_dir / "events.jsonl").unlink()
        deadline = time.monotonic() + 10
        while not said(caught) and time.monotonic() < deadline:
            one_step(mon, model, opt)
            time.sleep(0.05)
        for _ in range(30):  # a while longer: still said only once
            one_step(mon, model, opt)
            time.sleep(0.05)
        mon.close()
    (message,) = said(caught)
    assert f"the run record {mon.run_dir} was deleted while the run was live" in message
    assert "Your training goes on" in message
    if what == "runs folder":
        assert not runs.exists()  # nothing written back into it
    else:
        assert not (mon.run_dir / "live.json").exists()  # it is no live run any more
        assert not (mon.run_dir / "summary.json").exists()


@pytest.mark.unit
def test_a_full_disk_ends_the_watched_record_failed_with_the_reason_not_crashed(
    tmp_path: Path,
) -> None:
    """The engine's record keeps room for its end; a watched one kept none and read
    ``crashed``. Writes to /dev/full fail as on a full disk (ENOSPC)."""
    import os

    from ampscope.core import events as ev
    from ampscope.core import records
    from tests.helpers import events_of

    model, opt = tiny_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mon = ampscope.watch(model, opt, runs_dir=tmp_path)
        for _ in range(3):
            one_step(mon, model, opt)
        time.sleep(0.3)  # the first lines are on disk
        assert mon._record is not None and mon.run_dir is not None
        full = os.open("/dev/full", os.O_WRONLY)
        os.dup2(full, mon._record.events.fd)  # from now on, the disk is full
        os.close(full)
        for _ in range(20):
            one_step(mon, model, opt)
            time.sleep(0.02)
        mon.close()
    run_dir = mon.run_dir
    assert any("cannot write the run record" in m for m in said(caught))
    events, bad = records.read_events(run_dir / records.EVENTS_FILE)
    assert not bad and isinstance(events[-1], ev.DoneEvent)  # whole lines, done last
    done = events[-1]
    assert done.status == "failed" and "No space left on device" in (done.error or "")
    assert "your training went on" in (done.error or "")
    assert done.steps_done == 23  # the run's own figures: every step it trained
    (error,) = events_of(run_dir, ev.ErrorEvent)
    assert error.kind == "io"
    run = records.load_run(run_dir, with_events=False)  # summary.json, as runs lists it
    assert run.status == "failed"
    assert not (run_dir / ".spare").exists() and not (run_dir / records.LIVE_FILE).exists()
