"""What the dashboard tests share: driving the app headless and watching processes go."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import math
import os
import random
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import psutil

from ampscope.cli.main import main
from ampscope.core import comparison, records
from ampscope.core import events as ev
from ampscope.core.processes import ownership
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.screens.presets import PresetsScreen

ROOT = Path(__file__).resolve().parent.parent
"""The checkout: the tests run its code, and child processes get it first on their path."""


def engine_env(**extra: str) -> dict[str, str]:
    """The environment of a child that runs this checkout's ampscope."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


FAST = ["workload.kind='mlp'", "device='cpu'"]  # a small MLP: milliseconds a step on a CPU
SIZE = (120, 40)


def run(coro) -> None:
    asyncio.run(coro)


def cli(capsys, *argv: str) -> subprocess.CompletedProcess[str]:
    """``ampscope ARGV`` through ``main()`` in this process, for a command that trains in the
    process it runs in (numerics, profile): what its own process would print and return,
    without the seconds of torch's import."""
    code = main(list(argv))
    said = capsys.readouterr()
    return subprocess.CompletedProcess(list(argv), code, said.out, said.err)


PATIENCE_S = 60.0
"""The least a UI test waits for what it expects: at load 8 on two cores a redraw that takes
0.2 s alone took seconds. A test that passes returns as soon as its condition holds."""


async def wait_for(pilot, cond: Callable[[], bool], timeout: float = PATIENCE_S) -> bool:
    """Let the app run until ``cond()`` holds; False if it still does not after ``timeout``
    seconds, or ``PATIENCE_S`` where that is longer (every caller waits for something it
    expects to happen, never for a time to pass)."""
    deadline = time.monotonic() + max(timeout, PATIENCE_S)
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


def owning_sleeper(run_dir: Path, seconds: int = 60) -> subprocess.Popen:
    """A process that runs ``run_dir`` as an engine does: it holds the record's ``.owner``
    open (inherited), so ampscope may signal it. A bare ``sleep`` holds nothing."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = ownership.claim_for_child(run_dir)
    try:
        return subprocess.Popen(["sleep", str(seconds)], pass_fds=(fd,), start_new_session=True)
    finally:
        os.close(fd)


def wait_until(cond: Callable[[], bool], timeout: float) -> bool:
    """``wait_for`` outside an app: poll ``cond()`` until it holds or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def wait_gone(pid: int, timeout: float) -> bool:
    return wait_until(lambda: gone(pid), timeout)


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


def done(status: str = "ok", steps: int = 30) -> ev.DoneEvent:
    return ev.DoneEvent(
        status=status,
        steps_done=steps,
        step_ms_median=10.0,
        step_ms_p10=9.0,
        step_ms_p90=11.0,
        samples_per_s=800.0,
        tokens_per_s=None,
        tflops=0.5,
        mfu=None,
        mem_peak=150 << 20,
        loss_first=2.0,
        loss_final=0.1,
        skipped_steps=2,
        compile_s=None,
        wall_s=1.0,
    )


def split_profile(
    step_ms: float, timing: str = "device", step: int = 50, steps: int = 5, **us: float
) -> ev.ProfileEvent:
    """A profile of ``steps`` steps of ``step_ms`` each, through the engine's own summary:
    ``matmul_fp32=3000`` is 3 ms of fp32 matmul a step, ``casts=500`` 0.5 ms of casts (which
    count as elementwise), ``idle=1000`` 1 ms with no kernel; the rest is any class by name."""
    from ampscope.core import profiles
    from ampscope.core.profiles.rules import OpTime

    ops, idle = [], us.pop("idle", 0.0) * steps * 1000.0
    for key, per_step in us.items():
        cls, _, dtype = key.partition("_")
        name = "aten::_to_copy" if key == "casts" else f"op-{key}"
        cls = "elementwise" if key == "casts" else "norm_act" if key == "norm" else cls
        ops.append(
            OpTime(name, cls, per_step * steps * 1000.0, 2 * steps, dtype or None, key == "casts")
        )
    return profiles.summarize(
        ops, step_ms * 1000.0 * steps, step=step, steps=steps, timing=timing, idle_us=idle
    )


# A run manager without processes or a screen: a fake engine child and a listener that keeps
# what the run manager told it.


