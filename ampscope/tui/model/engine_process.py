"""The engine as a child process: started in its own process group, read line by line.

``EngineProcess.run()`` is a coroutine for a Textual async worker. ``stop()`` sends SIGTERM to
the group (the engine finishes its step and emits ``done``), then SIGKILL after a grace
period. ``kill_all_now()`` is for signal handlers: no asyncio, no tty. ``ChildProcess`` is the
same for another ampscope command the dashboard runs (``ampscope plan``, for the plan screen):
it is stopped and never left behind in the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

from ampscope.core import events as ev
from ampscope.core import records
from ampscope.core.presets.parallel import Launch
from ampscope.core.processes.launch import die_with_parent, engine_command, launch_env, stop_grace_s
from ampscope.core.processes.tree import job_tree, kill_tree

STOP_GRACE_S = 5.0
"""How long a stop waits for the engine to end its step and write its ``done`` before SIGKILL:
an engine stopped during torch.compile took 2.8 s to kill its compilers and end on a loaded
2-core machine, 0.2 s short of the 3 s this was."""
STDERR_LINES = 50
LINE_LIMIT = 16 * 1024 * 1024  # a hello line carries the config; keep room

_LIVE: dict[int, int] = {}
"""pid -> process group of every child (engine, plan) this process has started and not yet reaped."""


class ChildProcess:
    """One ampscope command as this process's child, in a session of its own. Call ``run()``
    once (in a worker); ``stop()`` from anywhere in the loop.

    ``on_output`` gets every line of its stdout as it comes, ``on_stderr`` every line of its
    stderr (the last ``STDERR_LINES`` are kept in ``stderr_tail`` too). ``dies_with_parent``:
    the kernel sends it SIGTERM if this process dies, even by SIGKILL (the engine asks for
    the same itself, with ``--exit-with-parent``).
    """

    def __init__(
        self,
        command: Sequence[str],
        on_output: Callable[[bytes], None] | None = None,
        on_stderr: Callable[[str], None] | None = None,
        grace_s: float = STOP_GRACE_S,
        launch: Launch | None = None,
        dies_with_parent: bool = False,
        what: str = "the child",
    ) -> None:
        """``launch``: on several processes, torchrun is the child (it stops every rank).
        ``what`` names it in a message: 'cannot start ampscope plan: ...'."""
        self.command = list(command)
        self.what = what
        self.launch = launch
        self.on_output = on_output
        self.on_stderr = on_stderr
        self.dies_with_parent = dies_with_parent
        self.grace_s = stop_grace_s(launch, grace_s)
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_LINES)
        self.process: asyncio.subprocess.Process | None = None
        self.returncode: int | None = None
        self.stop_requested = False
        self._started = asyncio.Event()
        self._exited = asyncio.Event()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.returncode is None

    async def wait_started(self) -> None:
        await self._started.wait()

    async def run(self) -> int:
        """Start the child, feed every line to ``on_output`` and return its exit code."""
        env = launch_env(self.launch)
        torchrun = self.launch is not None and self.launch.distributed
        exits_with_us = torchrun or self.dies_with_parent
        try:
            self.process = await asyncio.create_subprocess_exec(
                *self.command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                env=env,
                limit=LINE_LIMIT,
                preexec_fn=die_with_parent if exits_with_us else None,
            )
        except OSError as exc:
            self.returncode = 127
            self.stderr_tail.append(f"cannot start {self.what}: {exc}")
            self._started.set()
            self._exited.set()
            return 127
        _LIVE[self.process.pid] = self.process.pid  # start_new_session: pgid == pid
        self._started.set()
        stderr_task = asyncio.ensure_future(self._read_stderr())
        try:
            assert self.process.stdout is not None
            while True:
                try:
                    line = await self.process.stdout.readline()
                except ValueError:  # a line over LINE_LIMIT: skip it
                    continue
                if not line:
                    break
                if self.on_output is not None:
                    self.on_output(line)
            code = await self.process.wait()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stderr_task, 1.0)
        except asyncio.CancelledError:
            # The worker was cancelled (the app is closing): never leave the engine behind.
            self.kill_now()
            raise
        finally:
            if not stderr_task.done():
                stderr_task.cancel()
        self.returncode = code
        _LIVE.pop(self.process.pid, None)
        self._exited.set()
        return code

    async def _read_stderr(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        while True:
            try:
                line = await self.process.stderr.readline()
            except ValueError:
                continue
            if not line:
                return
            text = line.decode(errors="replace").rstrip()
            if text:
                self.stderr_tail.append(text)
                if self.on_stderr is not None:
                    self.on_stderr(text)

    async def stop(self) -> int | None:
        """SIGTERM the group, wait up to the grace period, then SIGKILL it, with every rank
        of a torchrun job (``core.processes.tree``). Returns the exit code."""
        if self.process is None:
            return self.returncode
        self.stop_requested = True
        if self.returncode is None:
            job = job_tree(self.process.pid)  # torchrun's ranks: sessions of their own
            _signal_group(self.process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(self._wait_exit(), self.grace_s)
            except asyncio.TimeoutError:
                kill_tree([*job_tree(self.process.pid), *job])
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wait_exit(), 2.0)
        # Anything the engine left in its group (compile workers) goes too.
        _signal_group(self.process.pid, signal.SIGKILL)
        _LIVE.pop(self.process.pid, None)
        return self.returncode if self.returncode is not None else self.process.returncode

    async def _wait_exit(self) -> None:
        assert self.process is not None
        await self.process.wait()

    def kill_now(self) -> None:
        if self.process is not None:
            _signal_group(self.process.pid, signal.SIGKILL)
            _LIVE.pop(self.process.pid, None)


class EngineProcess(ChildProcess):
    """One engine run: its stdout lines are events, each given to ``on_event``."""

    def __init__(
        self,
        preset: str,
        overrides: Sequence[str] = (),
        runs_dir: Path | None = None,
        on_event: Callable[[ev.Event | ev.UnknownEvent], None] | None = None,
        command: Sequence[str] | None = None,
        grace_s: float = STOP_GRACE_S,
        launch: Launch | None = None,
    ) -> None:
        argv = command or engine_command(preset, overrides, runs_dir, launch=launch)
        super().__init__(
            argv,
            on_output=self._decode,
            grace_s=grace_s,
            launch=launch,
            what="the engine",
        )
        self.on_event = on_event

    def _decode(self, line: bytes) -> None:
        if line.strip() and self.on_event is not None:
            self.on_event(ev.decode(line))


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def kill_all_now(grace_s: float = 1.0) -> None:
    """For signal handlers: SIGTERM every engine group, wait briefly, then SIGKILL.

    Uses only os calls: no asyncio, no tty, safe when the terminal is gone.
    """
    groups = list(_LIVE.values())
    if not groups:
        return
    for pgid in groups:
        _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    pending = set(groups)
    while pending and time.monotonic() < deadline:
        for pid in list(pending):
            if not records.pid_alive(pid):  # exited, or a zombie not yet reaped
                pending.discard(pid)
        if pending:
            time.sleep(0.05)
    for pgid in groups:
        _signal_group(pgid, signal.SIGKILL)
    _LIVE.clear()
