"""``ampscope serve``: a read-only dashboard that follows the current run, served to browsers.

Each browser tab gets its own viewer (``python -m ampscope.cli.serve.viewer``, about 70 MB; its
life and its frames are cli/serve/viewers.py's). So the number of tabs watching at once is
limited (``--max-viewers``), and the websocket that carries the screen accepts only the page this
server handed out: any other web page the presenter opens could otherwise connect to it
and read the live screen.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import ipaddress
import logging
import os
import shlex
import signal
import socket
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ampscope.cli.output import fail, not_a_runs_folder
from ampscope.cli.serve.messages import SIZE_RANGE
from ampscope.core import records
from ampscope.core.processes.launch import child_env
from ampscope.core.text import visible

LOOPBACK_NAMES = ("localhost", "ip6-localhost")
VIEWERS_RANGE = (1, 64)


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def viewer_command(root: Path, refresh: float | None = None) -> str:
    words = [sys.executable, "-m", "ampscope.cli.serve.viewer", "--runs-dir", str(root.resolve())]
    if refresh is not None:
        words += ["--refresh", str(refresh)]
    return shlex.join(words)


def refusal(origin: str | None, host: str, bound_to_loopback: bool) -> str | None:
    """Why a websocket from ``origin`` (its Origin header) to ``host`` (its Host header) is
    refused, or None to accept it.

    Browsers send Origin on every websocket: it must be this server's own address. A client
    that sends none is not a web page. On a loopback address the Host must be a loopback
    name too, so that a page on another name that resolves here (DNS rebinding) is refused.
    """
    hostname = urlsplit(f"//{host}").hostname or ""
    if bound_to_loopback and not is_loopback(hostname):
        return f"Host {host!r} is not this machine's loopback address"
    if origin is None:
        return None
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or parts.netloc.lower() != host.lower():
        return f"the page at {origin!r} is not this viewer's own page ({host})"
    return None


def size_refusal(query: Mapping[str, str]) -> str | None:
    """Why the terminal size a websocket asks for (its ``width`` and ``height``) is refused,
    or None to accept it; either left out takes textual-serve's default (80 x 24)."""
    low, high = SIZE_RANGE
    for key in ("width", "height"):
        value = query.get(key)
        if value is None:
            continue
        try:
            number = int(value)
        except ValueError:
            number = None
        if number is None or not low <= number <= high:
            shown = visible(value, 40)
            return f"{key}={shown} is not a terminal size: give a whole number from {low} to {high}"
    return None