class FakeEngine:
    """An engine child without a process. ``finish`` ends it; ``events`` are sent as it starts.

    ``stop()`` behaves like the real engine on SIGTERM: it writes a 'stopped' done and exits 0,
    unless ``writes_done_on_stop`` is False (a killed engine) and it exits -15.
    """

    def __init__(
        self,
        preset: str,
        overrides: list[str],
        runs_dir: Path,
        on_event: Callable[[ev.Event | ev.UnknownEvent], None],
        events: Sequence[ev.Event] = (),
        exit_at_once: int | None = None,
        writes_done_on_stop: bool = True,
        fails_with: Exception | None = None,
    ) -> None:
        self.preset, self.overrides, self.runs_dir, self.on_event = (
            preset,
            overrides,
            runs_dir,
            on_event,
        )
        self.events = list(events)
        self.exit_at_once = exit_at_once
        self.writes_done_on_stop = writes_done_on_stop
        self.fails_with = fails_with
        self.stderr_tail: list[str] = []
        self.stop_requested = False
        self.killed = False
        self.returncode: int | None = None
        self._started = asyncio.Event()
        self._exit: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    @property
    def running(self) -> bool:
        return self._started.is_set() and self.returncode is None

    async def run(self) -> int:
        self._started.set()
        if self.fails_with is not None:
            raise self.fails_with
        for event in self.events:
            self.on_event(event)
        if self.exit_at_once is not None:
            self.finish(self.exit_at_once)
        self.returncode = await self._exit
        return self.returncode

    async def wait_started(self) -> None:
        await self._started.wait()

    def finish(self, code: int) -> None:
        if not self._exit.done():
            self._exit.set_result(code)

    async def stop(self) -> int | None:
        self.stop_requested = True
        if self.writes_done_on_stop:
            self.on_event(ev.empty_done("stopped"))
            self.finish(0)
        else:
            self.finish(-15)
        return await self._exit

    def kill_now(self) -> None:
        self.killed = True
        self.finish(-9)


class FakeListener:
    """What the dashboard would have been told, in order."""

    def __init__(self) -> None:
        self.started: list = []
        self.detached: list[Path] = []
        self.compared: list[tuple[list[str], str]] = []
        self.repeated = False
        self.told: list[tuple[str, bool, str]] = []
        self.compared_event = asyncio.Event()

    def run_started(self, run) -> None:
        self.started.append(run)

    def run_detached(self, run_dir: Path) -> None:
        self.detached.append(run_dir)

    def sweep_compared(self, runs, baseline: str, *, repeated: bool = False) -> None:
        self.compared.append(([r.preset for r in runs], baseline))
        self.repeated = repeated
        self.compared_event.set()

    def tell(self, message: str, *, error: bool = False, title: str = "") -> None:
        self.told.append((message, error, title))


class MemoryRecord:
    """A run record in memory, for the engine's event writer."""

    def __init__(self) -> None:
        self.data = b""
        self.fault: Exception | None = None

    def append(self, data: bytes) -> None:
        self.data += data


def terminal_output(app) -> tuple[str, str]:
    """What the terminal would get for the current screen: (plain text, raw output with its
    escape sequences), rendered as ``App.export_screenshot`` renders it."""
    import io

    from rich.console import Console

    width, height = app.size
    raw = io.StringIO()
    console = Console(
        width=width,
        height=height,
        file=raw,
        force_terminal=True,
        color_system="truecolor",
        record=True,
        legacy_windows=False,
        safe_box=False,
    )
    console.print(
        app.screen._compositor.render_update(full=True, screen_stack=app._background_screens)
    )
    return console.export_text(), raw.getvalue()


def text(screen, selector: str) -> str:
    """What a Static or Label shows, as plain text."""
    return str(screen.query_one(selector).render())


async def shown(pilot, app, kind: type, timeout: float = 10.0):
    """Wait until a screen of ``kind`` is on top, and return it (AssertionError if it never is)."""
    assert await wait_for(pilot, lambda: isinstance(app.screen, kind), timeout), (
        f"{kind.__name__} not shown; on top: {type(app.screen).__name__}"
    )
    return app.screen


