"""How long the dashboard takes to show its first screen, beside what any Textual app takes.

Each command runs in a pseudo-terminal of the given size, as over SSH: the clock starts before
the process is spawned and stops when the terminal receives the first screen's text (the
presets list's last shipped preset, for ampscope), then ctrl+q ends it. The peers, run
interleaved with it (A B C A B C ...), are ``python -c 'import textual'`` (the floor: Python
and Textual's import) and a minimal Textual app drawing one line (Textual's own first paint).

    python benchmarks/first_paint.py [--repeats 7] [--size 80x24] [--compile-each-start]
                                     [--beside DIR] [--instructions]

``--beside DIR`` times another checkout of ampscope (``git worktree add DIR REV``) in the
same rounds, as ``ampscope at DIR``: a change's before and after, side by side on one
machine under one load.

``--instructions`` counts, instead, the machine instructions each command runs to its first
screen, once each under ``valgrind --tool=callgrind`` (a minute or two): the process ends as
its terminal is sent the first screen's text. The load does not move them.

Prints each command's median wall time (and range) and CPU time to its first screen, and the
ratios to the peers. A shared machine moves the wall times most; the CPU times, and the
ratios measured side by side, move less. Compiled modules are cached (in a temporary folder,
filled by a first uncounted start), as in an installed package: ``--compile-each-start``
measures a source tree under ``PYTHONDONTWRITEBYTECODE=1`` instead.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import select
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent

MINIMAL_APP = """
from textual.app import App
from textual.widgets import Static

class Minimal(App):
    def compose(self):
        yield Static("first-paint-marker")

Minimal().run()
"""

TIMEOUT_S = 60.0

STOP_AT_MARKER = """
import os, runpy, sys
import textual.drivers.linux_driver as driver
marker, *argv = sys.argv[1:]
write = driver.LinuxDriver.write
def stop(self, data):
    if marker in data:
        os._exit(0)
    return write(self, data)
driver.LinuxDriver.write = stop
if argv[0] == "-m":
    sys.argv = argv[1:]
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
else:
    sys.argv = ["-c"]
    exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
