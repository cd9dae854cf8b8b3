"""Does ``ampscope doctor --bench`` hold still on a loaded machine, and is its peak a peak?

Runs the CPU machine check twice back to back with this checkout and twice with an earlier
ampscope (``--before``, a git revision: its ``ampscope/`` is unpacked to a temporary folder),
all while ``--load`` busy loops keep cores occupied, and prints each figure of each check side
by side with how far the two checks lay apart. The goal (docs/machine-check.md): every figure of
the two checks agrees within 15 %, or a check says the machine was too busy to measure it
(and does not keep it as the machine's peak).

Then it times the layers a model runs: nn.Linear's forward (x @ W.T) at a few small widths in
each format, the fastest call of many, in this process and beside the same load. A kept peak
that such a layer beats is no peak: runs against it showed MFU above 100 %.

    python benchmarks/machine_check_steady.py [--before 590f8d2] [--load 1] [--pairs 1]

Every check is its own process with its own config folder; nothing here is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ampscope.core.machine import steady  # noqa: E402
from ampscope.core.machine.check import MachineCheck  # noqa: E402

FIGURES = ("fp32", "bf16", "fp16", "fp32 1 thread", "copy")
GOAL = 0.15


def unpack(rev: str, into: Path) -> Path:
    """``rev``'s ampscope package under ``into``, to run beside this checkout's."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "ampscope"], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def check(tree: Path, config: Path) -> dict[str, Any]:
    """One ``doctor --bench --bench-device cpu --json`` of the ampscope under ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree), XDG_CONFIG_HOME=str(config))
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "ampscope", "doctor", "--bench", "--bench-device", "cpu", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),
        timeout=600,
    )
    if done.returncode != 0:
        raise SystemExit(f"the check under {tree} failed:\n{done.stderr}")
    data = json.loads(done.stdout)
    data["wall_s"] = time.monotonic() - started
    return data


Figure = tuple[float, list[float], bool]
"""A figure (GFLOP/s, GB/s), its rounds (none before rounds), and whether the check kept it
as steady: its rounds agreed and other processes did not hold the CPUs it needed."""


def figures(data: dict[str, Any]) -> dict[str, Figure]:
    check = MachineCheck.from_json(data)
    busy = check.contended
    out = {
        fmt: (fig.tflops * 1e3, [r * 1e3 for r in fig.rounds], check.trusted(fmt))
        for fmt, fig in check.matmul.items()
    }
    if check.fp32_one_thread_tflops:
        rounds = [r * 1e3 for r in check.fp32_one_thread_rounds]
        out["fp32 1 thread"] = (
            check.fp32_one_thread_tflops * 1e3,
            rounds,
            steady.trusted(rounds) and not busy,
        )
    if check.memory_gbps:
        rounds = check.memory_rounds
        out["copy"] = (check.memory_gbps, rounds, steady.trusted(rounds) and not busy)
    return out


def fastest_layers(seconds: float = 1.0) -> dict[str, float]:
    """GFLOP/s of nn.Linear's forward at its fastest, over widths 64-512, batch 512."""
    import torch
    import torch.nn.functional as F

    best: dict[str, float] = {}
    for fmt, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        for width in (64, 128, 256, 512):
            x = torch.randn(512, width, dtype=dtype)
            w = torch.randn(width, width, dtype=dtype)
            F.linear(x, w)
            fastest, until = float("inf"), time.perf_counter() + seconds / 4
            while time.perf_counter() < until:
                start = time.perf_counter()
                F.linear(x, w)
                fastest = min(fastest, time.perf_counter() - start)
            best[fmt] = max(best.get(fmt, 0.0), 2 * 512 * width * width / fastest / 1e9)
    return best


def verdict(a: Figure, b: Figure) -> tuple[float, str, bool]:
    """How far two checks' figures lie apart, in words, and whether the goal holds."""
    apart = max(a[0], b[0]) / min(a[0], b[0]) - 1
    busy = [n for n, fig in ((1, a), (2, b)) if not fig[2]]
    if busy:
        return apart, f"said busy in check {' and '.join(map(str, busy))}", True
    if not a[1]:  # a check before rounds keeps every figure
        return apart, "kept both times" + (" (apart)" if apart > GOAL else ""), apart <= GOAL
    return apart, "steady, agree" if apart <= GOAL else "steady, APART", apart <= GOAL


