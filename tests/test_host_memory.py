"""CPU peak memory is the process's true peak, and `ampscope memory --run` compares it."""

from __future__ import annotations

import pytest
import torch

from ampscope.cli.main import main
from ampscope.core import events as ev
from ampscope.core.memory import host as host_memory
from ampscope.core.memory.host import HostPeak
from ampscope.engine.lifecycle.run import EXIT_OK, run
from ampscope.engine.step.metrics import MemoryReader
from tests.helpers import events_of

MIB = 1 << 20


def allocate_and_free(mib: int) -> None:
    """A step's transient: touched (so resident), then freed before anything reads RSS."""
    block = torch.ones(mib * MIB // 4)
    del block


@pytest.mark.unit
def test_the_peak_sees_what_a_step_allocates_and_frees_inside_itself() -> None:
    reader = MemoryReader(torch.device("cpu"))
    before, _, _ = reader.read()
    allocate_and_free(256)
    after, _, peak = reader.read()
    assert before is not None and after is not None and peak is not None
    assert peak >= before + 200 * MIB  # the 256 MiB block, gone from RSS, is in the peak
    assert after < before + 200 * MIB  # ... and RSS read after the "step" missed it
    assert reader.host.exact  # this Linux lets the high-water mark be reset


@pytest.mark.unit
def test_the_peak_starts_again_after_setup() -> None:
    allocate_and_free(256)  # "setup": not the training's peak
    peak = HostPeak()
    peak.reset()
    rss, high = peak.read()
    assert high < rss + 100 * MIB


@pytest.mark.unit
def test_where_clear_refs_is_not_writable_the_peak_is_the_largest_rss_read(tmp_path) -> None:
    locked = tmp_path / "no-such-dir" / "clear_refs"
    peak = HostPeak(clear_refs=locked)
    peak.reset()
    assert not peak.exact
    rss, high = peak.read()
    assert high >= rss > 0
    assert host_memory.read_status(tmp_path / "missing") == (None, None)


@pytest.mark.unit
def test_status_is_read_in_bytes(tmp_path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n")
    assert host_memory.read_status(status) == (1024 * 1024, 2048 * 1024)


@pytest.mark.slow
def test_memory_run_on_a_cpu_record_compares_rss_growth_with_the_plan(tmp_path, capsys) -> None:
    """End to end: the engine writes rss_before_model and a true peak; `memory --run` sets
    the growth beside the planner's total."""
    overrides = ["device='cpu'", "steps=3", "warmup_steps=1", "batch_size=4"]
    assert run("fp32", overrides, runs_dir=tmp_path) == EXIT_OK
    (run_dir,) = tmp_path.iterdir()
    (hello,) = events_of(run_dir, ev.HelloEvent)
    steps = events_of(run_dir, ev.StepEvent)
    assert hello.rss_before_model and hello.rss_before_model > 50 * MIB
    assert all(s.mem_peak and s.mem_allocated and s.mem_peak >= s.mem_allocated for s in steps)
    assert main(["memory", "--run", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "RSS growth since before the model was built" in out
    assert "not compared: the plan (" in out and "nothing: no tensor-only figure" not in out


@pytest.mark.unit
def test_a_watched_cpu_loop_records_rss_before_its_model_and_a_true_peak(tmp_path) -> None:
    import ampscope

    model = torch.nn.Linear(512, 512)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with ampscope.watch(model, opt, runs_dir=tmp_path, steps=3) as mon:
        for _ in range(3):
            allocate_and_free(128)  # inside the step, freed before the monitor reads
            loss = model(torch.randn(4, 512)).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.step(loss)
    (hello,) = events_of(mon.run_dir, ev.HelloEvent)
    weights = 512 * 513 * 4
    # The model's bytes are left out. In a long-lived process the loop's own allocations can
    # reuse freed pages, so RSS need not grow past the watch() call: allow a few pages.
    slack = 64 * 1024
    assert hello.rss_before_model
    assert hello.rss_before_model <= host_memory.current_rss() - weights + slack
    done = events_of(mon.run_dir, ev.DoneEvent)[-1]
    assert done.mem_peak and done.mem_peak > hello.rss_before_model + 100 * MIB
