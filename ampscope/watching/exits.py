"""How a watched run learns that its process is ending, so its record ends with ``done``.

Four ways out, each ending every open run:

- the interpreter exits (the script ran to its end, or ``sys.exit``): an ``atexit`` hook;
- an exception nobody caught: a ``sys.excepthook`` wrapper, which then calls the previous hook;
- ``sys.exit(code)`` (or the ``exit``/``quit`` builtins) on the main thread: noted, so that a
  script that ends with ``sys.exit(3)`` or ``sys.exit("bye")`` is recorded ``failed`` with its
  code, not ``ok`` (the atexit hook cannot see the exit code). A bare ``raise SystemExit(3)``
  outside a ``with watch(...)`` block is not seen;
- SIGTERM or SIGINT: a handler that notes the signal (the run then ends ``stopped``) and
  chains to the handler that was there before. Where that was the default, it does what the
  default would, but as an exception (SystemExit(143) for SIGTERM, KeyboardInterrupt for
  SIGINT), so the record can be finished on the way out. An ignored signal stays ignored;
- ``os._exit`` (a common way to skip a hanging NCCL or DataLoader teardown), which runs no
  hook at all: while a run is open it is wrapped, so the steps still queued, ``done`` and the
  summary are written and ``live.json`` removed before the process goes as asked. Status 0
  ends the run ``ok``, any other ``failed``.

The handler's own frame is taken out of the traceback of the exception it raises (or that the
previous handler raised), as soon as ampscope's code runs again (the run closing, or the
excepthook): a Ctrl+C traceback ends in the user's frame, as it would without ampscope.

Handlers are installed when the first run opens and put back when the last one closes, if
nobody replaced them meanwhile. Signal handlers need the main thread; from another thread
only the atexit and excepthook paths are used.

A forked child is not the process that runs those records: right after the fork its copies
are forgotten (``forget_after_fork``: nothing written, no lock or thread of the parent's
waited on) and the hooks are put back, so the child's own ending, whatever it is, writes
nothing into the parent's record and never waits on it. Torch-free.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any, NoReturn, Protocol

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class OpenRun(Protocol):
    def note_signal(self, signum: int) -> None: ...

    def close(self, error: BaseException | None = None) -> None: ...

    def note_exit(self, code: object) -> None: ...

    def forget_after_fork(self) -> None: ...


_open: list[OpenRun] = []
_previous_handlers: dict[int, Any] = {}
_previous_excepthook: Any = None
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
"""Where ampscope's own files are: frames there are not the user's."""
_raised: BaseException | None = None  # by the signal handler, its frame still in the traceback
_atexit_registered = False
_real_exit: Callable[[int], NoReturn] | None = None
"""``os._exit`` as it was before ours, while ours is in place."""
_exit_pid = 0
"""The process whose runs ours ends: a forked child's ``os._exit`` ends none of them."""
_FIRST_EXIT = os._exit
"""``os._exit`` when this module was loaded: what ours calls once it has been put back."""


class ProcessExit(Exception):
    """What a run that ended in ``os._exit(status)``, status not 0, is recorded as failing with."""

    def __init__(self, status: int) -> None:
        super().__init__(f"os._exit({status}) ended the process")


def register(run: OpenRun) -> None:
    global _atexit_registered
    if not _open:
        _install()
    _open.append(run)
    if not _atexit_registered:
        atexit.register(_at_exit)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
        _atexit_registered = True


def unregister(run: OpenRun) -> None:
    if run in _open:
        _open.remove(run)
        if not _open:
            _uninstall()


_previous_exits: dict[str, Any] = {}
"""``sys.exit`` and the ``exit``/``quit`` builtins as they were before ours (by name)."""


def _noting_exit(previous: Any) -> Any:
    def exit(code: object = None) -> Any:  # noqa: A001 - stands in for sys.exit
        if threading.current_thread() is threading.main_thread():  # elsewhere: a thread ends
            for run in list(_open):
                run.note_exit(code)
        return previous(code)

    exit._ampscope_noting = True  # type: ignore[attr-defined]
    return exit


def _exits() -> dict[str, tuple[Any, str]]:
    """Where the exits live: ``sys.exit`` and, when ``site`` made them, the builtins."""
    return {
        "sys.exit": (sys, "exit"),
        "exit": (builtins, "exit"),
        "quit": (builtins, "quit"),
    }