def cell(fig: Figure) -> str:
    """'193.2 (14 %)': the figure and how far its median round fell below it, with the rounds
    it fitted when fewer than asked; 'busy' when the check did not keep it."""
    value, rounds, kept = fig
    gap = steady.spread(rounds)
    if gap is None:
        return f"{value:,.1f}"
    few = f" of {len(rounds)}" if len(rounds) < steady.ROUNDS else ""
    return f"{value:,.1f} ({steady.pct(gap)}{few}{'' if kept else ' busy'})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="590f8d2", help="the earlier ampscope's git revision")
    parser.add_argument("--load", type=int, default=1, help="busy loops beside the checks")
    parser.add_argument("--pairs", type=int, default=1, help="back-to-back pairs of each")
    args = parser.parse_args()
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            trees = {"before": unpack(args.before, Path(tmp) / "before"), "after": ROOT}
            load = os.getloadavg()[0]
            print(f"{args.load} busy loop(s) beside the checks; load average {load:.1f} at start")
            ok = True
            for pair in range(args.pairs):
                checks: dict[str, list[dict[str, Any]]] = {}
                for name, tree in trees.items():
                    checks[name] = [check(tree, Path(tmp) / f"{name}-{pair}-{i}") for i in (1, 2)]
                layers = fastest_layers()
                ok = report(checks, layers) and ok
            print(f"load average {os.getloadavg()[0]:.1f} at the end")
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    return 0 if ok else 1


def report(checks: dict[str, list[dict[str, Any]]], layers: dict[str, float]) -> bool:
    """The side-by-side table; True when 'after' meets the goal on every figure."""
    head = f"{'figure':<14}"
    for name in checks:
        head += f"  {name + ': check 1':>20} {'check 2':>14} {'apart':>6}  {'':<28}"
    print()
    print(head.rstrip())
    met = True
    for what in FIGURES:
        row = f"{what:<14}"
        for name, (one, two) in checks.items():
            a, b = figures(one).get(what), figures(two).get(what)
            if a is None or b is None:
                row += f"  {'-':>20} {'-':>14} {'':>6}  {'':<28}"
                continue
            apart, said, good = verdict(a, b)
            if name == "after":
                met = met and good
            row += f"  {cell(a):>20} {cell(b):>14} {steady.pct(apart):>6}  {said:<28}"
        print(row.rstrip())
    seconds = "; ".join(
        f"{name}: " + " and ".join(f"{c['wall_s']:.0f} s ({c['seconds']:.0f} s)" for c in both)
        for name, both in checks.items()
    )
    print(f"each check's wall time (its own 'seconds', without torch's import): {seconds}")
    busy = "; ".join(
        f"{name}: " + " and ".join(f"{c['other_cpus']:.1f}" for c in both)
        for name, both in checks.items()
        if all(c.get("other_cpus") is not None for c in both)
    )
    print(f"CPUs other processes kept busy during each check: {busy}")
    print("\nnn.Linear's forward at its fastest (widths 64-512, batch 512) against each kept peak:")
    for fmt, rate in layers.items():
        parts = []
        for name, both in checks.items():
            kept = [fig[0] for fig in (figures(c)[fmt] for c in both) if fig[2]]
            parts.append(
                f"{name} " + ", ".join(f"{rate / k:.2f}x" for k in kept) if kept else f"{name} -"
            )
        print(
            f"  {fmt:<5} {rate:8,.1f} GFLOP/s: {'; '.join(parts)} (above 1: beaten; -: none kept)"
        )
    print(
        f"\ngoal (every figure of the two checks within {steady.pct(GOAL)}, or said busy): "
        + ("met" if met else "NOT met")
    )
    return met


if __name__ == "__main__":
    sys.exit(main())
