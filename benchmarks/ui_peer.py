"""What watching a live run costs: ``ampscope attach`` against W&B LEET, side by side.

Each viewer follows a live run written at N steps/s by a writer process of its own kind (an
ampscope record for ampscope, an offline wandb run logging 8 scalars a step for LEET), in a
tmux window of each size. The figure is the CPU of the viewer's process tree (the tmux
pane's processes), user + system, over ``--seconds`` after a warm-up, as a share of one core.
``--repeats`` rounds run interleaved (viewers, sizes and rates in turn, the viewers' order
rotating each round); each figure is the median of its rounds.

    python benchmarks/ui_peer.py [--rates 100 1000] [--seconds 30] [--sizes 120x40 80x24]
                                 [--repeats 3] [--refresh 2] [--viewers ampscope leet] [--show]

LEET needs wandb, which ampscope does not depend on: it is installed in a venv of its own
(``--peer-venv``, made on first use with ``pip install wandb``). ``--viewers ampscope`` runs
without it. Needs tmux. A benchmark for people (a noisy, shared machine gives noisy figures):
run it on a quiet machine, and read the ratio rather than the absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ampscope.core import events as ev  # noqa: E402
from ampscope.core import records  # noqa: E402
from tests.helpers import hello, step  # noqa: E402

WARMUP_S = 5.0
FLUSH_S = 0.05
"""Writers flush about every 50 ms (how the engine writes its record)."""
SCALARS = ("loss", "step_ms", "loss_scale", "grad_norm", "samples_per_s", "tflops", "mfu", "lr")


# --------------------------------------------------------------------------- writers


def write_ampscope(run_dir: Path, rate: float) -> None:
    """An engine stand-in: hello, then step events at ``rate``, sys once a second, heartbeats."""
    run_dir.mkdir(parents=True, exist_ok=True)
    records.write_live(run_dir, os.getpid())
    started = time.monotonic()
    first = hello(
        run_id=run_dir.name,
        run_dir=str(run_dir),
        preset="peer-bench",
        config={"name": "peer-bench", "precision": "amp-fp16", "compile": "off", "steps": 10**9},
        pid=os.getpid(),
        host="bench",
        started_at=time.time(),
        device="cuda:0",
        device_name="stand-in GPU",
        compute_dtype="float16",
        peak_tflops=100.0,
        param_count=10**8,
        flops_per_step=1e12,
        samples_per_step=16,
        tokens_per_step=16384,
    )
    with (run_dir / records.EVENTS_FILE).open("wb") as out:
        out.write(ev.encode(first))
        sent, next_sys, next_beat = 0, 0.0, 1.0
        while True:
            elapsed = time.monotonic() - started
            lines = []
            while sent < int(elapsed * rate):
                lines.append(ev.encode(_step(sent, elapsed)))
                sent += 1
            if elapsed >= next_sys:
                lines.append(ev.encode(_sys(elapsed)))
                next_sys += 1.0
            if lines:
                out.write(b"".join(lines))
                out.flush()
            if elapsed >= next_beat:
                records.write_live(run_dir, os.getpid())
                next_beat += 1.0
            time.sleep(FLUSH_S)


def _step(i: int, t: float) -> ev.StepEvent:
    return step(
        i,
        10.0 + (i % 17) * 0.3,
        loss=5.0 / (1 + i / 1000),
        loss_scale=2.0 ** (16 - (i // 2000) % 4),
        skipped=i % 997 == 0,
        samples_per_s=1600.0,
        tokens_per_s=1.6e6,
        tflops=95.0,
        mfu=0.5,
        mem_allocated=(20 << 30) + (i % 50) * (1 << 20),
        mem_reserved=24 << 30,
        mem_peak=22 << 30,
        t=t,
    )


def _sys(t: float) -> ev.SysEvent:
    return ev.SysEvent(
        t=t,
        gpu_util=97.0,
        cpu_util=20.0,
        proc_cpu=100.0,
        gpu_mem_used=30 << 30,
        gpu_mem_total=80 << 30,
    )


WANDB_WRITER = """
import sys, time, wandb
rate, folder = float(sys.argv[1]), sys.argv[2]
run = wandb.init(mode="offline", dir=folder, project="ui-peer")
print(run.dir, flush=True)
start = time.monotonic(); sent = 0
while True:
    due = int((time.monotonic() - start) * rate)
    while sent < due:
        i = sent
        run.log({"loss": 5 / (1 + i / 1000), "step_ms": 10 + (i % 17) * 0.3,
                 "loss_scale": 2.0 ** (16 - (i // 2000) % 4), "grad_norm": 1.0,
                 "samples_per_s": 1600.0, "tflops": 95.0, "mfu": 0.5, "lr": 1e-3})
        sent += 1
    time.sleep(0.05)
"""


# --------------------------------------------------------------------------- measuring


def tree_cpu(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and every process below it."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def watch(
    command: str, size: tuple[int, int], seconds: float, env: dict[str, str], show: bool = False
) -> float:
    """Run ``command`` in a fresh tmux window; its process tree's CPU share over ``seconds``
    (``show``: print the screen it ended on, to see what was measured)."""
    session = f"uipeer{os.getpid()}"
    width, height = size
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", str(width), "-y", str(height)]
        + ["-c", str(ROOT)]  # python -m finds this tree's ampscope first, wherever it is run
        + [f"env {exports} {command}"],
        check=True,
    )
    try:
        pane = int(
            subprocess.check_output(
                ["tmux", "display-message", "-p", "-t", session, "#{pane_pid}"], text=True
            )
        )
        time.sleep(WARMUP_S)
        cpu0, wall0 = tree_cpu(pane), time.monotonic()
        time.sleep(seconds)
        cpu1, wall1 = tree_cpu(pane), time.monotonic()
        screen = subprocess.check_output(["tmux", "capture-pane", "-p", "-t", session], text=True)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)
    if not screen.strip():
        raise RuntimeError(f"the viewer showed nothing: {command}")
    if show:
        print(f"--- {command}\n{screen}", file=sys.stderr)
    return (cpu1 - cpu0) / (wall1 - wall0)


def measure_ampscope(rate: float, args: argparse.Namespace, work: Path) -> float:
    run_dir = work / f"peer-{int(rate)}"
    writer = subprocess.Popen(
        [sys.executable, __file__, "--write-ampscope", str(run_dir), "--rate", str(rate)]
    )
    try:
        deadline = time.monotonic() + 10
        while not (run_dir / records.EVENTS_FILE).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        command = (
            f"{shlex.quote(sys.executable)} -m ampscope --refresh {args.refresh:g} "
            f"attach {shlex.quote(str(run_dir))}"
        )
        return watch(command, args.size, args.seconds, {"PYTHONPATH": str(ROOT)}, args.show)
    finally:
        writer.terminate()
        writer.wait()


def peer_python(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not (venv / "bin" / "wandb").exists():
        print(f"installing wandb into {venv} (once) ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "wandb"], check=True)
    return python


def measure_leet(rate: float, args: argparse.Namespace, work: Path) -> float:
    python = peer_python(args.peer_venv)
    folder = work / f"wandb-{int(rate)}"
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "WANDB_SILENT": "true", "WANDB_MODE": "offline"}
    writer = subprocess.Popen(
        [str(python), "-c", WANDB_WRITER, str(rate), str(folder)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # wandb's helper processes go with it
    )
    try:
        assert writer.stdout is not None
        files_dir = Path(writer.stdout.readline().strip())  # .../run-*/files
        run_dir = files_dir.parent
        wandb = args.peer_venv / "bin" / "wandb"
        command = f"{shlex.quote(str(wandb))} leet run {shlex.quote(str(run_dir))}"
        return watch(command, args.size, args.seconds, {"WANDB_SILENT": "true"}, args.show)
    finally:
        os.killpg(writer.pid, signal.SIGTERM)
        writer.wait()


# --------------------------------------------------------------------------- main


def parse_size(text: str) -> tuple[int, int]:
    width, _, height = text.partition("x")
    return int(width), int(height)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[100, 1000])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument(
        "--sizes", type=parse_size, nargs="+", default=[(120, 40), (80, 24)], help="WIDTHxHEIGHT"
    )
    parser.add_argument("--repeats", type=int, default=1, help="interleaved rounds (medians)")
    parser.add_argument("--refresh", type=float, default=2.0, help="ampscope's plot redraws/s")
    parser.add_argument("--viewers", nargs="+", default=["ampscope", "leet"])
    parser.add_argument(
        "--peer-venv", type=Path, default=Path(tempfile.gettempdir()) / "ampscope-ui-peer-venv"
    )
    parser.add_argument("--show", action="store_true", help="print each viewer's last screen")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--write-ampscope", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write_ampscope:
        write_ampscope(args.write_ampscope, args.rate)
        return 0
    if shutil.which("tmux") is None:
        print("ui_peer: needs tmux", file=sys.stderr)
        return 2
    measures = {"ampscope": measure_ampscope, "leet": measure_leet}
    shares: dict[tuple[tuple[int, int], float, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="ampscope-ui-peer-") as tmp:
        for round_ in range(args.repeats):
            turn = round_ % len(args.viewers)
            viewers = args.viewers[turn:] + args.viewers[:turn]
            for size in args.sizes:
                args.size = size
                for rate in args.rates:
                    for viewer in viewers:
                        share = measures[viewer](rate, args, Path(tmp))
                        shares.setdefault((size, rate, viewer), []).append(share)
    rows = [
        {
            "size": f"{width}x{height}",
            "rate": rate,
            **{v: statistics.median(shares[((width, height), rate, v)]) for v in args.viewers},
            **{f"{v}_rounds": shares[((width, height), rate, v)] for v in args.viewers},
        }
        for width, height in args.sizes
        for rate in args.rates
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(
        f"{args.seconds:g} s after {WARMUP_S:g} s warm-up, ampscope at {args.refresh:g} Hz, "
        f"median of {args.repeats} interleaved; CPU of the viewer's process tree, % of one core"
    )
    print(f"{'size':>7} {'steps/s':>8} " + " ".join(f"{v:>9}" for v in args.viewers) + "   ratio")
    for row in rows:
        ratio = ""
        if "ampscope" in row and "leet" in row and row["leet"] > 0:
            ratio = f"{row['ampscope'] / row['leet']:.2f}x"
        cells = " ".join(f"{row[v] * 100:>8.1f}%" for v in args.viewers)
        print(f"{row['size']:>7} {row['rate']:>8g} {cells}   {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
