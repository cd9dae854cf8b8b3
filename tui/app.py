"""The ampscope dashboard: an App with three screens and one engine child at a time."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import psutil
from textual.app import App
from textual.binding import Binding

from ampscope.core import comparison, records
from ampscope.core import config as cfg
from ampscope.core import events as ev
from ampscope.core.launch import launch_detached
from ampscope.core.parallel import Launch
from ampscope.tui.commands import PresetCommands
from ampscope.tui.engine_process import EngineProcess, kill_all_now
from ampscope.tui.run_state import RunState, replay
from ampscope.tui.screens.compare import CompareScreen
from ampscope.tui.screens.history import HistoryScreen
from ampscope.tui.screens.presets import PresetsScreen
from ampscope.tui.screens.run import RunScreen

DEFAULT_REFRESH_HZ = 2.0  # plot redraws a second; --refresh 0.5-4
AUTOSTART_ENV = "AMPSCOPE_AUTOSTART"
THEME_ENV = "AMPSCOPE_THEME"
SYS_SAMPLE_S = 1.0


@dataclass
class SweepQueue:
    """Presets queued from the Presets screen, run one after another."""

    presets: list[str]
    index: int = 0
    run_dirs: list[Path] = field(default_factory=list)

    @property
    def progress(self) -> str:
        return f"sweep {self.index + 1}/{len(self.presets)}"

    @property
    def baseline(self) -> str:
        return "fp32" if "fp32" in self.presets else self.presets[0]


class AmpscopeApp(App):
    """The dashboard.

    ``extra_overrides`` are appended (as ``--set``) to every run the app starts; ``autostart``
    is ``(preset, overrides)`` to run as soon as the app is up.
    """

    CSS_PATH = "app.tcss"
    TITLE = "ampscope"
    COMMANDS = App.COMMANDS | {PresetCommands}
    BINDINGS = [Binding("ctrl+q", "quit", "Quit", show=False, priority=True)]

    def __init__(
        self,
        runs_dir: Path | None = None,
        refresh_hz: float | None = None,
        *,
        extra_overrides: Sequence[str] = (),
        autostart: tuple[str, Sequence[str]] | None = None,
        theme: str | None = None,
        read_only: bool = False,
        follow_live: bool = False,
        on_start: Callable[[AmpscopeApp], Any] | None = None,
        processes: Launch | None = None,
    ) -> None:
        """``read_only``: no start, stop or preset edits (a served viewer); ``follow_live``: show
        the newest live run and move on to the next (tui.viewer); ``on_start(app)`` runs once
        the app is up (``ampscope attach`` and ``replay`` open their Run view with it)."""
        super().__init__()
        self.read_only = read_only
        self.follow_live = follow_live
        self.on_start = on_start
        self.detach = False  # runs started from the Presets screen outlive the app
        self.runs_dir = Path(runs_dir) if runs_dir else records.default_runs_dir()
        hz = DEFAULT_REFRESH_HZ if refresh_hz is None else float(refresh_hz)
        self.refresh_hz = min(4.0, max(0.5, hz))
        self.extra_overrides = list(extra_overrides)
        self.processes = processes  # --nproc-per-node and friends: every run the app starts
        self.autostart = autostart
        self.engine: EngineProcess | None = None
        self.state: RunState | None = None
        self.run_screen: RunScreen | None = None
        self.sweep: SweepQueue | None = None
        self.last_launch: tuple[str, list[str], dict[str, Any]] | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix="ampscope-")
        self._sys_proc: psutil.Process | None = None
        self._run_started = 0.0
        self._lock = asyncio.Lock()
        self._wanted_theme = theme

    # ------------------------------------------------------------------ lifecycle

    def on_mount(self) -> None:
        theme = self._wanted_theme or os.environ.get(THEME_ENV, "")
        if theme == "ansi":
            theme = "textual-ansi" if "textual-ansi" in self.available_themes else "ansi-dark"
        if theme and theme in self.available_themes:
            self.theme = theme
        if self.follow_live:
            from ampscope.tui.viewer import start_following

            start_following(self)
        else:
            self.push_screen(PresetsScreen())
        if self.on_start is not None:
            self.call_after_refresh(self.on_start, self)
        self.set_interval(SYS_SAMPLE_S, self._sample_sys, name="sys-sample")
        if self.autostart:
            preset, overrides = self.autostart
            self.call_after_refresh(self._autostart, preset, list(overrides))

    async def _autostart(self, preset: str, overrides: list[str]) -> None:
        await self.start_run(preset, overrides)

    async def action_quit(self) -> None:
        """Stop the engine (SIGTERM, then SIGKILL after the grace period), then exit."""
        await self.stop_run()
        self.exit(0)

    async def on_unmount(self) -> None:
        """The last chance (exit without quit): the engine never outlives the app."""
        engine = self.engine
        if engine is not None and engine.running and engine.process is not None:
            engine.kill_now()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(engine.process.wait(), 2.0)
            for _ in range(5):  # let the pipes' transports close while the loop still runs
                await asyncio.sleep(0)
        self._tmp.cleanup()

    # ------------------------------------------------------------------ runs

    async def start_run(
        self,
        preset: str,
        overrides: Sequence[str] = (),
        label: str | None = None,
        launch: dict[str, Any] | None = None,
        *,
        queued: bool = False,
    ) -> None:
        """Stop what runs, then start ``preset`` (a name or a .toml path) and show it.

        A run the user starts cancels a queued sweep; ``queued`` marks the sweep's own runs.
        """
        if self.read_only:
            return
        if not queued:
            self.sweep = None
        if launch is None:
            launch = _launch_info(preset, [*overrides, *self.extra_overrides])
        self.last_launch = (preset, list(overrides), launch)
        async with self._lock:
            await self.stop_run()
            if self.detach and not queued:
                self._start_detached(preset, overrides)
                return
            state = RunState(label=label or launch.get("name", preset), launch=launch)
            if queued and self.sweep is not None:
                state.queue_note = self.sweep.progress
            engine = EngineProcess(
                preset,
                [*overrides, *self.extra_overrides],
                runs_dir=self.runs_dir,
                on_event=state.ingest,
                launch=self.processes,
            )
            self.state, self.engine = state, engine
            self._sys_proc = None
            self._run_started = time.monotonic()
            self.show_run_screen()
            self.run_worker(
                self._run_engine(engine, state), name="engine", group="engine", exit_on_error=False
            )
            await engine.wait_started()

    def _start_detached(self, preset: str, overrides: Sequence[str]) -> None:
        from ampscope.tui.follow import attach_record

        try:
            run_dir, pid = launch_detached(
                preset, [*overrides, *self.extra_overrides], self.runs_dir, self.processes
            )
        except (cfg.ConfigError, OSError) as exc:
            self.notify(str(exc), severity="error", title="Not started")
            return
        self.notify(f"{run_dir.name} runs detached (pid {pid}): quitting leaves it running.")
        self._pop_above_presets()
        attach_record(self, run_dir)

    async def start_edited_run(self, preset: cfg.Preset) -> None:
        """An edited preset runs from a temporary TOML file (``NAME-edited``)."""
        edited = msgspec.structs.replace(preset, name=f"{preset.name}-edited")
        path = Path(self._tmp.name) / f"{edited.name}.toml"
        path.write_text(cfg.to_toml(edited))
        await self.start_run(str(path), label=edited.name, launch=cfg.to_dict(edited))

    async def restart_run(self) -> None:
        if self.last_launch is None:
            return
        preset, overrides, launch = self.last_launch
        await self.start_run(preset, overrides, launch=launch)

    async def run_preset_from_palette(self, name: str) -> None:
        await self.start_run(name)

    async def _run_engine(self, engine: EngineProcess, state: RunState) -> None:
        code = await engine.run()
        state.stop_requested = state.stop_requested or engine.stop_requested
        state.process_exited(code, list(engine.stderr_tail))
        if self.run_screen is not None and self.run_screen.state is state:
            self.run_screen.refresh_view()
            self.run_screen.refresh_bindings()
        if self.sweep is not None and self.state is state:
            await self._continue_sweep(state)

    # ------------------------------------------------------------------ sweeps

    async def start_sweep(self, presets: Sequence[str]) -> None:
        """Run presets one after another; the Run view follows each, Compare opens at the end."""
        self.sweep = SweepQueue(list(presets))
        await self._start_next_in_sweep()

    async def _start_next_in_sweep(self) -> None:
        sweep = self.sweep
        if sweep is None:
            return
        await self.start_run(sweep.presets[sweep.index], queued=True)

    async def _continue_sweep(self, state: RunState) -> None:
        sweep = self.sweep
        assert sweep is not None
        if state.hello is not None and state.hello.run_dir:
            sweep.run_dirs.append(Path(state.hello.run_dir))
        if state.stop_requested:  # the user stopped a run: the rest of the queue is cancelled
            self.sweep = None
            self.notify(f"Sweep cancelled after {sweep.index + 1} of {len(sweep.presets)}.")
            return
        sweep.index += 1
        if sweep.index < len(sweep.presets):
            self.call_later(self._start_next_in_sweep)
            return
        self.sweep = None
        runs = [records.load_run(d) for d in sweep.run_dirs if d.is_dir()]
        rows = comparison.compare(
            [comparison.row_from_runs(r.preset, [r]) for r in runs], sweep.baseline
        )
        comparison.write_sweep(self.runs_dir, rows, sweep.baseline, sweep.presets)
        if len(runs) >= 2:
            self.push_screen(CompareScreen(runs, baseline=sweep.baseline))

    async def stop_run(self) -> None:
        engine, state = self.engine, self.state
        if engine is None or not engine.running:
            return
        if state is not None:
            state.stop_requested = True
        await engine.stop()
        # Let the reader worker drain the last lines (the 'done' event) and record the exit.
        for _ in range(20):
            if state is None or state.exit_code is not None:
                break
            await asyncio.sleep(0.05)
        if state is not None and state.exit_code is None:
            state.process_exited(
                engine.returncode if engine.returncode is not None else -9, list(engine.stderr_tail)
            )

    def _sample_sys(self) -> None:
        """CPU figures by psutil while the engine sends no ``sys`` events of its own."""
        engine, state = self.engine, self.state
        if engine is None or state is None or not engine.running or state.sys_from_engine:
            return
        pid = engine.pid
        if pid is None:
            return
        try:
            if self._sys_proc is None or self._sys_proc.pid != pid:
                self._sys_proc = psutil.Process(pid)
                self._sys_proc.cpu_percent(None)
                psutil.cpu_percent(None)
                return
            with self._sys_proc.oneshot():
                proc_cpu = self._sys_proc.cpu_percent(None)
                rss = self._sys_proc.memory_info().rss
        except psutil.Error:
            return
        vm = psutil.virtual_memory()
        t = time.monotonic() - self._run_started  # close to the engine's own clock
        state.ingest_local_sys(
            ev.SysEvent(
                t=t,
                cpu_util=psutil.cpu_percent(None),
                proc_cpu=proc_cpu,
                proc_rss=rss,
                sys_mem_used=vm.used,
                sys_mem_total=vm.total,
            )
        )

    # ------------------------------------------------------------------ screens

    def show_run_screen(self) -> None:
        if self.state is None:
            return
        if self.run_screen is None:
            # Installed, so that going back to the presets keeps it alive: Textual removes a
            # popped screen that is not installed, and a removed screen cannot be shown again.
            self.run_screen = RunScreen(self.state, self.refresh_hz)
            self.install_screen(self.run_screen, name="live-run")
        else:
            self.run_screen.show_state(self.state)
        if self.screen is not self.run_screen:
            self._pop_above_presets()
            self.push_screen(self.run_screen)

    def open_record(self, path: Path) -> None:
        record = records.load_run(path)
        state = replay(record.events, label=record.preset)
        self.push_screen(RunScreen(state, self.refresh_hz))

    def show_history(self) -> None:
        self.push_screen(HistoryScreen(self.runs_dir))

    def pop_to_presets(self) -> None:
        if len(self.screen_stack) > 2:
            self.pop_screen()
        else:
            self._pop_above_presets()

    def _pop_above_presets(self) -> None:
        while len(self.screen_stack) > 2:
            self.pop_screen()

    def save_user_preset(self, preset: cfg.Preset, name: str) -> Path:
        if self.read_only:
            raise OSError("this dashboard is read-only")
        folder = cfg.user_presets_dir()
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.toml"
        path.write_text(cfg.to_toml(msgspec.structs.replace(preset, name=name)))
        return path


def _launch_info(preset: str, overrides: Sequence[str]) -> dict[str, Any]:
    """The preset as the engine will see it, for the header before ``hello`` arrives."""
    try:
        return cfg.to_dict(cfg.load_preset(preset, overrides))
    except cfg.ConfigError:
        return {"name": Path(preset).stem if preset.endswith(".toml") else preset}


def parse_autostart(text: str | None) -> tuple[str, list[str]] | None:
    """``AMPSCOPE_AUTOSTART="fp32 workload.kind=mlp steps=500"``: a preset, then overrides."""
    if not text or not text.strip():
        return None
    words = shlex.split(text)
    return words[0], words[1:]


def _install_exit_handlers() -> None:
    """SIGTERM/SIGHUP: kill the engine's group and leave at once, never touching the tty.

    A graceful exit hangs after a hang-up (Textual's writer thread dies on the closed tty).
    """

    def handler(signum: int, frame: object) -> None:
        kill_all_now()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)


def run_dashboard(
    runs_dir: Path | None = None, refresh_hz: float | None = None, **options: Any
) -> int:
    """Run the dashboard in this terminal and return the exit code.

    ``$AMPSCOPE_AUTOSTART`` (``"PRESET [key=value ...]"``) starts a run right away.
    """
    try:
        autostart = parse_autostart(os.environ.get(AUTOSTART_ENV))
    except ValueError as exc:
        print(f"ampscope: ${AUTOSTART_ENV} cannot be read ({exc}).", file=sys.stderr)
        return 2
    if options.get("on_start") is not None:
        autostart = None  # attach and replay open their own view
    app = AmpscopeApp(runs_dir=runs_dir, refresh_hz=refresh_hz, autostart=autostart, **options)
    _install_exit_handlers()
    try:
        result = app.run()
    finally:
        kill_all_now()
    if app.return_code not in (None, 0):
        return int(app.return_code)
    return int(result) if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(run_dashboard())
