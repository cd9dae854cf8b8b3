"""What per-layer numerics cost: step times with numerics off, every 50 steps and every step.

One preset's setup, trained in interleaved blocks (off, every 50, every step, off, ...), each
mode with its own step counter so that "every 50" samples once every 50 of its own steps. A
block's time is its mean step (a median would hide the sampled steps). From "every step" the
cost of one sampled step follows, and with it the cost at any ``numerics.every``.

    python benchmarks/numerics_cost.py [PRESET] [--set key=value ...] [--blocks 6] [--block-steps 50]
    python benchmarks/numerics_cost.py fp32 --model [FILE.py:FUNCTION]

Figures are in docs/numerics.md ("What it costs").
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from ampscope.core import presets  # noqa: E402
from ampscope.engine.device import resolve_device  # noqa: E402
from ampscope.engine.lifecycle.loop import train_step  # noqa: E402
from ampscope.engine.numerics.hooks import NumericsProbe  # noqa: E402
from ampscope.engine.step.metrics import scaler_scale  # noqa: E402
from ampscope.engine.step.setup import build  # noqa: E402

DEFAULT_MODEL = str(Path(__file__).resolve().parent / "overhead_model.py") + ":make"
MODES = {"off": 0, "every 50": 50, "every step": 1}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset", nargs="?", default="fp32")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--block-steps", type=int, default=50)
    parser.add_argument("--model", nargs="?", const=DEFAULT_MODEL, help="a user's model factory")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    overrides = ["numerics.every=0", *args.overrides]
    if args.model:
        overrides.insert(0, f'workload.model="{args.model}"')
    preset = presets.load_preset(args.preset, overrides)
    info = resolve_device(preset.device)
    s = build(preset, info)
    events: list = []
    probes = {
        name: NumericsProbe(s.workload.model, info.device, events.append, every)
        for name, every in MODES.items()
        if every
    }
    counters = dict.fromkeys(MODES, 0)

    def step(mode: str) -> None:
        n = counters[mode]
        counters[mode] += 1
        probe = probes.get(mode)
        sampled = probe is not None and probe.wants(n)
        if sampled:
            probe.begin(n, scaler_scale(s.scaler, s.nan))
        train_step(s, n, measure_zeros=False)
        if sampled:
            probe.end(n)
        if probe is not None:
            probe.poll()

    def sync() -> None:
        if info.is_cuda:
            torch.cuda.synchronize()

    for mode in MODES:  # warm-up every path
        for _ in range(3):
            step(mode)
    sync()
    means: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}  # this process's CPU time
    for _ in range(args.blocks):
        for mode in MODES:
            sync()
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(args.block_steps):
                step(mode)
            sync()
            means[mode].append((time.perf_counter() - t0) * 1000 / args.block_steps)
            cpu[mode].append((time.process_time() - c0) * 1000 / args.block_steps)
    for probe in probes.values():
        probe.poll(wait=True)
    print(
        f"{preset.name} on {info.device}, {probes['every step'].total} leaf modules, "
        f"{args.blocks} blocks of {args.block_steps} steps a mode, interleaved"
    )
    for clock, table in (("wall", means), ("CPU", cpu)):  # CPU: less inflated by other work
        off = statistics.median(table["off"])
        sampled_cost = statistics.median(table["every step"]) - off
        print(f" by {clock} time:")
        for mode, values in table.items():
            ms = statistics.median(values)
            print(f"  {mode:<11} {ms:8.2f} ms a step   x{ms / off:.3f}")
        print(f"  one sampled step costs {sampled_cost:.2f} ms ({sampled_cost / off:.2f} steps)")
        for every in (10, 50, 100, 250):
            share = sampled_cost / every / off
            print(f"  numerics.every = {every:<4} costs {share:6.2%} of step time")
    print(f"  events: {len(events)}")


if __name__ == "__main__":
    main()
