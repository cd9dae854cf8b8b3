"""Data-parallel scaling: step time at 1 and N processes, printed as efficiency.

Weak scaling keeps each rank's batch (the global batch grows N times): ideal is the same step
time, efficiency = t1 / tN. Strong scaling keeps the global batch (each rank takes 1/N of
it): ideal is 1/N of the step time, efficiency = t1 / (N tN). Each configuration is a real
``ampscope run`` (torchrun for N > 1) and the figures are the runs' own medians.

On a CPU the ranks share the cores and gloo all-reduces over loopback, so the numbers show the
mechanism, not a speed-up; on a multi-GPU machine they are the real figure. Every process gets
cores/N threads in every configuration (unless OMP_NUM_THREADS is set), so that the 1-process
run is one rank of the N-process job, alone: CPU threads oversubscribed by other work wait on
each other and would swamp the comparison.

    python benchmarks/scaling.py [PRESET] [--nproc 8] [--strategy ddp|fsdp2] [--steps 60]
                                 [--batch B] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ampscope.core import events as ev  # noqa: E402
from ampscope.core import presets  # noqa: E402
from ampscope.core.processes.launch import child_env  # noqa: E402


def median_step(
    preset: str, nproc: int, batch: int, steps: int, overrides: list[str], threads: int
) -> dict:
    """One run's done event as a dict (step time median, rates), or its failure."""
    sets = [*overrides, f"batch_size={batch}", f"steps={steps}"]
    cmd = [sys.executable, "-m", "ampscope", "run", preset, "--json", "--no-record"]
    cmd += ["--nproc-per-node", str(nproc)]
    for item in sets:
        cmd += ["--set", item]
    env = child_env()
    env.setdefault("OMP_NUM_THREADS", str(threads))
    proc = subprocess.run(cmd, capture_output=True, env=env, cwd=ROOT)
    for line in reversed(proc.stdout.splitlines()):
        event = ev.decode(line)
        if isinstance(event, ev.DoneEvent):
            return ev.to_dict(event)
    tail = proc.stderr.decode(errors="replace").strip().splitlines()[-3:]
    return {"status": "failed", "error": " | ".join(tail) or f"exit {proc.returncode}"}


def default_batch(preset: str, overrides: list[str]) -> int:
    import torch

    p = presets.load_preset(preset, overrides)
    on_cuda = p.device != "cpu" and torch.cuda.is_available()
    return presets.resolve_workload(p, on_cuda=on_cuda)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset", nargs="?", default="amp-bf16")
    parser.add_argument("--nproc", type=int, default=2, help="processes for the N-rank runs")
    parser.add_argument("--strategy", choices=("ddp", "fsdp2"), default="ddp")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, help="per-rank batch of the 1-process run")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    n = args.nproc
    overrides = [*args.overrides, f"parallel.strategy='{args.strategy}'"]
    overrides.append(f"warmup_steps={max(5, args.steps // 6)}")
    batch = args.batch or default_batch(args.preset, overrides)
    if batch % n:
        batch = max(n, batch - batch % n)  # strong scaling splits it evenly
    runs = {
        "1 process": (1, batch),
        f"{n} processes, weak (batch {batch} a rank)": (n, batch),
        f"{n} processes, strong (batch {batch // n} a rank)": (n, batch // n),
    }
    print(f"{args.preset}, {args.strategy}, {args.steps} steps, global batch at 1 process {batch}")
    results = {}
    for label, (nproc, per_rank) in runs.items():
        threads = max(1, (os.cpu_count() or 1) // n)
        results[label] = done = median_step(
            args.preset, nproc, per_rank, args.steps, overrides, threads
        )
        if done.get("status") != "ok" or not done.get("step_ms_median"):
            print(f"  {label:<44} failed: {done.get('error')}")
            continue
        print(
            f"  {label:<44} {done['step_ms_median']:9.2f} ms/step  "
            f"{done['samples_per_s']:12.1f} samples/s"
        )
    base, weak, strong = (results[k].get("step_ms_median") for k in runs)
    if base and weak:
        print(f"  weak scaling efficiency    {base / weak:6.1%}  (t1 / t{n}; ideal 100%)")
    if base and strong:
        print(
            f"  strong scaling efficiency  {base / (n * strong):6.1%}  (t1 / ({n} t{n}); ideal 100%)"
        )


if __name__ == "__main__":
    main()
