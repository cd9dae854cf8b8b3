"""The viewer processes behind ``ampscope serve``: one per browser tab, each with a bounded life.

textual-serve's own handler passes a viewer's frames straight to its tab's socket. A tab that
stops reading then holds up the reading of the viewer's output, the viewer blocks in its next
write, and once the tab goes nothing reads that output any more: the viewer never sees its
quit and stays, with all it holds, while it no longer counts toward ``--max-viewers``. Here:

- a viewer's output is always read; what waits for its tab is capped (OUTBOX_BYTES). Past the
  cap the backlog is dropped, and once the tab has taken the rest the viewer repaints its whole
  screen (cli/serve/viewer.py, REPAINT_SIGNAL), so a slow tab sees the current screen, not every one;
- a tab that takes nothing for SEND_STALL_S is disconnected;
- once the socket closes the viewer is asked to quit; after QUIT_S its process group gets
  SIGTERM, after TERM_S more SIGKILL;
- a tab counts toward ``--max-viewers`` until its viewer process has exited;
- every message from the tab is checked (``messages.browser_message``) before the viewer gets it:
  one that the page would never send closes that tab, and only that one;
- a viewer goes when serve does, however serve goes: it is told serve's pid (PARENT_ENV) and
  watches for its end (cli/serve/viewer.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import signal
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web
from textual_serve.app_service import AppService
from textual_serve.download_manager import DownloadManager
from textual_serve.server import Server

from ampscope.cli.serve.messages import BadMessage, browser_message
from ampscope.cli.serve.viewer import PARENT_ENV, REPAINT_SIGNAL
from ampscope.core.text import visible

OUTBOX_BYTES = 4 << 20
"""Frames held for one tab; more than this and the backlog is dropped for a repaint."""
SEND_STALL_S = 20.0
"""A tab that takes no frame for this long is disconnected."""
QUIT_S = 2.0
"""After its socket closes, how long a viewer has to quit before SIGTERM."""
TERM_S = 2.0
"""After SIGTERM, how long before SIGKILL."""
CLOSE_S = 2.0
"""How long a closing handshake may take before the connection is cut."""

log = logging.getLogger("textual-serve")


@dataclass(frozen=True)
class Limits:
    """What one tab's viewer is allowed: the backlog held for its tab, how long a send may
    stall, and how long the viewer has to quit, then to end after SIGTERM."""

    outbox_bytes: int = OUTBOX_BYTES
    send_stall_s: float = SEND_STALL_S
    quit_s: float = QUIT_S
    term_s: float = TERM_S


class Outbox:
    """The frames waiting for one tab, sent as fast as it takes them.

    ``put_bytes`` and ``put_str`` never wait, so the viewer's output is always read. The
    backlog stays under ``limit`` (or one frame, if a single frame is larger).
    """

    def __init__(self, limit: int = OUTBOX_BYTES, stall_s: float = SEND_STALL_S) -> None:
        self.frames: deque[bytes | str] = deque()
        self.size = 0
        self.limit = limit
        self.stall_s = stall_s
        self.behind = False  # frames were dropped: the tab's screen needs a repaint
        self.drops = 0
        self.ready = asyncio.Event()

    def put(self, frame: bytes | str) -> None:
        if self.frames and self.size + len(frame) > self.limit:
            self.frames.clear()
            self.size = 0
            self.behind = True
            self.drops += 1
        self.frames.append(frame)
        self.size += len(frame)
        self.ready.set()

    async def put_bytes(self, data: bytes) -> None:
        self.put(data)

    async def put_str(self, text: str) -> None:
        self.put(text)

    async def send_all(self, ws: web.WebSocketResponse, repaint: Callable[[], None]) -> None:
        """Send frames until the socket fails (raises) or one send takes over ``stall_s``
        (``asyncio.TimeoutError``); ask for a repaint whenever the tab caught up after drops."""
        while True:
            await self.ready.wait()
            self.ready.clear()
            while self.frames:
                frame = self.frames.popleft()
                self.size -= len(frame)
                if isinstance(frame, bytes):
                    await asyncio.wait_for(ws.send_bytes(frame), self.stall_s)
                else:
                    await asyncio.wait_for(ws.send_str(frame), self.stall_s)
            if self.behind:
                self.behind = False
                repaint()


async def _nothing() -> None:
    """The viewer's "exit" needs no action here: its output ends, and the socket is closed."""


