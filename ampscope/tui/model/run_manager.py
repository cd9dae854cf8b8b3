"""The runs the dashboard starts: one engine child at a time, a sweep queue, detached runs.

Textual-free (asyncio only), so its rules are tested without a screen. The dashboard is its
listener: the run manager says when a run starts, when one went off detached and when a sweep has
something to compare, and the dashboard shows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgspec

from ampscope.core import comparison, records
from ampscope.core import events as ev
from ampscope.core.presets import ConfigError, Preset, load_preset, parallel, to_dict, to_toml
from ampscope.core.processes.launch import EngineDidNotStart, launch_detached
from ampscope.tui.model.engine_process import EngineProcess
from ampscope.tui.model.run_state import RunState
from ampscope.tui.model.source import RESTART, STOP

DRAIN_S = 1.0
"""After a stop, how long the last lines (the ``done`` event) may take to arrive."""
CLOSE_S = 2.0
"""On close, how long a killed engine's reader may take to finish."""


class Engine(Protocol):
    """What the run manager needs of an engine child (``EngineProcess``; tests pass fakes)."""

    @property
    def stderr_tail(self) -> Sequence[str]:
        """The last lines of its stderr, oldest first."""
        ...

    @property
    def stop_requested(self) -> bool: ...

    @property
    def running(self) -> bool: ...

    async def run(self) -> int: ...

    async def wait_started(self) -> None: ...

    async def stop(self) -> int | None: ...

    def kill_now(self) -> None: ...


EngineFactory = Callable[
    [str, list[str], Path, Callable[[ev.Event | ev.UnknownEvent], None]], Engine
]
DetachedLauncher = Callable[[str, list[str], Path], tuple[Path, int]]


def start_engine_process(
    preset: str,
    overrides: list[str],
    runs_dir: Path,
    on_event: Callable[[ev.Event | ev.UnknownEvent], None],
    processes: parallel.Launch | None = None,
) -> Engine:
    """``processes``: torchrun's ranks (``--nproc-per-node``) instead of one engine."""
    return EngineProcess(preset, overrides, runs_dir=runs_dir, on_event=on_event, launch=processes)


class RunListener(Protocol):
    """What the run manager tells the dashboard."""

    def run_started(self, run: LiveRun) -> None:
        """Show ``run`` (it has not sent anything yet)."""

    def run_detached(self, run_dir: Path) -> None:
        """A run went off on its own (``launch_detached``): follow its record."""

    def sweep_compared(
        self, runs: list[records.RunRecord], baseline: str, *, repeated: bool = False
    ) -> None:
        """A sweep ended with two or more records to compare; ``repeated``: each preset ran
        more than once (interleaved), and its runs make one row."""

    def tell(self, message: str, *, error: bool = False, title: str = "") -> None:
        """A one-line notice."""


SweepEntry = str | Preset
"""A preset by name, or one edited on the Presets screen (it runs as ``NAME-edited``)."""


def edited_name(preset: Preset) -> str:
    return f"{preset.name}-edited"


@dataclass
class SweepQueue:
    """Presets queued from the Presets screen, run one after another.

    With ``repeats`` K the queue is interleaved as ``ampscope bench --repeats K`` runs it
    (A B A B, not A A B B): repeat k of every preset meets the machine in about the same state,
    and Compare pairs them for a speed verdict (three repeats at least).
    """

    presets: list[SweepEntry]
    repeats: int = 1
    index: int = 0
    run_dirs: dict[str, list[Path]] = field(default_factory=dict)  # by name, in repeat order

    @property
    def names(self) -> list[str]:
        return [p if isinstance(p, str) else edited_name(p) for p in self.presets]

    @property
    def order(self) -> list[SweepEntry]:
        return [p for _ in range(self.repeats) for p in self.presets]

    @property
    def progress(self) -> str:
        return f"sweep {self.index + 1}/{len(self.order)}"

    @property
    def baseline(self) -> str:
        names = self.names
        return "fp32" if "fp32" in names else names[0]


@dataclass(frozen=True)
class RunStart:
    """How a run was started, so that it can be started again."""

    preset: str
    overrides: list[str]
    config: dict[str, Any]