async def history_of(pilot, app, rows: int, timeout: float = 30.0):
    """History opened from the presets (``h``), once its table lists ``rows`` runs: the screen
    and its table."""
    from ampscope.tui.screens.history import HistoryScreen

    await shown(pilot, app, PresetsScreen)
    await pilot.press("h")
    history = await shown(pilot, app, HistoryScreen)
    table = history.query_one("#history-table")
    assert await wait_for(pilot, lambda: table.row_count == rows, timeout), table.row_count
    return history, table


async def save_dialog_for(pilot, app, preset: str):
    """The Presets screen's save dialog (``s``) for ``preset``, once it is shown."""
    from ampscope.tui.screens.save import SaveDialog

    await shown(pilot, app, PresetsScreen)
    select_preset(app, preset)
    await pilot.pause()
    await pilot.press("s")
    return await shown(pilot, app, SaveDialog)


def write_finished_record(
    root: Path, preset: str, ms: float = 10.0, median: float | None = None
) -> Path:
    """A run folder as the engine leaves it: hello, four steps, done (its median step time
    ``median`` when given)."""
    run_dir = records.new_run_dir(root, preset)
    events: list[ev.Event] = [hello(preset=preset, run_dir=str(run_dir))]
    events += [step(i, ms) for i in range(4)]
    end = done("ok", 4)
    if median is not None:
        end = msgspec.structs.replace(end, step_ms_median=median)
    events.append(end)
    (run_dir / records.EVENTS_FILE).write_bytes(b"".join(ev.encode(e) for e in events))
    return run_dir


# A user's model file for ``--model`` (tests/data/user_model.py): one factory a behaviour, and
# the faults a user makes.

USER_MODEL = (Path(__file__).resolve().parent / "data" / "user_model.py").read_text()


def user_model(folder: Path, name: str = "user_model.py") -> Path:
    """Copy the user's model file into ``folder`` and return the copy's path."""
    path = folder / name
    path.write_text(USER_MODEL)
    return path


def model_set(path: Path, factory: str = "make") -> str:
    """The ``--set`` override that trains ``factory`` from the file at ``path``."""
    return f'workload.model="{path}:{factory}"'


# Snapshots: what a screen shows, kept under tests/snapshots/ and compared on every run.
# Written here rather than with pytest-textual-snapshot: its syrupy pin needs pytest < 9.

SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"
UPDATE_SNAPSHOTS = "AMPSCOPE_UPDATE_SNAPSHOTS"
"""Set to 1 to (re)write the snapshots instead of comparing; then look at each one."""


def screen_capture(app, title: str) -> tuple[str, str]:
    """The screen as plain text (one line per row) and as an SVG (colours, for a person)."""
    import io

    from rich.console import Console

    width, height = app.size
    console = Console(
        width=width,
        height=height,
        file=io.StringIO(),
        force_terminal=True,
        color_system="truecolor",
        record=True,
        legacy_windows=False,
        safe_box=False,
    )
    update = app.screen._compositor.render_update(full=True, screen_stack=app._background_screens)
    console.print(update)
    svg = console.export_svg(title=title, clear=False)
    rows = [line.rstrip() for line in console.export_text(clear=True).splitlines()]
    return "\n".join(rows).rstrip("\n") + "\n", svg


def assert_snapshot(app, name: str) -> str:
    """The screen matches ``tests/snapshots/NAME.txt`` (and its colours NAME.svg).

    The text is the check that reads in a diff; the SVG is for looking at (and catches a
    change of colour alone). Returns the text.
    """
    assert app.animation_level == "none", "a snapshot is taken with animations off"
    text, svg = screen_capture(app, name)
    txt_path, svg_path = SNAPSHOTS / f"{name}.txt", SNAPSHOTS / f"{name}.svg"
    if os.environ.get(UPDATE_SNAPSHOTS):
        SNAPSHOTS.mkdir(exist_ok=True)
        txt_path.write_text(text)
        svg_path.write_text(svg)
        return text
    assert txt_path.is_file(), f"no snapshot {name}: run with {UPDATE_SNAPSHOTS}=1, then review it"
    expected = txt_path.read_text()
    if text != expected:
        import difflib

        diff = "\n".join(
            difflib.unified_diff(expected.splitlines(), text.splitlines(), "snapshot", "now")
        )
        raise AssertionError(f"{name} differs from its snapshot:\n{diff}")
    assert svg == svg_path.read_text(), f"{name}: same text, other colours than its snapshot"
    return text


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
            d.steps_done = 100  # a run that measured something
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


