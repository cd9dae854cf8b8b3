"""What a long run costs in memory: a run's books and the reading of its record, side by side.

Each figure is measured in a fresh process (its peak RSS is then its own):

- books: N steps through the engine's reporter (``engine.step.metrics.StepReporter`` and its
  ``core.records.tally.StepTally``) and through a watched loop's (``watching.reporting``), with
  no training around them: RSS added a step, CPU time a step, and ``done``'s median against
  the exact one of the same step times;
- record: a synthetic record of N steps (2,450 a second, a sys sample every 0.5 s, as the soak
  test's tiny model ran), opened as History opens one (``RecordSource``) and as a replay
  (``ReplaySource``, played to its end): peak RSS over the process's own, seconds, and RSS
  after the view let go of it;
- engine (``--engine-steps N``): a real engine run of N steps of a tiny MLP on the CPU, no
  record: RSS added a step between its 10th percent and its end.

    python benchmarks/long_runs.py [--steps 1000000] [--engine-steps 0] [--keep DIR]

Measured on the shared two-core VM under a load of 12 (1,000,000 steps; before: the books
in Python lists, the record read whole and ingested): the books held 80.4 B a step (engine)
and 23.9 B (watched) before, 1.4 and 1.7 B after (the buffers of unfolded values filling,
then nothing); History opened the record in 11.2 s with a peak 515 MB over its start before,
4.4 s and 22 MB after; the replay 11.9 s and 530 MB before, 5.6 s and 22 MB after. Each
step's event and tally entry cost 4.5 us of CPU in the engine's reporter after, 6.4 us
before (best of 7 blocks of 50,000 steps).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# --------------------------------------------------------------------------- in a child


def books(which: str, count: str) -> dict:
    """N synthetic steps through one front door's books."""
    steps = int(count)
    import gc

    import numpy as np

    nan = math.nan
    rng = random.Random(0)
    times = [0.4 * (1 + 0.1 * rng.random()) for _ in range(1000)]
    if which == "engine":
        from types import SimpleNamespace

        from ampscope.core.records.tally import StepTally
        from ampscope.engine.ranks.link import RankFigures
        from ampscope.engine.step.metrics import StepReporter

        setup = SimpleNamespace(
            policy=SimpleNamespace(use_scaler=False),
            preset=SimpleNamespace(lr=1e-3),
            flops=SimpleNamespace(per_step=1e9),
            workload=SimpleNamespace(samples_per_step=8, tokens_per_step=None),
        )
        tally = StepTally(warmup_steps=5)
        reporter = StepReporter(
            setup, SimpleNamespace(emit=lambda e, urgent=False: None), tally, None
        )  # type: ignore[arg-type]
        figures = RankFigures(0, 0, 0.4, [2.0, 1.0, nan, nan, nan], 100 << 20, None, None, 0.39)

        def one(i: int) -> None:
            ms = times[i % 1000] + i * 1e-12  # a new float each step, as a clock gives
            reporter.report([figures._replace(step=i, step_ms=ms, cpu_ms=ms * 0.98)])

        def done() -> float | None:
            return tally.done("ok", 1e9, None, samples=8).step_ms_median
    else:
        from ampscope.core.records.tally import StepTally
        from ampscope.watching.messages import StepNotes
        from ampscope.watching.readout import StepValues
        from ampscope.watching.reporting import StepReport

        tally = StepTally(5)
        report = StepReport(tally, StepNotes("fp32"), lambda e, urgent=False: None, lambda: None)

        def one(i: int) -> None:
            ms = times[i % 1000] + i * 1e-12
            report.report(StepValues(i, ms, 2.0, nan, nan, nan, nan, None, 8, 1e-3), 1e9)

        def done() -> float | None:
            return tally.done("ok", 1e9, None).step_ms_median

    for i in range(1000):
        one(i)
    gc.collect()
    base, cpu = rss(), time.process_time()
    for i in range(1000, steps):
        one(i)
    cpu = time.process_time() - cpu
    gc.collect()
    grown = rss() - base
    median = done()
    every = np.arange(steps)
    exact = float(np.median((np.array(times)[every % 1000] + every * 1e-12)[5:]))
    return {
        "bytes_a_step": grown / (steps - 1000),
        "us_a_step": cpu / (steps - 1000) * 1e6,
        "median_error": abs((median or 0.0) - exact) / exact,
    }


def record(which: str, run_dir: str) -> dict:
    """Open a record as History (``record``) or a replay (``replay``) does, to its end."""
    import asyncio
    import gc

    from ampscope.tui.model.replay import RecordSource, ReplaySource

    base = rss()
    t0 = time.perf_counter()
    if which == "record":
        source: RecordSource | ReplaySource = RecordSource.load(Path(run_dir))
        asyncio.run(source.feed())
    else:
        replay = ReplaySource.load(Path(run_dir), speed=100.0)

        async def to_the_end() -> None:
            task = asyncio.create_task(replay.feed())
            while replay.run_dir is not None:
                await asyncio.sleep(0.01)
            replay.seek_fraction(1.0)
            task.cancel()

        asyncio.run(to_the_end())
        source = replay
    seconds = time.perf_counter() - t0
    steps = source.state.step
    held = rss()
    del source
    gc.collect()
    return {
        "seconds": seconds,
        "peak_mb": (peak_rss() - base) / 2**20,
        "held_mb": (held - base) / 2**20,
        "after_mb": (rss() - base) / 2**20,
        "last_step": steps,
    }


