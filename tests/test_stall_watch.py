"""Naming the rank that holds the others up: the verdict on what rank 0 has seen, and how the
dashboard shows it until steps land again."""

from __future__ import annotations

import pytest

from ampscope.core import events as ev
from ampscope.engine.ranks.stall_watch import (
    COMPILE_STALL_S,
    Beacon,
    RankPosition,
    Seen,
    stall_verdict,
)
from ampscope.tui.model.figures import cards
from ampscope.tui.model.run_state import RunState
from tests.helpers import hello, step

pytestmark = pytest.mark.unit


def test_the_rank_behind_the_others_is_named_once_no_rank_moves() -> None:
    seen = {
        0: Seen(5, "backward", 100.0),
        1: Seen(5, "forward", 98.0),
        2: Seen(5, "backward", 99.0),
    }
    assert stall_verdict(seen, now=110.0, stall_s=20.0) is None  # 10 s: not yet
    message = stall_verdict(seen, now=125.0, stall_s=20.0)
    assert message == (
        "rank 1 has made no progress for 25 s, in forward of step 5, while ranks 0, 2 wait "
        "for it; s or Ctrl+C stops the job"
    )


def test_ranks_in_the_same_place_are_not_blamed() -> None:
    alike = {0: Seen(7, "forward", 0.0), 1: Seen(7, "forward", 0.0)}
    message = stall_verdict(alike, now=30.0, stall_s=20.0)
    assert message is not None and message.startswith("no rank has moved for 30 s")
    assert "every rank is in forward of step 7" in message


def test_a_rank_stuck_in_step_0_or_1_is_named_later_while_the_model_compiles() -> None:
    seen = {0: Seen(1, "backward", 0.0), 1: Seen(1, "forward", 0.0)}
    message = stall_verdict(seen, now=21.0, stall_s=20.0)  # eager: as for any step
    assert message is not None
    assert message.startswith("rank 1 has made no progress for 21 s, in forward of step 1")
    compiling = {0: Seen(0, "backward", 0.0), 1: Seen(0, "forward", 0.0)}
    assert stall_verdict(compiling, now=COMPILE_STALL_S - 1, stall_s=20.0, compiled=True) is None
    late = stall_verdict(compiling, now=COMPILE_STALL_S + 1, stall_s=20.0, compiled=True)
    assert late is not None and late.startswith("rank 1 has made no progress for 301 s")
    later = {0: Seen(2, "backward", 0.0), 1: Seen(2, "forward", 0.0)}  # compiled by now
    assert stall_verdict(later, now=21.0, stall_s=20.0, compiled=True) is not None


def test_a_rank_on_a_later_step_waits_for_one_still_on_the_step_before() -> None:
    seen = {0: Seen(9, "exchange", 0.0), 1: Seen(8, "optimizer", 0.0)}
    message = stall_verdict(seen, now=21.0, stall_s=20.0)
    assert message is not None and message.startswith("rank 1 has made no progress")
    assert "optimizer of step 8, while rank 0 waits" in message


class FakeStore:
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: str) -> None:
        self.data[key] = value.encode()

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def get(self, key: str) -> bytes:
        return self.data[key]


def test_rank_0s_beacon_reports_a_stall_once_then_anew_after_the_ranks_move() -> None:
    store, told = FakeStore(), []
    mine = RankPosition()
    beacon = Beacon(store, 0, 2, mine, told.append, stall_s=0.05, every_s=3600)
    beacon.close()  # its thread sleeps; the test drives it
    mine.mark(4, "backward")
    store.set("ampscope/progress/1", "4 forward")
    store.set("ampscope/progress/0", "4 backward")
    beacon._look()
    import time

    time.sleep(0.1)
    beacon._look()
    beacon._look()
    assert [w.code for w in told] == [ev.RANK_STALLED] and told[0].step == 4
    assert told[0].message.startswith("rank 1 has made no progress")
    store.set("ampscope/progress/1", "4 backward")  # it moved
    beacon._look()
    store.set("ampscope/progress/1", "4 forward")
    beacon._look()
    time.sleep(0.1)
    beacon._look()
    assert len(told) == 2


def test_the_dashboard_says_stalled_until_the_next_step_lands() -> None:
    state = RunState()
    state.ingest(hello(world_size=2))
    state.ingest(ev.PhaseEvent(phase="train", state="start", step=0))
    for i in range(3):
        state.ingest(step(i))
    message = "rank 1 has made no progress for 20 s, in forward of step 3, while rank 0 waits"
    state.ingest(ev.WarningEvent(code=ev.RANK_STALLED, message=message, step=3))
    assert state.header().startswith("stalled")
    elapsed = next(c for c in cards(state) if c.key == "elapsed")
    assert elapsed.sub == "rank 1 has made no progress for 20 s"
    state.ingest(step(3))
    assert state.header().startswith("training")


def test_a_stall_message_reaches_the_elapsed_card_with_its_control_characters_spelled_out():
    """A record's stall warning is what the card draws, segment for segment: an escape
    sequence in it would reach the terminal raw."""
    state = RunState()
    state.ingest(hello(world_size=2))
    state.ingest(ev.PhaseEvent(phase="train", state="start", step=0))
    state.ingest(step(0))
    message = "rank 1 \x1b]0;pwned\x07 has made no progress, in forward"
    state.ingest(ev.WarningEvent(code=ev.RANK_STALLED, message=message, step=1))
    elapsed = next(c for c in cards(state) if c.key == "elapsed")
    assert elapsed.sub == "rank 1 \\x1b]0;pwned\\x07 has made no progress"
