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

pytestmark = pytest.mark.unit


def one_step(mon, model, opt) -> None:
    loss = model(torch.randn(8, 32)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    mon.step(loss, samples=8)


def said(caught: list) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, WatchWarning)]


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
