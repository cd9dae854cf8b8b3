"""ampscope serve's viewer processes: each ends within a bounded time of its tab going, counts
toward --max-viewers until it has, and holds a capped backlog for a tab that reads slowly."""

from __future__ import annotations

import asyncio
import base64
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

import psutil
import pytest

from tests.helpers import ROOT, engine_env, wait_until
from tests.test_serve import free_port

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

    def __init__(self, runs_dir: Path) -> None:
        from aiohttp import web

        from ampscope.cli import serve as serve_cli

        self.port = free_port()
        command = serve_cli.viewer_command(runs_dir)
        self.server = serve_cli.viewer_server_class()(
            command, host="127.0.0.1", port=self.port, title="t", max_viewers=2
        )
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

        async def start() -> web.AppRunner:
            runner = web.AppRunner(await self.server._make_app())
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            return runner

        self.runner = asyncio.run_coroutine_threadsafe(start(), self.loop).result(30)
        self.samples: list[tuple[bool, int]] = []

    def viewer_pids(self) -> list[int]:
        me = psutil.Process()
        return [p.pid for p in me.children() if "ampscope.cli.viewer" in " ".join(p.cmdline())]

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
    from ampscope.cli import serve_viewers

    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setattr(serve_viewers, "QUIT_S", QUIT_S)
    monkeypatch.setattr(serve_viewers, "TERM_S", TERM_S)
    monkeypatch.setattr(serve_viewers, "SEND_STALL_S", STALL_S)
    monkeypatch.setattr(serve_viewers, "OUTBOX_BYTES", 256 << 10)
    boxes: list[serve_viewers.Outbox] = []

    class Recorded(serve_viewers.Outbox):
        def __init__(self) -> None:
            super().__init__(256 << 10)
            boxes.append(self)
            self.most = 0

        def put(self, frame: bytes | str) -> None:
            super().put(frame)
            self.most = max(self.most, self.size - len(frame))  # the backlog before it

    monkeypatch.setattr(serve_viewers, "Outbox", Recorded)
    server = Served(tmp_path)
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


def test_a_tab_that_goes_mid_write_ends_its_viewer_in_a_bounded_time(served, monkeypatch) -> None:
    from ampscope.cli import serve_viewers

    monkeypatch.setattr(serve_viewers, "SEND_STALL_S", 600.0)  # only the tab's going ends it
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
    from ampscope.cli.viewer import REPAINT_SIGNAL

    env = engine_env(TEXTUAL_DRIVER="textual.drivers.web_driver:WebDriver", COLUMNS="90", ROWS="25")
    viewer = subprocess.Popen(
        [sys.executable, "-m", "ampscope.cli.viewer", "--runs-dir", str(tmp_path)],
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
