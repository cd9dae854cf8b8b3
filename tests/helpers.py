"""What the dashboard tests share: driving the app headless and watching processes go."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from ampscope.core import comparison, records
from ampscope.core import events as ev
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.screens.presets import PresetsScreen

FAST = ["workload.kind='mlp'", "device='cpu'"]  # a small MLP: milliseconds a step on a CPU
SIZE = (120, 40)


def run(coro) -> None:
    asyncio.run(coro)


async def wait_for(pilot, cond: Callable[[], bool], timeout: float = 60.0) -> bool:
    """Let the app run until ``cond()`` holds; False if it still does not after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        await pilot.pause(0.2)
    return cond()


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.1)
    return gone(pid)


def select_preset(app: AmpscopeApp, name: str) -> None:
    screen = app.screen
    assert isinstance(screen, PresetsScreen)
    options = screen.query_one("#preset-list")
    options.highlighted = [p.name for p in screen.presets].index(name)
    options.focus()


# Fake events for feeding a RunState or writing a record by hand.


def hello(**kw) -> ev.HelloEvent:
    fields = dict(
        run_id="r",
        run_dir=None,
        preset="fp32",
        config={"precision": "fp32", "compile": "off", "steps": 100, "device": "cpu"},
        pid=1,
        host="h",
        started_at=0.0,
        python_version="3",
        torch_version="2",
        cuda_version=None,
        device="cpu",
        device_name="cpu",
        compute_capability=None,
        compute_dtype="float32",
        peak_tflops=None,
        peak_tflops_note="",
        param_count=1000,
        flops_per_step=1.0,
        samples_per_step=8,
        tokens_per_step=None,
    )
    fields.update(kw)
    return ev.HelloEvent(**fields)


def step(i: int, ms: float = 10.0, **kw) -> ev.StepEvent:
    fields = dict(
        step=i,
        step_ms=ms,
        loss=2.0 / (i + 1),
        loss_scale=None,
        skipped=False,
        grad_norm=1.0,
        samples_per_s=800.0,
        tokens_per_s=None,
        tflops=0.5,
        mfu=None,
        mem_allocated=100 << 20,
        mem_reserved=200 << 20,
        mem_peak=150 << 20,
        grad_zero_frac=None,
        lr=1e-3,
        t=1.0 + i * 0.01,
    )
    fields.update(kw)
    return ev.StepEvent(**fields)


# Simulated benches with a known truth, for the speed verdict.

RUN_SIGMA = 0.02  # run-to-run spread of one run's median step time (log scale): 2 %


def simulated_bench(rng: random.Random, repeats: int, log_speedup: float) -> comparison.Row:
    """Two presets benched ``repeats`` times, interleaved, through the real comparison code.

    Every run's median step time is 100 ms x exp(machine drift of its repeat + its own
    noise), both normal with sd RUN_SIGMA; the second preset is truly exp(log_speedup) times
    faster. The drift is shared by the two runs of a repeat, as interleaving intends.
    """
    base, other = [], []
    for _ in range(repeats):
        drift = rng.gauss(0.0, RUN_SIGMA)
        for runs, truth in ((base, 0.0), (other, log_speedup)):
            ms = 100.0 * math.exp(drift + rng.gauss(0.0, RUN_SIGMA) - truth)
            d = ev.empty_done("ok")
            d.step_ms_median = d.step_ms_p10 = d.step_ms_p90 = ms
            runs.append(records.RunRecord(path=Path("/sim"), done=d))
    rows = [comparison.row_from_runs("a", base), comparison.row_from_runs("b", other)]
    return comparison.compare(rows, "a")[1]


def verdict_rate(repeats: int, log_speedup: float, trials: int, seed: int) -> float:
    """How often the table calls the second preset faster or slower (significant)."""
    rng = random.Random(seed)
    called = 0
    for _ in range(trials):
        row = simulated_bench(rng, repeats, log_speedup)
        if row.significant and (log_speedup == 0 or (row.speedup or 0) > 1):
            called += 1
    return called / trials
