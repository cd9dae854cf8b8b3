"""``ampscope run PRESET --nproc-per-node N``: torchrun starts the ranks, this process watches.

torchrun (``python -m torch.distributed.run``) is the launcher; ampscope never starts ranks
itself. This front-end checks the preset and the launch first (exit 2 before anything
starts), reads rank 0's event stream from torchrun's stdout (the other ranks write none), and
forwards a stop: SIGINT or SIGTERM here becomes SIGTERM to torchrun, which passes it to every
rank; the ranks agree to stop at the same step and rank 0 writes ``done`` (a rank stuck in a
step is cut short after 8 s, ``engine.lifecycle.stopping``). A second signal, or the job still running
``stop_grace_s`` (15 s) after the first, kills torchrun and every rank at once (the ranks run
in sessions of their own: ``core.processes.tree``). If this process dies, the kernel signals
torchrun too (``die_with_parent``).

torchrun's own stderr (its notices, a failed rank's traceback) is kept in the run record as
``torchrun.log`` and shown only when the event stream cannot explain how the run ended.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable
from types import FrameType

import psutil

from ampscope.cli.console import ConsoleReporter
from ampscope.cli.output import fail
from ampscope.core import events as ev
from ampscope.core import presets
from ampscope.core.presets.parallel import Launch, port_in_use
from ampscope.core.presets.run_args import run_overrides
from ampscope.core.processes.launch import die_with_parent, engine_command, launch_env, stop_grace_s
from ampscope.core.processes.tree import job_tree, kill_tree
from ampscope.core.text import visible

LAUNCHER_LOG = "torchrun.log"
STDERR_KEPT = 2000  # lines of torchrun's stderr kept for the log
STDERR_SHOWN = 20
EXIT_FOR_STATUS = {"ok": 0, "failed": 1, "stopped": 130}


def cmd_run_distributed(args: argparse.Namespace, launch: Launch) -> int:
    overrides = run_overrides(args)
    try:
        presets.load_preset(args.preset, overrides)  # refused here, before any process starts
    except presets.ConfigError as exc:
        return fail(exc)
    problem = port_in_use(launch)
    if problem is not None:
        return fail(problem)
    extra: list[str] = []
    if args.no_record:
        extra.append("--no-record")
    if getattr(args, "run_dir", None) is not None:
        extra += ["--run-dir", str(args.run_dir)]
    command = engine_command(args.preset, overrides, args.runs_dir, extra=extra, launch=launch)
    if launch.node_rank not in (None, 0):
        first = launch.node_rank * launch.nproc_per_node
        last = first + launch.nproc_per_node - 1
        here = f"rank {first} trains" if first == last else f"ranks {first} to {last} train"
        print(
            f"ampscope: node {launch.node_rank} of {launch.nnodes}: {here} here; node 0 "
            "(rank 0) writes the record and shows the progress.",
            file=sys.stderr,
        )
    watch = TorchrunWatch(command, launch, json_out=args.json)
    return watch.run(None if args.json else ConsoleReporter())


class TorchrunWatch:
    """One torchrun job, from start to exit code."""

    def __init__(self, command: list[str], launch: Launch, json_out: bool = False) -> None:
        self.command = command
        self.launch = launch
        self.json_out = json_out
        self.stderr: deque[str] = deque(maxlen=STDERR_KEPT)
        self.hello: ev.HelloEvent | None = None
        self.done: ev.DoneEvent | None = None
        self.config_error = False
        self.stop_requested = False
        self._asked_early = False  # a stop before torchrun had started
        self.proc: subprocess.Popen[bytes] | None = None
        self.kill_after_s = stop_grace_s(launch, 0.0)
        self._kill_timer: threading.Timer | None = None
        self._job: list[psutil.Process] = []

    def run(self, on_event: Callable[[ev.Event], None] | None = None) -> int:
        # the stop signals are ours before torchrun starts: one that came between its start
        # and our handler would have ended this process (their default) and left the job
        previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        try:
            try:
                self.proc = subprocess.Popen(
                    self.command,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,  # a stop goes through torchrun, never to ranks
                    env=launch_env(self.launch),
                    preexec_fn=die_with_parent,  # a prctl call, resolved beforehand
                )
            except OSError as exc:
                return fail(f"cannot start torchrun: {exc}", 1)
            if self._asked_early:  # a stop while torchrun was starting: it is passed on now
                self._on_signal(signal.SIGTERM, None)
            reader = threading.Thread(target=self._read_stderr, name="ampscope-torchrun-stderr")
            reader.start()
            self._read_events(on_event)
            code = self.proc.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self._kill_timer is not None:
                self._kill_timer.cancel()
        reader.join(5.0)
        self._save_log()
        return self.exit_code(code)

    def _read_events(self, on_event: Callable[[ev.Event], None] | None) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            if not line.strip():
                continue
            if self.json_out:
                sys.stdout.buffer.write(line)
                sys.stdout.flush()
            event = ev.decode(line)
            if isinstance(event, ev.UnknownEvent):
                continue
            if isinstance(event, ev.HelloEvent):
                self.hello = event
            elif isinstance(event, ev.DoneEvent):
                self.done = event
            elif isinstance(event, ev.ErrorEvent) and event.kind == "config":
                self.config_error = True
            if on_event is not None:
                on_event(event)

    def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for raw in self.proc.stderr:
            self.stderr.append(raw.decode(errors="replace").rstrip("\n"))

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.proc is None:
            self._asked_early = True
            return
        if self.proc.poll() is not None:
            return
        if self.stop_requested:
            self.kill_job()
            return
        self.stop_requested = True
        self._job = job_tree(self.proc.pid)  # the ranks, while torchrun still has them
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        self._kill_timer = threading.Timer(self.kill_after_s, self.kill_job)
        self._kill_timer.daemon = True
        self._kill_timer.start()

    def kill_job(self) -> None:
        """SIGKILL torchrun and every rank (each in a session of its own)."""
        if self.proc is not None and self.proc.poll() is None:
            kill_tree([*job_tree(self.proc.pid), *self._job])
        else:
            kill_tree(self._job)

    def _save_log(self) -> None:
        folder = self.hello.folder() if self.hello is not None else None
        if folder is None or not self.stderr:
            return
        with contextlib.suppress(OSError):
            (folder / LAUNCHER_LOG).write_text("\n".join(self.stderr) + "\n")

    def exit_code(self, torchrun_code: int) -> int:
        """From what rank 0 said; torchrun's own code (1 for any failed rank) only when it
        said nothing, and then with the reason found in torchrun's stderr."""
        if self.config_error:
            return 2
        if self.done is not None:
            return EXIT_FOR_STATUS.get(self.done.status, 1)
        if self.stop_requested:
            return 130
        if torchrun_code == 0:  # a node other than 0: its ranks finished, rank 0 reports
            return 0
        fail(explain_failure(list(self.stderr), self.launch, torchrun_code), 1)
        return 1


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def explain_failure(lines: list[str], launch: Launch, code: int) -> str:
    """Why torchrun ended without a word from rank 0, in the user's terms where we can tell."""
    text = "\n".join(lines)
    where = launch.rdzv_endpoint or "the rendezvous"
    if "waiting for clients" in text or "RendezvousTimeoutError" in text:
        return (
            f"the rendezvous at {where} timed out: not every node joined. Start the same "
            "command on every node, each with its own --node-rank (0 to "
            f"{launch.nnodes - 1}), and check that {where} is reachable from the others "
            "(firewall, the address they see); --rdzv-timeout S waits longer."
        )
    if "Address already in use" in text or "EADDRINUSE" in text:
        return (
            f"the rendezvous port of {where} is already in use (another torchrun job?). Pick "
            "a free port and give the same --rdzv-endpoint to every node."
        )
    if "Connection refused" in text or "DistNetworkError" in text:
        return (
            f"cannot reach the rendezvous at {where}: node 0 is not up yet, or the address or "
            "port is wrong."
        )
    last = "\n".join(visible(line) for line in lines[-STDERR_SHOWN:])
    return (
        f"torchrun ended with exit code {code} before the engine reported; its last lines:\n{last}"
    )
