"""What a user sees of each rank: the dashboard's strip and the summary table's rows."""

from __future__ import annotations

import pytest

from ampscope.cli.console import rank_rows, summary_table, where_it_runs
from ampscope.core import events as ev
from ampscope.tui.model.rank_table import RankTable
from ampscope.tui.widgets.ranks import render
from tests.helpers import hello, step

pytestmark = pytest.mark.unit


def ranks_hello(world: int, device: str = "cuda") -> ev.HelloEvent:
    devices = [
        ev.RankDevice(
            rank=r, host=f"node{r // 8}", device=f"{device}:{r % 8}", device_name="H100", pid=r
        )
        for r in range(world)
    ]
    return hello(world_size=world, backend="nccl", strategy="ddp", ranks=devices)


def rank_steps(i: int, times: list[float]) -> ev.StepEvent:
    ranks = [
        ev.RankStep(
            rank=r,
            step_ms=ms,
            loss=1.0,
            skipped=False,
            mem_allocated=(40 << 30) + r,
            mem_reserved=None,
            mem_peak=None,
        )
        for r, ms in enumerate(times)
    ]
    return step(i, ms=max(times), ranks=ranks)


def test_table_names_the_slowest_rank_and_its_lag_behind_the_median() -> None:
    table = RankTable()
    table.ingest(ranks_hello(4))
    for i in range(10):
        table.ingest(rank_steps(i, [100.0, 101.0, 130.0, 99.0]))
    slowest = table.slowest()
    assert slowest is not None and slowest.rank == 2
    assert slowest.median_ms == pytest.approx(100.5)  # median of 99, 100, 101, 130
    assert slowest.lag_ms == pytest.approx(29.5)
    rows = table.rows()
    assert [r.device for r in rows] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert rows[0].memory == 40 << 30 and rows[0].util is None


def test_sys_samples_give_each_gpu_its_memory_and_utilisation() -> None:
    table = RankTable()
    table.ingest(ranks_hello(2))
    table.ingest(rank_steps(0, [10.0, 11.0]))
    samples = [ev.RankSys(rank=r, gpu_util=90.0 + r, gpu_mem_used=(60 + r) << 30) for r in (0, 1)]
    table.ingest(ev.SysEvent(gpu_util=90.0, ranks=samples))
    rows = table.rows()
    assert [(r.util, r.memory, r.util_is_cpu) for r in rows] == [
        (90.0, 60 << 30, False),
        (91.0, 61 << 30, False),
    ]


def test_eight_ranks_fit_80_columns_in_three_lines_with_the_slowest_marked() -> None:
    table = RankTable()
    table.ingest(ranks_hello(8))
    table.ingest(rank_steps(0, [120.1, 120.4, 119.8, 124.5, 120.0, 120.2, 119.9, 120.3]))
    text = render(table, 80)
    lines = text.plain.split("\n")
    assert len(lines) == 3 and all(len(line) <= 80 for line in lines)
    assert lines[0] == (
        "8 ranks ddp/nccl · slowest r3 124.5 ms, +4.35 ms vs median · ms, GPU mem, util"
    )
    assert lines[1].split() == [
        *("r0", "120.1", "40G", "-", "r1", "120.4", "40G", "-"),
        *("r2", "119.8", "40G", "-", "r3", "124.5", "40G", "-"),
    ]
    marked = [text.plain[s.start : s.end] for s in text.spans if "reverse" in str(s.style)]
    assert marked == ["r3  124.5  40G    -"]


def test_many_ranks_show_the_slowest_and_how_many_are_left_out() -> None:
    table = RankTable()
    table.ingest(ranks_hello(64))
    times = [100.0] * 64
    times[37] = 180.0
    table.ingest(rank_steps(0, times))
    text = render(table, 80).plain
    lines = text.split("\n")
    assert len(lines) == 3 and all(len(line) <= 80 for line in lines)
    assert lines[1].split()[:2] == ["r37", "180.0"]  # the slowest first when not all fit
    assert text.endswith("+59 more")  # 3 cells a line (two-digit ranks), one left for the count


def test_one_process_shows_no_strip() -> None:
    table = RankTable()
    table.ingest(hello())
    table.ingest(step(0))
    assert not table.shown and table.rows() == []


def test_cpu_ranks_show_process_cpu_and_say_so() -> None:
    table = RankTable()
    table.ingest(ranks_hello(2, device="cpu"))
    table.ingest(rank_steps(0, [10.0, 12.0]))
    table.ingest(ev.SysEvent(ranks=[ev.RankSys(rank=r, proc_cpu=97.0) for r in (0, 1)]))
    assert render(table, 80).plain.split("\n")[0].endswith("ms, RSS, CPU")
    assert all(r.util_is_cpu and r.util == 97.0 for r in table.rows())


def test_summary_names_the_slowest_rank_and_whether_weights_agree() -> None:
    h = ranks_hello(2, device="cpu")
    assert where_it_runs(h) == "2 ranks (ddp over nccl): 2 x cpu (H100) on 1 host"
    done = ev.empty_done("ok")
    done.world_size = 2
    done.ranks = [
        ev.RankDone(rank=0, step_ms_median=10.0, mem_peak=1, skipped_steps=0, param_checksum="ab"),
        ev.RankDone(rank=1, step_ms_median=14.0, mem_peak=1, skipped_steps=0, param_checksum="ab"),
    ]
    rows = dict(rank_rows(done))
    assert rows["slowest rank"] == "rank 1: 14.0 ms (+2.00 ms over the median rank)"
    assert rows["weights"] == "identical on every rank (ab)"
    done.ranks[1].param_checksum = "cd"
    assert dict(rank_rows(done))["weights"] == "differ"
    assert "slowest rank" not in summary_table(ev.empty_done("ok"))


def test_a_records_strategy_and_backend_are_named_with_their_control_characters_spelled_out():
    """The strip draws its header as it is: an escape sequence a record gives as the
    strategy or the backend would reach the terminal raw."""
    table = RankTable()
    table.ingest(hello(world_size=2, strategy="ddp\x1b]0;pwned\x07", backend="[bold]\x1b[2J"))
    table.ingest(rank_steps(0, [10.0, 11.0]))
    line = render(table, 80).plain.splitlines()[0]
    assert line.startswith("2 ranks ddp\\x1b]0;pwned\\x07/[bold]\\x1b[2J · ")
