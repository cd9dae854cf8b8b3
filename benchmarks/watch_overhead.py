"""What watching a training loop costs: bare, ampscope.watch, wandb.log, TensorBoard, side by side.

One user loop (an MLP on the CPU, about 20 ms a step by default) runs in blocks of steps,
interleaved ABCD: bare; with ``ampscope.watch`` (``mon.step(loss, ...)``); with ``wandb.log``
of 8 scalars (offline); with TensorBoard's ``SummaryWriter.add_scalar`` of the same 8 scalars.
It prints each loop's step time against the bare one, and the host time per step of the
logging call (``mon.step``; ``wandb.log``; the 8 ``add_scalar`` calls; with the ``.item()`` calls
the last two need), medians over all steps, two ways:

- in the loop, beyond bare: the call and the loop's next line (``loss.item()``) timed together,
  less the same line alone in the bare loop. Whatever runs first after torch's kernels pays for
  caches they evicted and, with few cores, for torch's spinning worker threads; the bare loop's
  next line pays that too, so the difference is what the call adds. Wall time, and the
  training thread's CPU time, which other processes on a shared machine inflate less;
- the call alone: back to back, without the step around it.

    python benchmarks/watch_overhead.py [--width 512] [--batch 256] [--blocks 10] [--block-steps 20]
    python benchmarks/watch_overhead.py --install   # wandb and tensorboard into a venv of its own

ampscope never installs wandb or tensorboard. Without them a row says it was skipped; with
``--install`` this script creates ``benchmarks/.venv-watch-overhead`` (the current environment's
packages stay visible through a .pth file), installs both there, and runs itself again inside.
"""

from __future__ import annotations

import argparse
import os
import site
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
VENV = Path(__file__).resolve().parent / ".venv-watch-overhead"
SCALARS = ("loss", "lr", "grad_norm", "loss_scale", "step", "samples", "tokens", "epoch")


def install_and_rerun(argv: list[str]) -> int:
    """A venv beside this script with wandb and tensorboard; this environment stays as it was."""
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        purelib = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        parents = [
            p for p in site.getsitepackages() + [site.getusersitepackages()] if Path(p).is_dir()
        ]
        Path(purelib, "parent-environment.pth").write_text("\n".join(parents) + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "wandb", "tensorboard"], check=True)
    rest = [a for a in argv if a != "--install"]
    return subprocess.run([str(python), __file__, *rest]).returncode


def make_loop(width: int, batch: int, layers: int):
    import torch

    torch.manual_seed(0)
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*blocks, torch.nn.Linear(width, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(batch, width)
    y = torch.randint(0, 10, (batch,))

    def step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss, norm

    return model, opt, step


def loggers(model, opt, batch: int, tmp: Path) -> tuple[dict[str, Callable | str], Callable]:
    """Each loop's logging call (or why it is skipped), and what ends them all."""
    import ampscope

    mon = ampscope.watch(model, opt, name="overhead", runs_dir=tmp / "runs")
    out: dict[str, Callable | str] = {
        "bare": lambda step, loss, norm: None,
        "ampscope.watch": lambda step, loss, norm: mon.step(
            loss, samples=batch, tokens=batch, grad_norm=norm
        ),
    }

    def values(step, loss, norm):
        return dict(
            zip(
                SCALARS, (loss.item(), 1e-3, norm.item(), 1.0, step, batch, batch, 0.0), strict=True
            )
        )

    try:
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        wandb.init(mode="offline", dir=str(tmp), project="watch-overhead")
        out["wandb.log"] = lambda step, loss, norm: wandb.log(values(step, loss, norm), step=step)
    except ImportError:
        out["wandb.log"] = (
            "skipped: wandb is not installed (--install puts it in a venv of its own)"
        )
    try:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(tmp / "tb"))

        def tensorboard(step, loss, norm):
            for key, value in values(step, loss, norm).items():
                writer.add_scalar(key, value, step)

        out["tensorboard"] = tensorboard
    except ImportError:
        out["tensorboard"] = (
            "skipped: tensorboard is not installed (--install puts it in a venv of its own)"
        )

    def close() -> None:
        mon.close()
        if "wandb" in sys.modules:
            sys.modules["wandb"].finish()

    return out, close