def listening_sockets(host: str, port: int) -> list[socket.socket]:
    """Sockets bound to ``host:port`` and listening (one per address the name has), made
    before anything is printed: a port already taken fails here (OSError). Port 0 is the free
    port the first address gets, the same for the others."""
    made: list[socket.socket] = []
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _name, address in dict.fromkeys(addresses):
            sock = socket.socket(family, kind, proto)
            made.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(made) > 1:
                address = (address[0], made[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(128)
            sock.setblocking(False)
    except OSError:
        for sock in made:
            sock.close()
        raise
    return made


class MalformedRequests(logging.Filter):
    """aiohttp logs a request it cannot parse (bytes that are no HTTP, a header past its limit,
    a bad Content-Length) as an error with its traceback, which textual-serve's log drew as a
    page of frames and locals in serve's terminal for each one: the client's fault, said here
    in one line, with what was wrong."""

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError

        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            # "Invalid character in Content-Length:", the bytes, a caret under the fault
            lines = [line.strip() for line in str(exc.message).splitlines()]
            said = " ".join(line for line in lines if line.strip("^"))
            who = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.msg = "refused a malformed request from %s: %s"
            record.args = (visible(who, 80), visible(said or type(exc).__name__, 200))
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


class VisibleRequests(logging.Filter):
    """The access log's line for a request names what its client sent (the path, the
    User-Agent and Referer headers): with its control characters spelled out, as everything
    else from outside is, or a client's C1 escape or bidi override reached serve's terminal."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = visible(record.getMessage()), None
        return True


def plain_request_logs() -> None:
    """Malformed requests are logged in one line each (``MalformedRequests``), and every
    request's access line with its control characters spelled out (``VisibleRequests``):
    once a process."""
    for name, kind in (("aiohttp.server", MalformedRequests), ("aiohttp.access", VisibleRequests)):
        log = logging.getLogger(name)
        if not any(isinstance(f, kind) for f in log.filters):
            log.addFilter(kind())


def viewer_server_class() -> type:
    """textual-serve's Server with a viewer limit, a same-origin websocket and viewers of
    bounded life (cli/serve/viewers.py); imported late: textual-serve is optional."""
    from aiohttp import web
    from textual_serve.server import Server

    from ampscope.cli.serve import viewers

    class ViewerServer(Server):
        def __init__(
            self,
            *args: Any,
            max_viewers: int = 4,
            tab: Any = None,
            limits: viewers.Limits | None = None,
            outbox: Any = None,
            **kwargs: Any,
        ) -> None:
            """``tab`` serves one tab's websocket (``viewers.serve_tab``, which starts its
            viewer, unless given); ``limits`` bound each viewer and ``outbox`` makes a tab's
            backlog (``viewers.Limits()`` and ``viewers.Outbox`` unless given)."""
            super().__init__(*args, **kwargs)
            self.max_viewers = max_viewers
            self.serve_tab = tab or viewers.serve_tab
            self.limits = limits or viewers.Limits()
            self.outbox = outbox or viewers.Outbox
            self.tabs: dict[asyncio.Future[web.WebSocketResponse], web.Request] = {}
            self.loopback = is_loopback(self.host)

        @property
        def viewers(self) -> int:
            """Tabs open, and tabs closed whose viewer process has not exited yet."""
            return len(self.tabs)

        async def handle_index(self, request: web.Request) -> web.StreamResponse:
            """The page refuses a size its viewer could not start on, as the websocket does:
            a 400 with the reason, not a page whose screen then never comes."""
            bad_size = size_refusal(request.query)
            if bad_size is not None:
                return web.Response(status=400, text=f"ampscope serve: {bad_size}.\n")
            return await super().handle_index(request)

        # A refused viewer gets a plain HTTP answer, not a websocket: wider than the base's.
        async def handle_websocket(self, request: web.Request) -> web.StreamResponse:  # type: ignore[override]
            why = refusal(request.headers.get("Origin"), request.host, self.loopback)
            if why is not None:
                return web.Response(status=403, text=f"ampscope serve: refused: {why}.\n")
            bad_size = size_refusal(request.query)
            if bad_size is not None:  # the viewer would fail to start on it
                return web.Response(status=400, text=f"ampscope serve: {bad_size}.\n")
            if not web.WebSocketResponse().can_prepare(request).ok:  # a plain GET: no viewer
                return web.Response(
                    status=400,
                    text="ampscope serve: /ws is the dashboard's websocket; open / in a "
                    "browser to watch.\n",
                )
            if self.viewers >= self.max_viewers:
                return web.Response(
                    status=503,
                    text=f"ampscope serve: {self.viewers} viewers are watching already, the "
                    "most this server allows (--max-viewers). Close a tab and reload.\n",
                )
            # The tab's own task: a handler cancelled when its client goes would skip the
            # viewer's end and stop counting it while it still runs.
            tab = asyncio.ensure_future(self.serve_tab(self, request))
            self.tabs[tab] = request
            tab.add_done_callback(lambda done: self.tabs.pop(done, None))
            return await asyncio.shield(tab)

        async def _make_app(self) -> web.Application:
            """The base's app, less the listing of /static/ (the page's files are served;
            what else the folder holds is nobody's business)."""
            app = await super()._make_app()
            plain_request_logs()
            for resource in app.router.resources():
                if isinstance(resource, web.StaticResource):
                    resource._show_index = False
            return app

        async def on_startup(self, app: web.Application) -> None:
            pass  # cmd_serve says where it serves, once the port is bound

        async def on_shutdown(self, app: web.Application) -> None:
            for request in self.tabs.values():
                if request.transport is not None:
                    request.transport.abort()
            await asyncio.gather(*self.tabs, return_exceptions=True)

    return ViewerServer


def run_server(server: Any, sockets: list[socket.socket]) -> None:
    """Serve ``server`` (a ViewerServer) on ``sockets`` until SIGINT, SIGTERM or SIGHUP (the
    SSH session that started it dropped, its terminal closed; not under ``nohup``, which asks
    for the opposite): each ends every tab's viewer on the way out. Should serve die without a word (SIGKILL, the OOM killer), its viewers go by
    themselves (cli/serve/viewer.py)."""
    from aiohttp import web

    server.initialize_logging()
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signum != signal.SIGHUP or signal.getsignal(signum) != signal.SIG_IGN:  # nohup
            loop.add_signal_handler(signum, server.request_exit)
    web.run_app(
        server._make_app(),
        sock=sockets,
        handle_signals=False,
        loop=loop,
        print=lambda *args: None,
    )


def cmd_serve(
    args: argparse.Namespace,
    server_class: Callable[..., Any] | None = None,
    serve: Callable[[Any, list[socket.socket]], None] = run_server,
) -> int:
    """``ampscope serve``: a ``server_class`` server (``viewer_server_class()`` unless given),
    served by ``serve`` on the sockets bound here."""
    try:
        from textual_serve.server import Server  # noqa: F401 - is it installed?
    except ImportError:
        return fail("'ampscope serve' needs textual-serve: pip install 'ampscope[serve]'", code=2)
    if not 0 <= args.port <= 65535:
        return fail(f"--port {args.port} is out of range (1 to 65535, or 0 for any free port).")
    low, high = VIEWERS_RANGE
    if not low <= args.max_viewers <= high:
        return fail(f"--max-viewers {args.max_viewers} is out of range ({low} to {high}).")
    root = getattr(args, "runs_dir", None) or records.default_runs_dir()
    if (refused := not_a_runs_folder(root)) is not None:  # it would serve 'no live run' for ever
        return refused
    try:
        sockets = listening_sockets(args.host, args.port)
    except OSError as exc:
        return fail(port_refusal(args.host, args.port, exc), 1)
    port = sockets[0].getsockname()[1]  # --port 0: the one the system gave
    if not is_loopback(args.host):
        print(
            f"ampscope: warning: serving on {visible(args.host, 200)}:{port}. The served app "
            "has no authentication: anyone who can reach this address sees your runs.",
            file=sys.stderr,
        )
    os.environ.update(child_env())  # each tab's viewer runs this ampscope, not the folder's
    command = viewer_command(root, getattr(args, "refresh", None))
    url = f"http://{url_host(args.host)}:{port}"
    print(
        # the folder and address as typed (or from $AMPSCOPE_RUNS_DIR), never obeyed
        f"ampscope: serving a read-only view of the live runs in {visible(root)} on "
        f"{visible(url, 200)} to at most {args.max_viewers} viewers "
        "(Ctrl+C stops)",
        file=sys.stderr,
        flush=True,
    )
    from ampscope.cli.serve.page import offline_templates

    with tempfile.TemporaryDirectory(prefix="ampscope-serve-") as pages:
        server = (server_class or viewer_server_class())(
            command,
            host=args.host,
            port=port,
            public_url=url,  # the page's own links: textual-serve leaves an IPv6 one unbracketed
            title="ampscope",
            templates_path=offline_templates(Path(pages)),  # no font from the internet
            max_viewers=args.max_viewers,
        )
        try:
            serve(server, sockets)
        except KeyboardInterrupt:
            pass
        finally:
            for sock in sockets:
                sock.close()
    return 0


def url_host(host: str) -> str:
    """``host`` as a URL holds it: an IPv6 address in brackets (``http://[::1]:8000``)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def port_refusal(host: str, port: int, exc: OSError) -> str:
    """Why ``host:port`` cannot be served, and what to do (one paragraph)."""
    if exc.errno == errno.EADDRINUSE:
        return (
            f"cannot serve on {host}:{port}: another program already listens on port {port}. "
            f"Stop it, or give another port: ampscope serve --port {port + 1 if port < 65535 else 8000}."
        )
    if exc.errno == errno.EACCES:
        return (
            f"cannot serve on {host}:{port}: ports below 1024 need administrator rights. "
            "Give a port from 1024 to 65535 with --port."
        )
    why = exc.strerror or str(exc)
    return (
        f"cannot serve on {host}:{port}: {why}. Give an address of this machine with --host "
        "(127.0.0.1 serves this machine only, 0.0.0.0 every network) and a free port with --port."
    )