class ViewerProcess(AppService):
    """textual-serve's AppService, in its own process group, its output never held up."""

    def __init__(
        self,
        command: str,
        outbox: Outbox,
        downloads: DownloadManager,
        limits: Limits | None = None,
    ) -> None:
        self.limits = limits or Limits()
        super().__init__(
            command,
            write_bytes=outbox.put_bytes,
            write_str=outbox.put_str,
            close=_nothing,
            download_manager=downloads,
        )

    def _build_environment(self, width: int = 80, height: int = 24) -> dict[str, str]:
        environment = super()._build_environment(width, height)
        environment[PARENT_ENV] = str(os.getpid())  # the viewer ends when this process does
        return environment

    async def _open_app_process(
        self, width: int = 80, height: int = 24
    ) -> asyncio.subprocess.Process:
        pipe = asyncio.subprocess.PIPE
        self._process = process = await asyncio.create_subprocess_exec(
            *shlex.split(self.command),
            stdin=pipe,
            stdout=pipe,
            stderr=pipe,
            env=self._build_environment(width=width, height=height),
            start_new_session=True,  # its group is its own: SIGTERM and SIGKILL reach all of it
        )
        self._stdin = process.stdin
        return process

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    @property
    def output_done(self) -> asyncio.Task[None] | None:
        """The task that reads the viewer's output: done once the viewer has closed it."""
        return self._task

    def repaint(self) -> None:
        if self.running and self.pid is not None:
            with suppress(ProcessLookupError):
                os.kill(self.pid, REPAINT_SIGNAL)

    def _signal_group(self, signum: int) -> None:
        if self.pid is not None:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signum)

    async def end(self) -> None:
        """Quit, then SIGTERM, then SIGKILL the viewer's group; return once it has exited."""
        process = self._process
        if process is None:
            return
        await self._download_manager.cancel_app_downloads(app_service_id=self.app_service_id)
        if process.returncode is None:
            with suppress(Exception):
                await asyncio.wait_for(self.send_meta({"type": "quit"}), self.limits.quit_s)
        quit_s, term_s = self.limits.quit_s, self.limits.term_s
        for signum, wait_s in ((0, quit_s), (signal.SIGTERM, term_s), (signal.SIGKILL, None)):
            if signum:
                self._signal_group(signum)
            try:
                await asyncio.wait_for(process.wait(), wait_s)
                break
            except asyncio.TimeoutError:
                continue
        self._signal_group(signal.SIGKILL)  # anything the viewer itself started
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None


async def pass_messages(
    ws: web.WebSocketResponse, request: web.Request, viewer: ViewerProcess
) -> None:
    """The tab's messages to its viewer, each checked first, until the tab goes or sends one
    that is not a message of the page's; that one closes the socket (1008) and is told in
    serve's terminal in one line."""
    async for message in ws:
        if message.type == WSMsgType.ERROR:
            return
        try:
            if message.type != WSMsgType.TEXT:
                raise BadMessage("a binary message")
            kind, data = browser_message(message.data)
        except BadMessage as bad:
            peer = visible(request.remote or "a browser")
            log.warning("ampscope serve: closed the tab of %s: its browser sent %s.", peer, bad)
            with suppress(Exception, asyncio.CancelledError):
                reason = f"ampscope serve: {bad}"[:120].encode()
                await asyncio.wait_for(
                    ws.close(code=WSCloseCode.POLICY_VIOLATION, message=reason), CLOSE_S
                )
            return
        if kind == "stdin":
            await viewer.send_bytes(data.encode("utf-8"))
        elif kind == "resize":
            await viewer.set_terminal_size(*data)
        elif kind == "ping":
            await ws.send_json(["pong", data])
        elif kind == "focus":
            await viewer.focus()
        elif kind == "blur":
            await viewer.blur()


async def hang_up(ws: web.WebSocketResponse, request: web.Request) -> None:
    """Close the socket, then cut the connection: a tab that takes nothing would otherwise
    hold it open (its unsent frames keep a closing transport alive).

    A cancelled wait is swallowed too: after a send timed out, aiohttp's shared drain waiter
    is cancelled, and so is any close that waits on it.
    """
    if ws.prepared and not ws.closed:
        with suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(ws.close(), CLOSE_S)
    if request.transport is not None:
        request.transport.abort()


async def serve_tab(server: Server, request: web.Request) -> web.WebSocketResponse:
    """One tab's socket and viewer, from the handshake until the viewer has exited.

    It ends when the tab goes, stops taking frames, or sends what is not a message, or when
    the viewer ends; the viewer is then ended too (``ViewerProcess.end``). The server's
    ``limits`` bound it, and its ``outbox`` makes the tab's ``Outbox``, where it has them.
    """
    limits: Limits = getattr(server, "limits", None) or Limits()
    make_outbox: Callable[[int, float], Any] = getattr(server, "outbox", None) or Outbox
    ws = web.WebSocketResponse(heartbeat=15)
    width = int(request.query.get("width", 80))  # checked by serve.size_refusal
    height = int(request.query.get("height", 24))
    outbox = make_outbox(limits.outbox_bytes, limits.send_stall_s)
    viewer = ViewerProcess(server.command, outbox, server.download_manager, limits)
    tasks: list[asyncio.Future[None]] = []
    try:
        await ws.prepare(request)
        await viewer.start(width, height)
        tasks += [
            asyncio.ensure_future(outbox.send_all(ws, viewer.repaint)),
            asyncio.ensure_future(pass_messages(ws, request, viewer)),
        ]
        ended = [*tasks, viewer.output_done] if viewer.output_done else tasks
        await asyncio.wait(ended, return_when=asyncio.FIRST_COMPLETED)
    except ConnectionError as error:  # the tab went in the handshake or while its viewer started
        peer = visible(request.remote or "a browser")
        log.info("ampscope serve: the tab of %s went before its viewer started (%s).", peer, error)
    except Exception as error:  # noqa: BLE001 - one tab's failure ends that tab only
        # one line in serve's terminal; the traceback for whoever runs it with debug logging
        peer = visible(request.remote or "a browser")
        said = visible(f"{type(error).__name__}: {error}", 400)
        log.error("ampscope serve: the tab of %s ended: %s", peer, said)
        log.debug("the tab's failure", exc_info=error)
    finally:
        await hang_up(ws, request)
        for task in tasks:
            task.cancel()
            with suppress(asyncio.CancelledError, Exception):
                await task
        await viewer.end()
    return ws
