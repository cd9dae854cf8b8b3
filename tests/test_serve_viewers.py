"""ampscope serve's viewer processes: each ends within a bounded time of its tab going, counts
toward --max-viewers until it has, and holds a capped backlog for a tab that reads slowly."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import importlib.util
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.helpers import ROOT, engine_env, wait_until
from tests.test_serve import serve_process

HAS_SERVE = importlib.util.find_spec("textual_serve") is not None
pytestmark = [
    pytest.mark.subprocess,
    pytest.mark.skipif(not HAS_SERVE, reason="textual-serve is not installed"),
]

QUIT_S, TERM_S, STALL_S = 1.0, 1.0, 3.0
BOUND_S = QUIT_S + TERM_S + 3.0  # quit, SIGTERM, SIGKILL, and a margin for a loaded machine


class Served:
    """ampscope serve's server on a free port, run by a thread of this process; its viewers
    are real processes. ``samples`` records (viewer alive, tabs counted) every 20 ms."""

    def __init__(self, runs_dir: Path, **limits: Any) -> None:
        from aiohttp import web

        from ampscope.cli.serve import serve as serve_cli

        listening = socket.socket()  # bound here, on a port no other test can take meanwhile
        listening.bind(("127.0.0.1", 0))
        listening.listen(128)
        self.port = listening.getsockname()[1]
        command = serve_cli.viewer_command(runs_dir)
        self.server = serve_cli.viewer_server_class()(
            command, host="127.0.0.1", port=self.port, title="t", max_viewers=2, **limits
        )
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

        async def start() -> web.AppRunner:
            runner = web.AppRunner(await self.server._make_app())
            await runner.setup()
            await web.SockSite(runner, listening).start()
            return runner

        self.runner = asyncio.run_coroutine_threadsafe(start(), self.loop).result(30)
        self.samples: list[tuple[bool, int]] = []

    def viewer_pids(self) -> list[int]:
        me = psutil.Process()
        return [
            p.pid for p in me.children() if "ampscope.cli.serve.viewer" in " ".join(p.cmdline())
        ]

    def watch(self, pid: int, seconds: float) -> bool:
        """Sample until ``pid`` has gone and no tab is counted; False if not within ``seconds``."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.samples.append((psutil.pid_exists(pid) and not zombie(pid), self.server.viewers))
            if self.samples[-1] == (False, 0):
                return True
            time.sleep(0.02)
        return False

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)


def zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def frame(message: object) -> bytes:
    """A browser's (masked) websocket text frame."""
    data = json.dumps(message).encode()
    mask = os.urandom(4)
    size = len(data)
    head = bytes([0x81]) + (
        bytes([0x80 | size]) if size < 126 else bytes([0x80 | 126]) + struct.pack(">H", size)
    )
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))


