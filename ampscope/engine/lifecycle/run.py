"""One run from preset to record: load the preset, open the record, run it, close the record.

The process-level steps live here and import no torch, so that a refused preset answers at
once and the first event (setup started) is out before torch's import; the run itself (setup,
hello, the loop, done) is ``training.train_preset``. Started by torchrun, every rank runs this,
but only rank 0 writes the event stream and the record (the others have no outputs).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from ampscope.core import events as ev
from ampscope.core import presets, records
from ampscope.core.records.writer import RecordWriter
from ampscope.engine.emitter import EventWriter, LiveStream
from ampscope.engine.lifecycle.children import end_users_children, mark_descendants
from ampscope.engine.lifecycle.exits import EXIT_FAILED, EXIT_OK, EXIT_STOPPED, EXIT_USAGE, refuse
from ampscope.engine.lifecycle.record import discard_unstarted, open_record, open_run_dir
from ampscope.engine.lifecycle.stopping import (
    LOOP_GRACE_S,
    RANKS_LOOP_GRACE_S,
    SoFar,
    install_signal_handlers,
    watch_parent,
)
from ampscope.engine.ranks import RankEnv

if TYPE_CHECKING:  # imports torch: a run imports it once its first event is out
    from ampscope.engine.lifecycle.parts import Parts

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_STOPPED", "EXIT_USAGE", "run"]


def run(
    preset_name: str,
    overrides: Sequence[str] = (),
    *,
    json_out: bool = False,
    runs_dir: Path | None = None,
    record: bool = True,
    on_event: Callable[[ev.Event], None] | None = None,
    exit_with_parent: bool = False,
    run_dir: Path | None = None,
    profile: tuple[int, int] | None = None,
    on_record: Callable[[Path], None] | None = None,
    parts: Parts | None = None,
) -> int:
    """``on_record``: told the run's folder once it exists, before anything can fail or stop
    (a console says where the record is at any ending, also one before ``hello``). ``parts``:
    what the run is made of (``lifecycle.parts``), the engine's own unless given."""
    try:
        ranks = RankEnv.from_environ()
        preset = presets.load_preset(preset_name, overrides)
    except presets.ConfigError as exc:
        if RankEnv.lead_by_environ():
            return refuse(str(exc), json_out, on_event)
        return EXIT_USAGE
    streamed = json_out  # every rank's stdout reaches the reader under torchrun
    if not ranks.lead:  # rank 0 speaks for the run
        json_out, record, on_event, run_dir = False, False, None, None

    given, made = run_dir, None
    try:
        made = run_dir = open_run_dir(preset, record, runs_dir, run_dir)
        saved = open_record(run_dir, preset) if run_dir else None
    except OSError as exc:
        if made is not None and given is None:  # a full disk: no empty folder listed crashed
            discard_unstarted(made)
        return refuse(cannot_record(exc, runs_dir, run_dir), json_out, on_event, kind="io")
    if run_dir is not None and on_record is not None:
        on_record(run_dir)
    live, events_fd = None, None
    if streamed:
        events_fd = keep_events_apart()
        if json_out:
            live = LiveStream(events_fd, recorded=saved is not None)
    writer = EventWriter(saved, live, on_event)
    forked = guard_forks(writer, saved)
    stop, in_loop, importing = threading.Event(), threading.Event(), threading.Event()
    ending = threading.Lock()  # the main thread or the stop watch ends the run, never both

    so_far = SoFar()
    end_stuck = stuck_ender(writer, saved, ending, so_far)
    restore_exit = record_users_exit(
        writer, saved, ending, so_far, tell=on_event is None and not json_out
    )
    grace = RANKS_LOOP_GRACE_S if ranks.distributed else LOOP_GRACE_S
    install_signal_handlers(stop, in_loop, end_stuck, grace, importing)
    if exit_with_parent:
        watch_parent(stop, writer)

    writer.emit(ev.PhaseEvent(phase="setup", state="start"), urgent=True)  # before torch's import
    hello: ev.HelloEvent | None = None
    done: ev.DoneEvent | None = None
    try:
        warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
        train_preset = import_training(importing, stop)  # imports torch: seconds
        code, hello, done = train_preset(
            preset, run_dir, writer, stop, in_loop, ranks, profile, so_far, parts
        )
    except KeyboardInterrupt:  # stopped while torch was still importing
        done, code = end_import_stopped(writer), EXIT_STOPPED
    finally:
        ending.acquire()
        end_users_children(writer)  # what ending the run missed (its warning came before done)
        forked.clear()
        restore_exit()
        writer.close()
        if saved:
            saved.close(hello, writer.done or done)
        if events_fd is not None:  # stdout is the stream's again, for a caller in this process
            sys.stdout.flush()
            os.dup2(events_fd, sys.stdout.fileno())
            os.close(events_fd)
    if ranks.distributed:  # no teardown of the process group: see engine.link.RankLink.close
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


_RUNNING: list[Callable[[], None]] = []
"""What a forked child of the running engine does right after the fork (one run at a time)."""