def call_alone(log: Callable, step_fn: Callable, calls: int = 2000) -> float:
    """The logging call back to back, without the step around it: its own cost, median µs.

    In the loop, the call runs right after torch's kernels, on caches they evicted and, on a
    machine with few cores, beside torch's spinning worker threads; that can slow any Python
    there ten times over. Alone, it shows what the call itself asks of the interpreter.
    """
    loss, norm = step_fn()
    times = []
    for i in range(calls):
        t0 = time.perf_counter_ns()
        log(i, loss, norm)
        times.append((time.perf_counter_ns() - t0) / 1e3)
    return statistics.median(times)


def interleaved(runnable: dict, step_fn: Callable, blocks: int, block_steps: int) -> dict:
    """Per loop: median step time (ms), and wall and CPU µs of the call plus the next line."""
    out = {name: {"step_ms": [], "wall": [], "cpu": []} for name in runnable}
    step = 0
    for block in range(blocks + 1):  # the first round warms every path up
        for name, log in runnable.items():
            t0 = time.perf_counter()
            for _ in range(block_steps):
                loss, norm = step_fn()
                h0, c0 = time.perf_counter_ns(), time.thread_time_ns()
                log(step, loss, norm)
                loss.item()  # the loop's next line, whatever it is
                if block:
                    out[name]["wall"].append((time.perf_counter_ns() - h0) / 1e3)
                    out[name]["cpu"].append((time.thread_time_ns() - c0) / 1e3)
                step += 1
            if block:
                out[name]["step_ms"].append((time.perf_counter() - t0) / block_steps * 1e3)
    return {name: {k: statistics.median(v) for k, v in m.items()} for name, m in out.items()}


def table(calls: dict, measured: dict, alone: dict) -> None:
    bare = measured["bare"]
    net = {
        name: (max(m["wall"] - bare["wall"], 0.1), max(m["cpu"] - bare["cpu"], 0.1))
        for name, m in measured.items()
    }
    watch = net["ampscope.watch"]
    print(
        "| loop | step time | vs bare | host time per step, in the loop beyond bare: wall / CPU | the call alone |"
    )
    print("|---|---|---|---|---|")
    for name, log in calls.items():
        if not callable(log):
            print(f"| {name} | {log} | | | |")
            continue
        m = measured[name]
        wall, cpu = net[name]
        in_loop = f"{wall:.1f} / {cpu:.1f} µs"
        apart = f"{alone[name]:.1f} µs"
        if name == "bare":
            in_loop = f"(the next line alone: {m['wall']:.1f} / {m['cpu']:.1f} µs)"
        elif name != "ampscope.watch":
            in_loop += f" ({wall / watch[0]:.0f}x / {cpu / watch[1]:.0f}x)"
            apart += f" ({alone[name] / alone['ampscope.watch']:.0f}x)"
        ratio = m["step_ms"] / bare["step_ms"]
        print(f"| {name} | {m['step_ms']:.2f} ms | {ratio:.3f} | {in_loop} | {apart} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--block-steps", type=int, default=20)
    parser.add_argument("--install", action="store_true", help="wandb and tensorboard in a venv")
    args = parser.parse_args()
    if args.install:
        return install_and_rerun(sys.argv[1:])

    import torch

    model, opt, step_fn = make_loop(args.width, args.batch, args.layers)
    with tempfile.TemporaryDirectory() as tmp:
        calls, close = loggers(model, opt, args.batch, Path(tmp))
        runnable = {k: v for k, v in calls.items() if callable(v)}
        measured = interleaved(runnable, step_fn, args.blocks, args.block_steps)
        alone = {name: call_alone(log, step_fn) for name, log in runnable.items()}
        close()
    print(
        f"MLP {args.layers}x{args.width}, batch {args.batch}, torch {torch.__version__} on the CPU "
        f"({torch.get_num_threads()} threads, {os.cpu_count()} CPUs); {args.blocks} blocks x "
        f"{args.block_steps} steps per loop, interleaved. Medians; (Nx): that many times "
        "ampscope.watch's.\n"
    )
    table(calls, measured, alone)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