# Shapes of one batch of each workload kind, for counting FLOPs without building its data.


def meta_batch(kind: str, dims: dict[str, int], batch_size: int, device: str = "meta"):
    """(inputs, targets) of the right shapes and dtypes, all zeros (valid labels and tokens)."""
    import torch

    if kind in ("gpt", "gpt2-124m", "llama"):
        tokens = torch.zeros(batch_size, dims["seq_len"], dtype=torch.long, device=device)
        return tokens, tokens
    labels = torch.zeros(batch_size, dtype=torch.long, device=device)
    if kind == "mlp":
        return torch.zeros(batch_size, dims["width"], device=device), labels
    size = dims["image_size"]
    return torch.zeros(batch_size, 3, size, size, device=device), labels


# A user's own model and loop, for ampscope.watch.


def tiny_model(seed: int = 0):
    """32 -> 64 -> 4 MLP and its AdamW, as a user's script would build them."""
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def linear_flops(batch: int, widths: tuple[int, ...]) -> int:
    """FLOPs of a training step of a stack of linear layers fed by data (no input gradient).

    Forward 2·b·i·o per layer, backward twice that (input and weight gradients), less the
    first layer's input gradient, which nothing needs.
    """
    pairs = list(zip(widths, widths[1:], strict=False))
    return sum(6 * batch * i * o for i, o in pairs) - 2 * batch * pairs[0][0] * pairs[0][1]


def events_of(run_dir, kind: type) -> list:
    """The events of one type in a run record, in order."""
    from ampscope.core import records

    events, _ = records.read_events(run_dir / records.EVENTS_FILE)
    return [e for e in events if isinstance(e, kind)]


# The dashboard on a real (pseudo) terminal, for signals and hang-ups.


@dataclass
class DashboardOnATerminal:
    proc: subprocess.Popen
    master: int  # the terminal's side: what the app writes arrives in ``output``
    slave: int  # the app's side (close it where the test wants the terminal gone)
    output: bytearray
    before: list  # the terminal's settings before the app started (termios.tcgetattr)


def dashboard_on_a_terminal(**env: str) -> DashboardOnATerminal:
    """``ampscope``'s dashboard in its own session on an 80x24 pty, its output read into
    ``output`` by a thread (as a terminal would read it)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    before = termios.tcgetattr(slave)
    code = "import sys; from ampscope.tui.app import run_dashboard; sys.exit(run_dashboard())"
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
        env=engine_env(TERM="xterm-256color", **env),
        cwd=ROOT,
    )
    output = bytearray()

    def drain() -> None:
        with contextlib.suppress(OSError):
            while chunk := os.read(master, 65536):
                output.extend(chunk)

    threading.Thread(target=drain, daemon=True).start()
    return DashboardOnATerminal(proc, master, slave, output, before)


# Two threads at once: the second started while the first is held inside its work.


def held_at_first_call(
    fn: Callable[..., Any], held: threading.Event, release: threading.Event
) -> Callable[..., Any]:
    """``fn``, whose first call sets ``held`` and waits for ``release`` (a slow disk, a thread
    the GIL starves) before it goes on; later calls go straight through."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not held.is_set():
            held.set()
            release.wait(30)
        return fn(*args, **kwargs)

    return wrapper


def second_while_first_held(
    first: Callable[[], object],
    second: Callable[[], object],
    held: threading.Event,
    release: threading.Event,
    between: Callable[[], object] = lambda: None,
    grace_s: float = 1.0,
) -> None:
    """Run ``first`` in a thread until it is ``held``, then ``between``, then ``second`` in a
    thread given ``grace_s`` to finish beside it (one that does not wait for the first does);
    then release the first and wait for both."""
    one = threading.Thread(target=first)
    one.start()
    assert held.wait(30)
    between()
    two = threading.Thread(target=second)
    two.start()
    two.join(grace_s)
    release.set()
    one.join(30)
    two.join(30)