def _after_fork_in_child() -> None:
    for forget in _RUNNING:
        forget()
    _RUNNING.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def guard_forks(writer: EventWriter, saved: RecordWriter | None) -> list[Callable[[], None]]:
    """A child the user's code forks (a factory, a data iterator) writes nothing of the
    parent's run. One that comes back into ampscope's run (both processes went on past the
    fork) leaves at its first event: otherwise the record would get a second hello, every
    step twice and a second done. A child that runs its own work and exits (a DataLoader
    worker) is left alone. Returns the list the guard is in: cleared, the guard is off."""
    engine_pid = os.getpid()

    def leave() -> None:
        with contextlib.suppress(OSError, ValueError):
            print(
                f"ampscope: process {os.getpid()}, forked by your code from the engine "
                f"(process {engine_pid}), came back into ampscope's run: the run and its "
                "record are the engine's, so this copy leaves. Let a forked child run its own "
                "work and end with os._exit().",
                file=sys.stderr,
                flush=True,
            )
        os._exit(EXIT_FAILED)  # not sys.exit: nothing of the parent's is flushed twice

    def forget() -> None:
        writer.forget_after_fork(leave)
        if saved is not None:
            saved.forget_after_fork()

    _RUNNING[:] = [forget]
    return _RUNNING


def end_import_stopped(writer: EventWriter) -> ev.DoneEvent:
    """A stop while torch imported: what the user's code left (a factory's import may have
    started something), then ``done``."""
    end_users_children(writer)
    done = ev.empty_done("stopped")
    writer.emit(done, urgent=True)
    return done


def import_training(importing: threading.Event, stop: threading.Event) -> Any:
    """``training.train_preset``, imported (torch with it: seconds) with stops held off the
    import itself (``stopping.install_signal_handlers``); a stop that came meanwhile is a
    KeyboardInterrupt here, once the import is whole."""
    importing.set()
    try:
        from ampscope.engine.lifecycle.training import train_preset
    finally:
        importing.clear()
    if stop.is_set():
        raise KeyboardInterrupt
    return train_preset


def stuck_ender(
    writer: EventWriter, saved: RecordWriter | None, ending: threading.Lock, so_far: SoFar
) -> Callable[[], None]:
    """What ends a run whose main thread cannot (stuck in torch, in a step that never ends):
    the summary so far, ``stopped``, then the process goes."""

    def end_stuck() -> None:
        if not ending.acquire(blocking=False):
            return  # the main thread is ending the run itself
        writer.end_here()  # a step that fails now (its child ended below) ends nothing more
        end_users_children(writer)
        hello, done = so_far.now()
        writer.emit(done, urgent=True)  # unless the main thread's done was out first
        done = writer.done or done
        writer.close()
        if saved:
            saved.close(hello, done)
        sys.stdout.flush()
        code = EXIT_STOPPED if done.status == "stopped" else EXIT_FAILED
        os._exit(code)  # the lock is held: the guard below only exits

    return end_stuck


def keep_events_apart() -> int:
    """The event stream gets a descriptor of its own, a copy of stdout, and fd 1 then goes to
    stderr: what the user's code prints (``print('.', end='')``, ``os.write(1, ...)``, a
    library's progress bar) reaches the reader as output, never inside the JSON lines."""
    sys.stdout.flush()
    events_fd = os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return events_fd


def record_users_exit(
    writer: EventWriter,
    saved: RecordWriter | None,
    ending: threading.Lock,
    so_far: SoFar,
    tell: bool,
) -> Callable[[], None]:
    """While the run is live, ``os._exit`` is the user's (ampscope's own calls hold
    ``ending`` first): their call is written down as a failure at the step it came in, with
    the summary of the steps before it, the processes their code started are ended, then the
    process goes as asked. A forked child (a DataLoader worker leaves through os._exit)
    writes nothing of the parent's. Every process started meanwhile carries the run's mark
    (``children.mark_descendants``). Returns what puts ``os._exit`` and the mark back."""
    real_exit, engine_pid = os._exit, os.getpid()
    unmark = mark_descendants()

    def users_exit(status: int) -> NoReturn:
        if os.getpid() == engine_pid and ending.acquire(blocking=False):
            writer.end_here()
            step = so_far.step_now()
            where = f"at step {step}" if step is not None else "before the first step"
            message = (
                f"your code called os._exit({status}) {where}, which ends the process at once: "
                "the run stopped there and is recorded failed."
            )
            error = blamed(ev.ErrorEvent(kind="exception", message=message, step=step))
            message = error.message  # 'rank 1: ...' on one rank of several
            writer.emit(error, urgent=True)
            end_users_children(writer)
            hello, done = so_far.now("failed", message)
            writer.emit(done, urgent=True)
            done = writer.done or done
            writer.close()
            if saved:
                saved.close(hello, done)
            if tell:
                print(f"ampscope: {message}", file=sys.stderr)
            sys.stdout.flush()
            status = status or EXIT_FAILED  # a run that did not finish never exits 0
        real_exit(status)

    def restore() -> None:
        os._exit = real_exit
        unmark()

    os._exit = users_exit
    return restore


def blamed(event: ev.ErrorEvent) -> ev.ErrorEvent:
    """``event`` told to the other ranks as this rank's failure (``link.blame_here``), where
    this process joined several: imported only then (it needs torch)."""
    link = sys.modules.get("ampscope.engine.ranks.link")
    return link.blame_here(event) if link is not None else event


def cannot_record(exc: OSError, runs_dir: Path | None, run_dir: Path | None) -> str:
    """A runs folder that cannot be written, said with the folder and the OS's reason."""
    where = exc.filename or run_dir or runs_dir or records.default_runs_dir()
    reason = str(exc.strerror or exc)
    in_the_way = next((p for p in (Path(where), *Path(where).parents) if p.exists()), None)
    if in_the_way is not None and not in_the_way.is_dir():  # 'File exists' alone misleads
        reason += f" ({in_the_way} is a file, not a folder)"
    return (
        f"cannot create the run record in {where}: {reason}. Pass --runs-dir with "
        "a writable folder, or --no-record to run without a record."
    )