def engine(count: str) -> dict:
    """A real run of a tiny MLP: RSS at a tenth of the way and at the end."""
    steps = int(count)
    from ampscope.core import events as ev
    from ampscope.engine.lifecycle.run import run

    marks: dict[int, int] = {}
    tenth = steps // 10

    def watch(event: ev.Event) -> None:
        if isinstance(event, ev.StepEvent) and event.step in (tenth, steps - 1):
            marks[event.step] = rss()

    overrides = [
        "workload.kind='mlp'", "device='cpu'", "workload.width=16", "workload.layers=2",
        "batch_size=4", "telemetry_hz=1", f"steps={steps}", "warmup_steps=5",
    ]  # fmt: skip
    t0 = time.perf_counter()
    run("fp32", overrides, record=False, on_event=watch)
    seconds = time.perf_counter() - t0
    grown = marks[steps - 1] - marks[tenth]
    return {"bytes_a_step": grown / (steps - 1 - tenth), "steps_a_second": steps / seconds}


# --------------------------------------------------------------------------- the parent


def write_record(run_dir: Path, steps: int) -> None:
    """A synthetic engine record: its steps at 2,450 a second, sys samples twice a second."""
    from ampscope.core import events as ev
    from tests.helpers import done, hello

    run_dir.mkdir(parents=True)
    rng = random.Random(0)
    with open(run_dir / "events.jsonl", "wb") as fh:
        fh.write(ev.encode(ev.PhaseEvent(phase="setup", state="start", t=0.0)))
        config = {"precision": "fp32", "compile": "off", "steps": steps, "device": "cpu"}
        fh.write(ev.encode(hello(t=2.0, config=config)))
        t, next_sys, lines = 2.5, 2.5, []
        for i in range(steps):
            ms = 0.4 * (1 + 0.1 * rng.random()) * (3 if i % 50_000 == 7 else 1)
            t += ms / 1000
            step = ev.StepEvent(
                step=i, step_ms=round(ms, 4), loss=2.0 / (1 + i / 1000), loss_scale=None,
                skipped=i % 200_000 == 100, grad_norm=1.0, samples_per_s=8000 / ms,
                tokens_per_s=None, tflops=0.01, mfu=None, mem_allocated=100 << 20,
                mem_reserved=None, mem_peak=None, grad_zero_frac=None, lr=1e-3,
                cpu_ms=round(ms * 0.98, 4), t=round(t, 4),
            )  # fmt: skip
            lines.append(ev.encode(step))
            if t >= next_sys:
                next_sys += 0.5
                lines.append(ev.encode(ev.SysEvent(cpu_util=90.0, proc_rss=300 << 20, t=t)))
            if len(lines) >= 10_000:
                fh.write(b"".join(lines))
                lines = []
        fh.write(b"".join(lines))
        end = done(steps=steps)
        end.t = round(t + 0.01, 4)
        fh.write(ev.encode(end))


def child(*argv: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", *argv], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--engine-steps", type=int, default=0)
    parser.add_argument("--keep", help="write the synthetic record here and keep it")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        what, *rest = args.child
        result = {"books": books, "record": record, "engine": engine}[what](*rest)
        print(json.dumps(result))
        return

    steps = args.steps
    print(f"{steps:,} steps, each figure in a fresh process")
    for which in ("engine", "watch"):
        b = child("books", which, str(steps))
        print(
            f"  books, {which:<6}  {b['bytes_a_step']:6.1f} B a step  {b['us_a_step']:5.2f} us a "
            f"step (CPU)  median off by {b['median_error']:.4%}"
        )
    where = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="ampscope-long-"))
    run_dir = where / "20260101T000000Z-long"
    try:
        if not run_dir.exists():
            write_record(run_dir, steps)
        size = (run_dir / "events.jsonl").stat().st_size
        print(f"  record: {size / 2**20:.0f} MB ({size / steps:.0f} B a step)")
        for which, name in (("record", "History "), ("replay", "replay  ")):
            r = child("record", which, str(run_dir))
            print(
                f"  {name}  peak +{r['peak_mb']:5.0f} MB  {r['seconds']:5.1f} s  held "
                f"{r['held_mb']:4.0f} MB  after closing {r['after_mb']:4.0f} MB  (to step "
                f"{r['last_step']})"
            )
    finally:
        if not args.keep:
            shutil.rmtree(where, ignore_errors=True)
    if args.engine_steps:
        e = child("engine", str(args.engine_steps))
        print(
            f"  engine run  {e['bytes_a_step']:6.1f} B a step over {args.engine_steps:,} steps "
            f"({e['steps_a_second']:.0f} steps a second)"
        )


if __name__ == "__main__":
    main()
