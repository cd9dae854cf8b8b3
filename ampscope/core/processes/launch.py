"""How every front-end starts an engine process: one command builder, one child environment.

The engine child is always ampscope's own: it is started by its package name,
``ampscope.engine``, with Python's safe-path mode on so that the current folder (which may be
a training repo with its own ``engine.py``) is never searched first. A run on several
processes is started by PyTorch's own launcher, torchrun (``python -m torch.distributed.run``),
which starts one engine per rank.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import os
import signal
import site
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ampscope.core import events as ev
from ampscope.core import presets, records
from ampscope.core.presets.parallel import Launch
from ampscope.core.presets.workload_spec import record_name
from ampscope.core.processes import ownership
from ampscope.core.records import files
from ampscope.core.text import is_utf8

ENGINE_MODULE = "ampscope.engine"
TORCHRUN_MODULE = "torch.distributed.run"
ENGINE_LOG = "engine.log"
PRESET_COPY = "preset.toml"
START_WAIT_S = 120.0
"""How long ``--detach`` waits for the engine's hello (importing torch, building the model)."""
START_POLL_S = 0.1
LOG_LINES = 8
_PACKAGE_PARENT = Path(__file__).resolve().parents[3]  # ampscope/core/processes/launch.py
"""The folder that holds the ``ampscope`` package: site-packages, or the source checkout."""


def engine_command(
    preset: str,
    overrides: Sequence[str] = (),
    runs_dir: Path | None = None,
    *,
    exit_with_parent: bool = True,
    extra: Sequence[str] = (),
    launch: Launch | None = None,
) -> list[str]:
    """``python -m ampscope.engine PRESET [--runs-dir D] [--set K=V ...]``: the child's argv.

    On several processes: ``python -m torch.distributed.run --nproc-per-node N [--standalone |
    --nnodes M --node-rank K --rdzv-endpoint H:P] -m ampscope.engine PRESET ...``.
    """
    cmd = [sys.executable, "-m", ENGINE_MODULE, preset]
    if launch is not None and launch.distributed:
        cmd[1:3] = ["-m", TORCHRUN_MODULE, *launch.torchrun_args(), "-m", ENGINE_MODULE]
    if exit_with_parent:
        cmd.append("--exit-with-parent")
    if runs_dir is not None:
        cmd += ["--runs-dir", str(runs_dir)]
    for item in overrides:
        cmd += ["--set", item]
    cmd += list(extra)
    return cmd


def found_without_path() -> bool:
    """Whether a fresh interpreter imports this very ``ampscope`` with no PYTHONPATH: it is
    installed in site-packages, or an editable install's import hook maps the name here."""
    here = (_PACKAGE_PARENT / "ampscope" / "__init__.py").resolve()
    for finder in sys.meta_path:
        if finder is importlib.machinery.PathFinder or not hasattr(finder, "find_spec"):
            continue
        try:
            spec = finder.find_spec("ampscope", None)
        except Exception:  # noqa: BLE001 - a third party's finder: not ours to judge
            continue
        if spec is not None and spec.origin and Path(spec.origin).resolve() == here:
            return True
    installed = [*site.getsitepackages(), site.getusersitepackages()]
    return any(Path(p).resolve() == _PACKAGE_PARENT for p in installed)


def child_env(base: dict[str, str] | None = None, processes: int = 1) -> dict[str, str]:
    """The environment of any child that runs ampscope code.

    Safe-path mode keeps the working folder off ``sys.path``. Where a fresh interpreter would
    not import this very ``ampscope`` (a checkout run through PYTHONPATH, or one other than
    the installed), the folder holding it goes first on PYTHONPATH, so that the child runs the
    same code; otherwise nothing is added, and only ``ampscope`` is importable there (not the
    checkout's engine/, tui/, tests/ or benchmarks/ as top-level names). With
    ``processes`` ranks on this machine, each gets an equal share of the CPU cores for its
    threads (unless OMP_NUM_THREADS says otherwise), where torchrun would give each one.
    """
    env = dict(os.environ if base is None else base)
    if not found_without_path():
        rest = env.get("PYTHONPATH")
        env["PYTHONPATH"] = str(_PACKAGE_PARENT) + (os.pathsep + rest if rest else "")
    env["PYTHONSAFEPATH"] = "1"
    env.setdefault("PYTHONUNBUFFERED", "1")
    if processes > 1:
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // processes)))
    return env