class LiveRun:
    """An engine child the run manager started: the Run view's source for it."""

    def __init__(
        self, manager: RunManager, state: RunState, engine: Engine, launch: RunStart
    ) -> None:
        self.manager = manager
        self.state = state
        self.engine = engine
        self.launch = launch
        self.ended = asyncio.Event()

    def label(self) -> str:
        return ""

    def allows(self, control: str) -> bool | None:
        if control == STOP:
            return None if self.state.finished else True
        return control == RESTART

    def why_not(self, control: str) -> str:
        return "the run has ended" if control == STOP else "only a replay pauses and seeks"

    async def feed(self) -> None:
        await self.ended.wait()  # the engine's events arrive through the run manager

    async def stop(self) -> None:
        if self.manager.current is self:
            await self.manager.stop_run()

    async def restart(self) -> None:
        await self.manager.restart_run(self)


class RunManager:
    """Starts, stops and restarts engine children, one at a time, and runs sweeps.

    ``extra_overrides`` are appended to every run; ``read_only`` (a served viewer) starts nothing.
    """

    def __init__(
        self,
        listener: RunListener,
        runs_dir: Path,
        *,
        extra_overrides: Sequence[str] = (),
        read_only: bool = False,
        start_engine: EngineFactory = start_engine_process,
        launch: DetachedLauncher = launch_detached,
    ) -> None:
        self.listener = listener
        self.runs_dir = runs_dir
        self.extra_overrides = list(extra_overrides)
        self.read_only = read_only
        self.current: LiveRun | None = None
        self.sweep: SweepQueue | None = None
        self._start_engine = start_engine
        self._launch = launch
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._closed = False

    @property
    def state(self) -> RunState | None:
        return self.current.state if self.current else None

    @property
    def engine(self) -> Engine | None:
        return self.current.engine if self.current else None

    # ------------------------------------------------------------------ starting

    async def start_run(
        self,
        preset: str,
        overrides: Sequence[str] = (),
        *,
        label: str | None = None,
        config: dict[str, Any] | None = None,
        detach: bool = False,
        queued: bool = False,
    ) -> LiveRun | None:
        """Stop what runs, then start ``preset`` (a name or a .toml path).

        A run the user starts cancels a queued sweep; ``queued`` marks the sweep's own runs.
        ``config`` is the preset as the header shows it before the engine says hello.
        """
        if self.read_only or self._closed:
            return None
        if not queued:
            self.sweep = None
        every = [*overrides, *self.extra_overrides]
        config = config_before_hello(preset, every) if config is None else config
        async with self._lock:
            if queued and self.sweep is None:  # cancelled while this start waited
                return None
            await self.stop_run()
            if detach:
                await self._start_detached(preset, every)
                return None
            state = RunState(label=label or config.get("name", preset), launch=config)
            if queued and self.sweep is not None:
                state.queue_note = self.sweep.progress
            engine = self._start_engine(preset, every, self.runs_dir, state.ingest)
            run = LiveRun(self, state, engine, RunStart(preset, list(overrides), config))
            self.current = run
            self.listener.run_started(run)
            self._spawn(self._follow(run))
            await run.engine.wait_started()
            return run

    async def _start_detached(self, preset: str, overrides: list[str]) -> None:
        """Launched in a thread: it waits (seconds) for the engine's hello."""
        try:
            run_dir, pid = await asyncio.to_thread(self._launch, preset, overrides, self.runs_dir)
        except (ConfigError, OSError, EngineDidNotStart) as exc:
            self.listener.tell(str(exc), error=True, title="Not started")
            return
        self.listener.tell(f"{run_dir.name} runs detached (pid {pid}): quitting leaves it running.")
        self.listener.run_detached(run_dir)

    async def start_edited_run(
        self, preset: Preset, *, detach: bool = False, queued: bool = False
    ) -> None:
        """An edited preset runs from a temporary TOML file (``NAME-edited``)."""
        edited = msgspec.structs.replace(preset, name=edited_name(preset))
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="ampscope-")
        path = Path(self._tmp.name) / f"{records.safe_file_name(edited.name)}.toml"
        try:
            path.write_text(to_toml(edited))
        except OSError as exc:
            self.listener.tell(
                f"cannot write {path}: {exc.strerror}", error=True, title="Not started"
            )
            return
        await self.start_run(
            str(path), label=edited.name, config=to_dict(edited), detach=detach, queued=queued
        )

    async def restart_run(self, run: LiveRun | None = None) -> None:
        """Start ``run`` (default: the current one) again, as it was started."""
        run = run or self.current
        if run is not None:
            launch = run.launch
            await self.start_run(launch.preset, launch.overrides, config=launch.config)

    async def _follow(self, run: LiveRun) -> None:
        code = await run.engine.run()
        state = run.state
        state.stop_requested = state.stop_requested or run.engine.stop_requested
        if state.exit_code is None:
            state.process_exited(code, list(run.engine.stderr_tail))
        run.ended.set()
        if self.sweep is not None and self.current is run and not self._closed:
            self._continue_sweep(self.sweep, run)

    # ------------------------------------------------------------------ sweeps

    async def start_sweep(self, presets: Sequence[SweepEntry], repeats: int = 1) -> None:
        """Run presets one after another, ``repeats`` rounds of them interleaved; the Run view
        follows each, Compare opens at the end."""
        if self.read_only or not presets:
            return
        self.sweep = SweepQueue(list(presets), repeats=max(1, repeats))
        await self._start_queued(self.sweep.order[0])

    async def _start_queued(self, entry: SweepEntry) -> None:
        if isinstance(entry, str):
            await self.start_run(entry, queued=True)
        else:
            await self.start_edited_run(entry, queued=True)

    def _continue_sweep(self, sweep: SweepQueue, run: LiveRun) -> None:
        hello = run.state.hello
        order = sweep.order
        name = sweep.names[sweep.index % len(sweep.presets)]
        folder = hello.folder() if hello is not None else None
        if folder is not None:
            sweep.run_dirs.setdefault(name, []).append(folder)
        if run.state.stop_requested:  # the user stopped a run: the rest of the queue is cancelled
            self.sweep = None
            self.listener.tell(f"Sweep cancelled after {sweep.index + 1} of {len(order)}.")
            return
        sweep.index += 1
        if sweep.index < len(order):
            self._spawn(self._start_queued(order[sweep.index]))
            return
        self.sweep = None
        groups = {
            n: [records.load_run(d) for d in dirs if d.is_dir()]
            for n, dirs in sweep.run_dirs.items()
        }
        rows = comparison.compare(
            [comparison.row_from_runs(n, rs) for n, rs in groups.items() if rs], sweep.baseline
        )
        names = [p if isinstance(p, str) else edited_name(p) for p in order]
        comparison.write_sweep(self.runs_dir, rows, sweep.baseline, names)
        runs = [r for n in sweep.names for r in groups.get(n, [])]
        if len(groups) >= 2 and len(runs) >= 2:
            self.listener.sweep_compared(runs, sweep.baseline, repeated=sweep.repeats > 1)

    # ------------------------------------------------------------------ stopping

    async def stop_run(self) -> None:
        """SIGTERM the engine (SIGKILL after its grace period) and wait for its last lines."""
        run = self.current
        if run is None or not run.engine.running:
            return
        run.state.stop_requested = True
        code = await run.engine.stop()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(run.ended.wait(), DRAIN_S)
        if run.state.exit_code is None:
            run.state.process_exited(-9 if code is None else code, list(run.engine.stderr_tail))

    async def close(self) -> None:
        """The last chance (the dashboard is going): the engine never outlives it."""
        self._closed = True
        self.sweep = None
        run = self.current
        if run is not None and run.engine.running:
            run.engine.kill_now()
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=CLOSE_S)
        for task in pending:
            task.cancel()
        for _ in range(5):  # let the pipes' transports close while the loop still runs
            await asyncio.sleep(0)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        """A failure in the background is said, never lost in a log nobody reads."""
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            self.listener.tell(f"{type(exc).__name__}: {exc}", error=True, title="Run failed")


def config_before_hello(preset: str, overrides: Sequence[str]) -> dict[str, Any]:
    """The preset as the engine will see it, for the header before ``hello`` arrives."""
    try:
        return to_dict(load_preset(preset, overrides))
    except ConfigError:
        return {"name": Path(preset).stem if preset.endswith(".toml") else preset}
