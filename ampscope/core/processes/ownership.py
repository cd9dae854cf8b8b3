"""Proof that a process is the one running a record, before ampscope ever signals it.

``live.json`` names a pid, its host and its start time, and anyone can read all three for any
process: a forged ``live.json`` naming a foreign process with its true start time passes every
check made from public facts. So the proof is one that only the run's own process can give:
it holds the run folder's ``.owner`` file open for as long as it runs (a file descriptor), and
``/proc/PID/fd`` shows it.

Why a held file and not a secret in the environment: ``/proc/PID/environ`` shows the
environment a process was *started* with, so a process that was not started by ampscope (a
training loop under ``ampscope.watch``, ``ampscope run`` typed in a shell) could never show a
token it made itself. Any process can open a file. ``.owner`` is created by the run's process
(or by the launcher, which hands the open descriptor to its child), mode 0600, and the check
accepts it only as a regular file owned by this user with a single link: another user cannot
create one that passes, nor point one (symlink, hard link) at a file a foreign process holds.
Reading another process's descriptors needs the same rights as signalling it, and where there
is no ``/proc`` there is no proof, so nothing is signalled by record.

``.owner`` also says whether the launcher created a process group for the run (``group``):
only then is the whole group signalled, never a group that merely happens to be led by the pid.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path
from typing import Any

from ampscope.core.records import files

OWNER_FILE = ".owner"
_held: dict[str, int] = {}
"""Run folder -> the descriptor this process holds on its ``.owner``."""


def _open_owner(run_dir: Path) -> int:
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(run_dir / OWNER_FILE, flags, 0o600)
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o600)
    return fd


def claim(run_dir: Path) -> int:
    """Hold ``.owner`` open from now on, as this process's proof that it runs ``run_dir``.

    Idempotent; raises OSError when the folder cannot hold the file (the caller's heartbeat
    reports that as it reports a ``live.json`` it cannot write).
    """
    key = os.path.abspath(run_dir)
    if key not in _held:
        _held[key] = _inherited(run_dir) or _open_owner(run_dir)
    return _held[key]


def _inherited(run_dir: Path) -> int | None:
    """The descriptor on ``.owner`` a detached launcher passed this process (``pass_fds``
    leaves it inheritable), made close-on-exec and kept as this process's own: otherwise
    every program the user's code starts (``os.system``, a tool) would hold it too."""
    try:
        want = os.stat(run_dir / OWNER_FILE, follow_symlinks=False)
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except (OSError, ValueError):
        return None  # no .owner yet, or no /proc
    for fd in fds:
        try:
            info = os.fstat(fd)
            if (info.st_dev, info.st_ino) == (want.st_dev, want.st_ino) and os.get_inheritable(fd):
                os.set_inheritable(fd, False)
                return fd
        except OSError:  # the listing's own descriptor, since closed
            continue
    return None


def claim_for_child(run_dir: Path) -> int:
    """A descriptor on ``.owner`` for a child to inherit (``pass_fds``); the caller closes it."""
    return _open_owner(run_dir)


def note_group(fd: int, leader: int) -> None:
    """Record, in ``.owner`` (which only this user can write), that ampscope made ``leader``
    the leader of a new process group, so that a stop may signal that whole group."""
    data = json.dumps({"group": leader}).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def release(run_dir: Path) -> None:
    """This process no longer runs ``run_dir`` (its record is closed)."""
    fd = _held.pop(os.path.abspath(run_dir), None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def forget_all_after_fork() -> None:
    """In a forked child: it is not the process that runs those records; drop its copies."""
    for fd in _held.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


if hasattr(os, "register_at_fork"):  # a forked child (a DataLoader worker) runs no record
    os.register_at_fork(after_in_child=forget_all_after_fork)


def _owner_identity(run_dir: Path) -> tuple[int, int] | None:
    try:
        info = os.lstat(run_dir / OWNER_FILE)
    except OSError:
        return None
    if (
        not stat.S_ISREG(info.st_mode)
        or info.st_uid != os.getuid()
        or info.st_nlink != 1
        or info.st_mode & 0o077
    ):
        return None
    return info.st_dev, info.st_ino


def holds_owner(pid: int, run_dir: Path) -> bool:
    """True when process ``pid`` holds this run folder's ``.owner`` open: it runs the record."""
    identity = _owner_identity(run_dir)
    if identity is None:
        return False
    try:
        entries = list(os.scandir(f"/proc/{pid}/fd"))
    except OSError:
        return False  # not ours to read (another user), gone, or no /proc
    for entry in entries:
        try:
            info = os.stat(entry.path)
        except OSError:
            continue
        if (info.st_dev, info.st_ino) == identity:
            return True
    return False


def group_leader(run_dir: Path) -> int | None:
    """The pid whose process group ampscope created for this run, if the launcher made one."""
    if _owner_identity(run_dir) is None:
        return None
    try:
        raw = files.read_bytes(run_dir / OWNER_FILE, follow_links=False)
        data: Any = json.loads(raw or b"{}")
        leader = int(data.get("group", 0)) if isinstance(data, dict) else 0
    except (OSError, ValueError, TypeError, OverflowError, RecursionError):
        return None
    return leader if leader > 0 else None