def launch_env(launch: Launch | None) -> dict[str, str]:
    return child_env(processes=launch.nproc_per_node if launch is not None else 1)


def _load_prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()  # looked up here: the child between fork and exec must not import


def die_with_parent() -> None:
    """``preexec_fn`` for torchrun: the kernel sends it SIGTERM when its parent (the dashboard,
    ``ampscope run``) dies, even by SIGKILL; torchrun then stops every rank. The engine sets the
    same for itself; torchrun, not ours, needs it set from outside."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def stop_grace_s(launch: Launch | None, single: float) -> float:
    """How long a stop waits before SIGKILL: ranks finish their step, agree to stop and
    compare their weights first; torchrun itself gives them 30 s."""
    return max(single, 15.0) if launch is not None and launch.distributed else single


STOPPED_CODES = frozenset({-signal.SIGTERM, -signal.SIGINT, 128 + signal.SIGTERM, 130})
"""How a detached run's process ends when it is stopped (``ampscope stop``: SIGTERM) before it
could handle the signal itself, or after (130, a stopped run's code)."""


class EngineDidNotStart(Exception):
    """A detached engine exited before its hello. ``str()`` says why, in its own words;
    ``stopped``: it was stopped (SIGTERM, SIGINT) before it started, which is no failure."""

    def __init__(self, run_dir: Path, code: int, reason: str) -> None:
        self.stopped = code in STOPPED_CODES
        super().__init__(
            f"the engine for {run_dir.name} was stopped before it started."
            if self.stopped
            else f"the engine for {run_dir.name} exited (code {code}) before it started: {reason}"
        )
        self.run_dir = run_dir
        self.code = code


def launch_detached(
    preset: str,
    overrides: Sequence[str] = (),
    runs_dir: Path | None = None,
    launch: Launch | None = None,
    wait_s: float = START_WAIT_S,
    env: dict[str, str] | None = None,
    wait: Callable[[subprocess.Popen, Path, float], int | None] | None = None,
) -> tuple[Path, int]:
    """Start an engine that outlives this process; returns its run folder and pid.

    The preset is validated here (``presets.ConfigError`` on a bad one) and written resolved into
    the run folder, so the engine never depends on a file this process may delete. Returns
    once the engine said hello (or is still setting up after ``wait_s``); raises
    EngineDidNotStart when it exits before. The engine gets ``env`` (``child_env()`` unless
    given); ``wait`` waits for its hello (``wait_for_hello`` unless given).
    """
    resolved = presets.load_preset(preset, overrides)
    text = presets.to_toml(resolved)
    if not is_utf8(text):  # a byte that is no UTF-8 (a file name's): TOML cannot hold it
        raise presets.ConfigError(
            "a value of this run is not UTF-8 text (a byte of a file name in another "
            "encoding?): a detached run takes its preset as a TOML file, which holds only "
            "text. Rename the file or folder, or run it without --detach."
        )
    name = record_name(resolved.name, resolved.workload.model)
    run_dir = records.new_run_dir(runs_dir or records.default_runs_dir(), name)
    (run_dir / PRESET_COPY).write_text(text)
    (run_dir / records.EVENTS_FILE).touch()  # listed (and attachable) from now on
    command = [
        sys.executable,
        "-m",
        "ampscope",
        "run",
        str(run_dir / PRESET_COPY),
        "--run-dir",
        str(run_dir),
        *(launch.flags() if launch is not None else []),
    ]
    # The child inherits a descriptor on the record's .owner and holds it for its lifetime:
    # its proof, before any stop signals it, that it runs this record (core.ownership).
    owner = ownership.claim_for_child(run_dir)
    try:
        with open(run_dir / ENGINE_LOG, "ab") as log:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
                close_fds=True,
                pass_fds=(owner,),
                env=env if env is not None else child_env(),
            )
        ownership.note_group(owner, proc.pid)  # its session, so a stop may end all of it
    finally:
        os.close(owner)
    # Until the engine writes its own, this one says who runs the record.
    records.write_live(run_dir, proc.pid)
    try:
        code = (wait or wait_for_hello)(proc, run_dir, wait_s)
    except KeyboardInterrupt:  # Ctrl+C stops the wait, not the run: it runs on its own
        code = None
    if code is not None:
        records.clear_live(run_dir)
        failed = EngineDidNotStart(run_dir, code, why_not_started(run_dir))
        record_not_started(run_dir, str(failed), "stopped" if failed.stopped else "failed")
        raise failed
    # Reap it if this process lives longer than the run (the dashboard), so no zombie stays.
    threading.Thread(target=proc.wait, name="ampscope-detached-reaper", daemon=True).start()
    return run_dir, proc.pid