def _install() -> None:
    global _previous_excepthook, _real_exit, _exit_pid
    if os._exit is not _on_os_exit:
        _real_exit, _exit_pid = os._exit, os.getpid()
        os._exit = _on_os_exit
    if sys.excepthook is not _except_hook:
        _previous_excepthook = sys.excepthook
        sys.excepthook = _except_hook
    for key, (owner, name) in _exits().items():
        current = getattr(owner, name, None)
        if current is not None and not getattr(current, "_ampscope_noting", False):
            _previous_exits[key] = current
            setattr(owner, name, _noting_exit(current))
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in SIGNALS:
        current = signal.getsignal(signum)
        if current is _on_signal:
            continue
        try:
            signal.signal(signum, _on_signal)
        except (ValueError, OSError):
            continue
        _previous_handlers[signum] = current


def _uninstall() -> None:
    global _previous_excepthook, _real_exit
    _hide_handler_frame()
    if os._exit is _on_os_exit and _real_exit is not None:
        os._exit = _real_exit  # type: ignore[assignment]
        _real_exit = None
    if sys.excepthook is _except_hook and _previous_excepthook is not None:
        sys.excepthook = _previous_excepthook
        _previous_excepthook = None
    for key, (owner, name) in _exits().items():
        current = getattr(owner, name, None)
        if key in _previous_exits and getattr(current, "_ampscope_noting", False):
            setattr(owner, name, _previous_exits.pop(key))
    if threading.current_thread() is not threading.main_thread():
        return
    for signum, previous in list(_previous_handlers.items()):
        if signal.getsignal(signum) is _on_signal:
            try:
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            except (ValueError, OSError, TypeError):
                continue
            del _previous_handlers[signum]


def _on_signal(signum: int, frame: FrameType | None) -> Any:
    global _raised
    previous = _previous_handlers.get(signum, signal.SIG_DFL)
    if previous == signal.SIG_IGN:
        return None
    for run in list(_open):
        run.note_signal(signum)
    try:
        if callable(previous):
            return previous(signum, frame)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)
    except BaseException as exc:
        _raised = exc
        raise


def _hide_handler_frame(package: str = _PACKAGE) -> None:
    """Splice ``_on_signal``'s frame out of the traceback of what it raised, and cut the frames
    of ampscope's own that end it (a signal that lands inside ``mon.step``): by now the
    exception has reached the frame it interrupted, and the traceback ends in the user's code
    (or in a library's the user called, as it would without ampscope). ``package``: the folder
    whose frames are ampscope's own."""
    global _raised
    exc, _raised = _raised, None
    tb = exc.__traceback__ if exc is not None else None
    last_outside: TracebackType | None = None
    while tb is not None:
        if tb.tb_next is not None and tb.tb_next.tb_frame.f_code is _on_signal.__code__:
            tb.tb_next = tb.tb_next.tb_next
        if not _ours(tb, package):
            last_outside = tb
        tb = tb.tb_next
    if last_outside is not None:  # what follows it is ampscope's
        last_outside.tb_next = None


def _ours(tb: TracebackType, package: str = _PACKAGE) -> bool:
    return tb.tb_frame.f_code.co_filename.startswith(package)


def _except_hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    _hide_handler_frame()
    hook = _previous_excepthook or sys.__excepthook__  # closing the last run puts it back
    for run in list(_open):
        run.close(value)
    hook(kind, value, tb)


def _on_os_exit(status: int) -> NoReturn:
    """``os._exit`` while a run is open: every open run ends first, then the process goes."""
    real = _real_exit if _real_exit is not None else _FIRST_EXIT  # closing puts it back
    if os.getpid() == _exit_pid:
        error = ProcessExit(status) if status else None
        for run in list(_open):
            with contextlib.suppress(BaseException):  # the process goes as asked, whatever
                run.close(error)
    real(status)


def _at_exit() -> None:
    for run in list(_open):
        run.close(None)


def _after_fork_in_child() -> None:
    """In a forked child: the open runs are the parent's. Forget them before the child's code
    goes on, so that no hook of ours ends (writes to) them on the child's way out."""
    runs = list(_open)
    _open.clear()
    _uninstall()
    for run in runs:
        run.forget_after_fork()