def a_tab_that_never_reads(port: int) -> socket.socket:
    """A websocket client with a tiny receive buffer that reads nothing after the handshake."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET /ws?width=100&height=30 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        f"Origin: http://127.0.0.1:{port}\r\n\r\n".encode()
    )
    assert sock.recv(12) == b"HTTP/1.1 101"
    return sock


def flood(sock: socket.socket, until, seconds: float = 60) -> bool:
    """Ask for whole screens of 500 x 300 cells (about 160 kB each), again and again, far
    more than this tab reads, until ``until()`` or the server cuts the tab off (True)."""
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline and not until():
        try:
            sock.sendall(frame(["resize", {"width": 500 - i % 2, "height": 300}]))
        except OSError:
            return True
        i += 1
        time.sleep(0.25)
    return False


@pytest.fixture
def served(tmp_path: Path, monkeypatch):
    from ampscope.cli.serve import viewers

    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    limits = viewers.Limits(
        outbox_bytes=256 << 10, send_stall_s=STALL_S, quit_s=QUIT_S, term_s=TERM_S
    )
    boxes: list[viewers.Outbox] = []

    class Recorded(viewers.Outbox):
        def __init__(self, limit: int, stall_s: float) -> None:
            super().__init__(limit, stall_s)
            boxes.append(self)
            self.most = 0

        def put(self, frame: bytes | str) -> None:
            super().put(frame)
            self.most = max(self.most, self.size - len(frame))  # the backlog before it

    server = Served(tmp_path, limits=limits, outbox=Recorded)
    server.boxes = boxes  # type: ignore[attr-defined]
    try:
        yield server
    finally:
        server.close()


def rss_mb(pid: int) -> float:
    try:
        return psutil.Process(pid).memory_info().rss / 2**20
    except psutil.NoSuchProcess:
        return 0.0


def test_a_tab_that_stops_reading_is_cut_off_and_its_viewer_ends(served) -> None:
    tab = a_tab_that_never_reads(served.port)
    try:
        assert wait_until(lambda: len(served.viewer_pids()) == 1, 60)
        (pid,) = served.viewer_pids()
        assert served.server.viewers == 1
        most_rss = 0.0

        def sampled() -> bool:
            nonlocal most_rss
            most_rss = max(most_rss, rss_mb(pid))
            return False

        # the server cuts the tab off once a frame has waited STALL_S, and ends the viewer
        assert flood(tab, sampled), "the tab was never cut off"
        assert served.watch(pid, BOUND_S), served.samples[-1]
        (box,) = served.boxes
        assert box.drops > 0  # the backlog was dropped, not kept
        assert box.most <= 256 << 10
        assert most_rss < 400, most_rss
        assert (True, 0) not in served.samples  # counted until its process had exited
    finally:
        tab.close()


def test_a_tab_that_goes_mid_write_ends_its_viewer_in_a_bounded_time(served) -> None:
    # only the tab's going ends it
    served.server.limits = dataclasses.replace(served.server.limits, send_stall_s=600.0)
    tab = a_tab_that_never_reads(served.port)
    assert wait_until(lambda: len(served.viewer_pids()) == 1, 60)
    (pid,) = served.viewer_pids()
    boxes = served.boxes
    assert not flood(tab, lambda: boxes[0].drops > 0)  # far behind: the server is mid-write
    tab.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    tab.close()  # a reset, unread frames and all
    gone_at = time.monotonic()
    assert served.watch(pid, BOUND_S), served.samples[-1]
    assert time.monotonic() - gone_at < BOUND_S
    assert (True, 0) not in served.samples
    # a place is free again, and the next tab gets a viewer
    again = a_tab_that_never_reads(served.port)
    try:
        assert wait_until(lambda: len(served.viewer_pids()) == 1, 60)
        assert served.server.viewers == 1
    finally:
        again.close()


def test_the_viewer_repaints_its_whole_screen_when_asked(tmp_path: Path) -> None:
    """What a tab gets after frames were dropped for it: every row, drawn again."""
    from ampscope.cli.serve.viewer import REPAINT_SIGNAL

    env = engine_env(TEXTUAL_DRIVER="textual.drivers.web_driver:WebDriver", COLUMNS="90", ROWS="25")
    viewer = subprocess.Popen(
        [sys.executable, "-m", "ampscope.cli.serve.viewer", "--runs-dir", str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    frames: list[bytes] = []

    def read() -> None:
        out = viewer.stdout
        assert out is not None
        while out.readline() not in (b"__GANGLION__\n", b""):
            pass
        while kind := out.read(1):
            payload = out.read(int.from_bytes(out.read(4), "big"))
            frames.append(payload if kind == b"D" else b"")

    threading.Thread(target=read, daemon=True).start()
    try:
        assert wait_until(lambda: any(b"read-only" in f for f in frames), 60)
        time.sleep(1.0)  # drawn, and quiet
        seen = len(frames)
        viewer.send_signal(REPAINT_SIGNAL)
        assert wait_until(lambda: len(frames) > seen, 10)
        again = b"".join(frames[seen:])
        assert all(f"\x1b[{row};1H".encode() in again for row in range(1, 26))
        assert b"read-only" in again and viewer.poll() is None
    finally:
        viewer.kill()
        viewer.wait()


# --------------------------------------------------------------------------- what a tab sends


def close_code(sock: socket.socket, seconds: float = 60) -> int | None:
    """Read the server's frames (after the rest of the handshake's answer) until its close
    frame; its status code (None: the connection ended without one)."""
    sock.settimeout(seconds)
    data = b""

    def fill(n: int) -> None:
        nonlocal data
        while len(data) < n:
            chunk = sock.recv(1 << 16)
            if not chunk:
                raise EOFError
            data += chunk

    def take(n: int) -> bytes:
        nonlocal data
        fill(n)
        head, data = data[:n], data[n:]
        return head

    try:
        while b"\r\n\r\n" not in data:
            fill(len(data) + 1)
        data = data.split(b"\r\n\r\n", 1)[1]
        while True:
            first, second = take(2)
            size = second & 0x7F
            if size == 126:
                size = struct.unpack(">H", take(2))[0]
            elif size == 127:
                size = struct.unpack(">Q", take(8))[0]
            payload = take(size)
            if first & 0x0F == 0x8:
                return struct.unpack(">H", payload[:2])[0] if len(payload) >= 2 else None
    except (EOFError, OSError):
        return None


def test_a_bad_message_closes_that_tab_alone_and_its_viewer_ends(served, caplog) -> None:
    bad = a_tab_that_never_reads(served.port)
    assert wait_until(lambda: len(served.viewer_pids()) == 1, 60)
    (bad_pid,) = served.viewer_pids()
    good = a_tab_that_never_reads(served.port)
    try:
        assert wait_until(lambda: len(served.viewer_pids()) == 2, 60)
        (good_pid,) = set(served.viewer_pids()) - {bad_pid}
        bad.sendall(frame(["resize", {"width": "x", "height": 30}]))
        assert close_code(bad) == 1008  # policy violation: this tab is closed
        assert wait_until(lambda: zombie(bad_pid) and served.server.viewers == 1, BOUND_S)
        assert not zombie(good_pid)  # the other tab goes on
        said = [r.getMessage() for r in caplog.records]
        assert any(
            "closed the tab of 127.0.0.1: its browser sent a resize to width=" in m for m in said
        ), said
        assert not any(r.exc_info for r in caplog.records)  # one line, no traceback
    finally:
        bad.close()
        good.close()


def test_the_viewer_ends_when_its_input_ends(tmp_path: Path) -> None:
    """serve's end of the pipe closed (serve is gone): the viewer ends, it does not draw on."""
    env = engine_env(TEXTUAL_DRIVER="textual.drivers.web_driver:WebDriver", COLUMNS="90", ROWS="25")
    env["AMPSCOPE_VIEWER_PARENT"] = str(os.getpid())
    viewer = subprocess.Popen(
        [sys.executable, "-m", "ampscope.cli.serve.viewer", "--runs-dir", str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    started = threading.Event()

    def read() -> None:
        out = viewer.stdout
        assert out is not None
        while line := out.readline():
            if line == b"__GANGLION__\n":
                started.set()
                break
        while out.read(1 << 16):
            pass

    threading.Thread(target=read, daemon=True).start()
    try:
        assert started.wait(60)
        assert viewer.stdin is not None
        viewer.stdin.close()
        viewer.wait(timeout=BOUND_S + 10)  # raises TimeoutExpired while it draws on
        assert viewer.returncode is not None
    finally:
        viewer.kill()
        viewer.wait()


@pytest.mark.parametrize("how", ["SIGHUP", "SIGKILL"])
def test_serves_viewers_go_when_serve_goes_however_it_goes(tmp_path: Path, how: str) -> None:
    """The SSH session that started serve drops (SIGHUP), or the OOM killer takes it (SIGKILL),
    with a tab open: its viewer goes too, not reparented to init for ever."""
    import signal

    serve, port = serve_process(tmp_path, tmp_path / "serve.log")
    viewers: list[psutil.Process] = []

    def viewer_started() -> bool:
        with contextlib.suppress(psutil.Error):
            viewers[:] = [
                p
                for p in psutil.Process(serve.pid).children()
                if "ampscope.cli.serve.viewer" in " ".join(p.cmdline())
            ]
        return bool(viewers)

    tab = None
    try:
        tab = wait_for_tab(port, serve)
        assert wait_until(viewer_started, 60), (tmp_path / "serve.log").read_text()
        (viewer,) = viewers
        assert seen(tab, b"read-only", 60)  # drawn: a viewer killed mid-start dies anyway
        serve.send_signal(getattr(signal, how))
        serve.wait(timeout=30)
        assert wait_until(lambda: not viewer.is_running() or zombie(viewer.pid), BOUND_S + 10)
    finally:
        if tab is not None:
            tab.close()
        for proc in viewers:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        serve.kill()
        serve.wait()


def seen(sock: socket.socket, text: bytes, seconds: float) -> bool:
    """Read what the server sends ``sock`` until ``text`` appears in it."""
    sock.settimeout(seconds)
    data = b""
    with contextlib.suppress(OSError):
        while text not in data:
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            data = data[-len(text) :] + chunk
    return text in data


def wait_for_tab(port: int, serve: subprocess.Popen) -> socket.socket:
    """A tab on the serve process at ``port``, once it listens."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return a_tab_that_never_reads(port)
        except OSError:
            if serve.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_serve_under_nohup_goes_on_serving_after_a_hang_up(tmp_path: Path) -> None:
    """``nohup ampscope serve`` asks to outlive the terminal: its ignored SIGHUP stays ignored."""
    import signal
    import urllib.request

    serve, port = serve_process(
        tmp_path,
        tmp_path / "serve.log",
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),  # as nohup does
    )

    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as resp:
                return resp.status == 200
        except OSError:
            return False

    try:
        assert wait_until(answers, 60)
        serve.send_signal(signal.SIGHUP)
        assert answers() and serve.poll() is None
    finally:
        serve.terminate()
        serve.wait(30)