def record_not_started(run_dir: Path, message: str, status: ev.DoneStatus = "failed") -> None:
    """End the record of an engine that exited before it started, unless it did so itself:
    ``ampscope runs`` and History then list it ``failed``, with why (or ``stopped``: a stop
    before it started), not ``crashed``. A record that cannot even take that (a full disk) is
    removed, and the folder if nothing else is in it."""
    events = run_dir / records.EVENTS_FILE
    if any(isinstance(e, ev.DoneEvent) for e in records.tail_events(events)):
        return
    if status == "stopped":
        ending = ev.encode(ev.empty_done("stopped"))
    else:
        ending = ev.encode(ev.ErrorEvent(kind="exception", message=message))
        ending += ev.encode(ev.empty_done("failed", error=message))
    try:
        with events.open("ab") as fh:
            fh.write(ending)
    except OSError:
        for name in (records.EVENTS_FILE, PRESET_COPY, ENGINE_LOG, ownership.OWNER_FILE):
            with contextlib.suppress(OSError):
                (run_dir / name).unlink()
        with contextlib.suppress(OSError):
            run_dir.rmdir()


def wait_for_hello(proc: subprocess.Popen, run_dir: Path, wait_s: float) -> int | None:
    """Wait until the record holds the engine's hello; its exit code if it exited first."""
    events = run_dir / records.EVENTS_FILE
    deadline = time.monotonic() + wait_s
    while True:
        code = proc.poll()
        if said_hello(events):
            return None  # it runs (or already finished, which its record says)
        if code is not None:
            return code
        if time.monotonic() >= deadline:
            return None  # still setting up: it may yet fail, which its record will say
        time.sleep(START_POLL_S)


def said_hello(events: Path) -> bool:
    """Hello is among the first lines of ``events.jsonl`` (after the setup phase)."""
    try:
        with files.open_file(events, files.EVENTS_BYTES) as fh:
            head = fh.read(1 << 20)
    except OSError:
        return False
    return any(isinstance(ev.decode(line), ev.HelloEvent) for line in head.splitlines()[:4])


def why_not_started(run_dir: Path) -> str:
    """The engine's error event, else the last lines of its log."""
    for event in reversed(records.tail_events(run_dir / records.EVENTS_FILE)):
        if isinstance(event, ev.ErrorEvent):
            return event.message
    try:
        with files.open_file(run_dir / ENGINE_LOG, files.EVENTS_BYTES) as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 4096))
            lines = fh.read().decode(errors="replace").strip().splitlines()[-LOG_LINES:]
    except OSError:
        lines = []
    if not lines:
        return f"it wrote nothing (see {run_dir / ENGINE_LOG})."
    return "its log ends with:\n" + "\n".join(lines)