"""
"""Runs ``python -m MODULE ...`` or ``python -c CODE`` and ends the process (os._exit) as
Textual writes the marker to the terminal: what is counted stops at the first screen."""


Command = tuple[list[str], bytes | None, Path]
"""argv, the bytes that mean the first screen is drawn (None: wait for the exit), and the
checkout it runs from."""


def commands(runs_dir: str, beside: Path | None = None) -> dict[str, Command]:
    py = sys.executable
    dashboard = [py, "-m", "ampscope", "--runs-dir", runs_dir]
    cmds: dict[str, Command] = {"ampscope (dashboard)": (dashboard, b"mlp-demo", ROOT)}
    if beside is not None:
        cmds[f"ampscope at {beside.name}"] = (dashboard, b"mlp-demo", beside)
    cmds["minimal Textual app"] = ([py, "-c", MINIMAL_APP], b"first-paint-marker", ROOT)
    cmds["python -c 'import textual'"] = ([py, "-c", "import textual"], None, ROOT)
    return cmds


def first_paint(
    argv: list[str],
    marker: bytes | None,
    size: tuple[int, int],
    pycache: str | None = None,
    root: Path = ROOT,
) -> tuple[float, float]:
    """Seconds from spawning ``argv`` in a pty of ``size`` to ``marker`` on its screen, and
    the CPU seconds the process had used by then (user + system: what a busy machine moves
    least).

    ``pycache``: where compiled modules are kept (as an installed package keeps them: pip
    compiles at install), whatever ``PYTHONDONTWRITEBYTECODE`` says; None: as the
    environment says (with it set, every start compiles ampscope's sources again).
    ``root``: the checkout whose ampscope runs (its folder is the working directory too, as
    ``python -m`` looks there first).
    """
    main, side = pty.openpty()
    cols, rows = size
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = dict(os.environ, TERM="xterm-256color", COLUMNS=str(cols), LINES=str(rows))
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache
    started = time.perf_counter()
    proc = subprocess.Popen(
        argv, stdin=side, stdout=side, stderr=side, env=env, cwd=root, start_new_session=True
    )
    os.close(side)
    seen = b""
    painted: tuple[float, float] | None = None
    try:
        while time.perf_counter() - started < TIMEOUT_S:
            ready, _, _ = select.select([main], [], [], 0.05)
            chunk = b""
            if ready:
                try:
                    chunk = os.read(main, 65536)
                except OSError:  # the process closed the terminal
                    chunk = b""
                seen = (seen + chunk)[-8192:]
                if marker is not None and marker in seen:
                    wall = time.perf_counter() - started
                    cpu = psutil.Process(proc.pid).cpu_times()
                    painted = wall, cpu.user + cpu.system
                    os.write(main, b"\x11")  # ctrl+q
                    break
            if marker is None:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    proc.returncode = os.waitstatus_to_exitcode(status)
                    painted = time.perf_counter() - started, usage.ru_utime + usage.ru_stime
                    break
            elif ready and not chunk and proc.poll() is not None:
                break
        if painted is None:
            raise RuntimeError(f"{argv[:3]} drew nothing recognisable in {TIMEOUT_S:.0f} s")
        return painted
    finally:
        _end(proc, main)


def instructions(
    argv: list[str], marker: bytes, size: tuple[int, int], pycache: str, root: Path
) -> int:
    """Machine instructions ``argv`` (``python -m ...`` or ``python -c ...``) runs to
    ``marker`` on its screen, counted by callgrind."""
    with tempfile.TemporaryDirectory() as out:
        counted = Path(out) / "callgrind.out"
        py, *rest = argv
        wrapped = [py, "-c", STOP_AT_MARKER, marker.decode(), *rest]
        first_paint(wrapped, None, size, pycache, root)  # fills the cache: not counted
        tool = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={counted}"]
        first_paint([*tool, *wrapped], None, size, pycache, root)
        totals = [ln for ln in counted.read_text().splitlines() if ln.startswith("totals:")]
        return int(totals[0].split()[1])


def _end(proc: subprocess.Popen, main: int) -> None:
    """Let it quit (ctrl+q was sent), drain its terminal, and kill what is left."""
    deadline = time.perf_counter() + 10.0
    while proc.poll() is None and time.perf_counter() < deadline:
        ready, _, _ = select.select([main], [], [], 0.1)
        if ready:
            try:
                os.read(main, 65536)
            except OSError:
                break
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    os.close(main)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--size", default="80x24", help="COLSxROWS of the terminal")
    parser.add_argument(
        "--compile-each-start",
        action="store_true",
        help="no compiled-module cache (as PYTHONDONTWRITEBYTECODE=1 leaves a source tree)",
    )
    parser.add_argument(
        "--beside",
        type=Path,
        metavar="DIR",
        help="another checkout of ampscope (git worktree add DIR REV), timed in the same rounds",
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count each command's machine instructions to its first screen (valgrind)",
    )
    args = parser.parse_args()
    cols, rows = (int(n) for n in args.size.lower().split("x"))
    beside = args.beside.resolve() if args.beside else None
    if args.instructions:
        return count_instructions((cols, rows), beside)
    with tempfile.TemporaryDirectory() as runs_dir, tempfile.TemporaryDirectory() as pycache:
        cache = None if args.compile_each_start else pycache
        cmds = commands(runs_dir, beside)
        walls: dict[str, list[float]] = {name: [] for name in cmds}
        cpus: dict[str, list[float]] = {name: [] for name in cmds}
        for argv, marker, root in cmds.values():  # a first start fills the cache: not counted
            first_paint(argv, marker, (cols, rows), cache, root)
        for _ in range(args.repeats):
            for name, (argv, marker, root) in cmds.items():
                wall, cpu = first_paint(argv, marker, (cols, rows), cache, root)
                walls[name].append(wall)
                cpus[name].append(cpu)
    how = "compiled modules cached" if cache else "compiling on each start"
    load = os.getloadavg()[0]
    print(
        f"first paint in a {cols}x{rows} pty, {how}, median of {args.repeats} "
        f"(interleaved), load {load:.1f} on {os.cpu_count()} cores:"
    )
    print(f"  {'':<28} {'wall':>7} {'(range)':>13} {'CPU':>7}")
    for name in cmds:
        ws, cs = walls[name], cpus[name]
        print(
            f"  {name:<28} {statistics.median(ws):6.2f}s ({min(ws):.2f}-{max(ws):.2f}) "
            f"{statistics.median(cs):6.2f}s"
        )
    *ampscopes, minimal, floor = list(cmds)
    for label, table in (("wall", walls), ("CPU", cpus)):
        for name in ampscopes:
            ours = statistics.median(table[name])
            print(
                f"{label}: {name} / minimal Textual app "
                f"{ours / statistics.median(table[minimal]):.2f}x; "
                f"/ import textual {ours / statistics.median(table[floor]):.2f}x"
            )
    return 0


def count_instructions(size: tuple[int, int], beside: Path | None) -> int:
    """Each command's instructions to its first screen, and the ratio to the minimal app."""
    global TIMEOUT_S
    TIMEOUT_S = 900.0  # callgrind runs a program some 50 times slower
    with tempfile.TemporaryDirectory() as runs_dir, tempfile.TemporaryDirectory() as pycache:
        cmds = commands(runs_dir, beside)
        counts = {
            name: instructions(argv, marker, size, pycache, root)
            for name, (argv, marker, root) in cmds.items()
            if marker is not None
        }
    cols, rows = size
    print(f"instructions to the first screen in a {cols}x{rows} pty (callgrind):")
    minimal = counts["minimal Textual app"]
    for name, count in counts.items():
        print(f"  {name:<28} {count / 1e6:8.0f} million  {count / minimal:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
