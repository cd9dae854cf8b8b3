"""How much CPU the dashboard spends on a fast event stream, and how far its display lags.

A fake source (no engine, no torch) feeds step events into the Run view at N steps/s,
headless with ``run_test``, for a few seconds per rate. Prints the UI process's CPU share
(process_time / wall time) and the lag between the stream's latest step and the step the
Run view last displayed.

    python benchmarks/ui_stream.py [--seconds 10] [--rates 100 1000] [--refresh 4]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ampscope.core import events as ev  # noqa: E402
from ampscope.tui.app import AmpscopeApp  # noqa: E402
from ampscope.tui.model.run_state import RunState  # noqa: E402
from ampscope.tui.widgets.plots import RunPlot  # noqa: E402
from tests.helpers import hello, step  # noqa: E402

TICK_S = 0.01


class StreamSource:
    """A run source the benchmark feeds by hand: no engine, no file."""

    def __init__(self) -> None:
        self.state = RunState(label="bench")

    def label(self) -> str:
        return ""

    def allows(self, control: str) -> bool | None:
        return False

    async def feed(self) -> None:
        await asyncio.Event().wait()

    async def stop(self) -> None:
        return

    async def restart(self) -> None:
        return


def fake_hello() -> ev.HelloEvent:
    return hello(
        run_id="bench",
        preset="bench",
        config={
            "name": "bench",
            "precision": "amp-fp16",
            "compile": "off",
            "steps": 10**9,
            "device": "cuda",
        },  # fmt: skip
        host="bench",
        started_at=time.time(),
        device="cuda:0",
        device_name="fake GPU",
        compute_dtype="float16",
        peak_tflops=100.0,
        param_count=10**8,
        flops_per_step=1e12,
        samples_per_step=16,
        tokens_per_step=16384,
    )


def fake_step(i: int, t: float) -> ev.StepEvent:
    """A 10 ms step with a spike every 500, the loss scale halving now and then."""
    return step(
        i,
        10.0 + (i % 17) * 0.3 + (40.0 if i % 500 == 0 else 0.0),
        loss=5.0 / (1 + i / 1000),
        loss_scale=2.0 ** (16 - (i // 2000) % 4),
        skipped=i % 997 == 0,
        samples_per_s=1600.0,
        tokens_per_s=1.6e6,
        tflops=95.0,
        mfu=0.5,
        mem_allocated=(20 << 30) + i,
        mem_reserved=24 << 30,
        mem_peak=22 << 30,
        t=t,
    )


async def measure(
    rate: int, seconds: float, refresh_hz: float, profile: cProfile.Profile | None = None
) -> dict[str, float]:
    app = AmpscopeApp(runs_dir=Path("/nonexistent-ampscope-bench"), refresh_hz=refresh_hz)
    lags: list[int] = []
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.3)
        source = StreamSource()
        state = source.state
        screen = app.open_run(source)
        await pilot.pause(0.3)
        state.ingest(fake_hello())
        state.ingest(ev.PhaseEvent(phase="train", state="start", step=0))
        sent = 0
        redraws0 = screen.redraws
        if profile is not None:
            profile.enable()
        cpu0, wall0 = time.process_time(), time.monotonic()
        next_sys = 0.0
        next_lag = 0.0
        while True:
            elapsed = time.monotonic() - wall0
            if elapsed >= seconds:
                break
            due = int(elapsed * rate)
            while sent < due:
                state.ingest(fake_step(sent, elapsed))
                sent += 1
            if elapsed >= next_sys:
                state.ingest(
                    ev.SysEvent(
                        t=elapsed,
                        gpu_util=97.0,
                        cpu_util=20.0,
                        proc_cpu=100.0,
                        gpu_mem_used=30 << 30,
                        gpu_mem_total=80 << 30,
                    )
                )
                next_sys += 1.0
            if elapsed >= next_lag and screen.displayed_step is not None:
                lags.append(sent - 1 - screen.displayed_step)
                next_lag += 0.1
            await asyncio.sleep(TICK_S)
        cpu = time.process_time() - cpu0
        wall = time.monotonic() - wall0
        if profile is not None:
            profile.disable()
        points = max(p.points_drawn for p in screen.query(RunPlot))
        redraws = screen.redraws - redraws0
    return {
        "rate": rate,
        "steps": sent,
        "wall": wall,
        "cpu": cpu,
        "share": cpu / wall,
        "lag_mean": statistics.mean(lags) if lags else float("nan"),
        "lag_max": max(lags) if lags else float("nan"),
        "redraws": redraws / wall,
        "points": points,
        "kept": len(state.steps),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rates", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--refresh", type=float, default=2.0, help="plot redraws a second")
    parser.add_argument(
        "--profile", type=int, metavar="N", help="print the N costliest functions of the stream"
    )
    args = parser.parse_args()
    profile = cProfile.Profile() if args.profile else None
    rows = [asyncio.run(measure(rate, args.seconds, args.refresh, profile)) for rate in args.rates]
    print(f"refresh {args.refresh:g} Hz, {args.seconds:g} s per rate, 120x40, headless")
    print(
        f"{'steps/s':>8} {'steps':>7} {'UI CPU':>7} {'redraw/s':>9} {'lag mean':>9} "
        f"{'lag max':>8} {'pts/plot':>9} {'kept':>6}"
    )
    for r in rows:
        print(
            f"{r['rate']:>8} {r['steps']:>7} {r['share']:>6.0%} {r['redraws']:>9.1f} "
            f"{r['lag_mean']:>9.1f} {r['lag_max']:>8} {r['points']:>9} {r['kept']:>6}"
        )
    print(
        "lag: stream's latest step minus the step the Run view last displayed, sampled "
        "every 0.1 s (at N steps/s one redraw period is N/refresh steps)."
    )
    if profile is not None:
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
