"""ampscope serve: the read-only viewer that follows live runs, and the HTTP server around it."""

from __future__ import annotations

import importlib.util
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from ampscope.cli.main import main as cli_main
from ampscope.cli.serve import messages
from ampscope.cli.serve import serve as serve_cli
from ampscope.core import events as ev
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.commands import PresetCommands
from ampscope.tui.model.follow import AttachSource
from ampscope.tui.screens.presets import PresetsScreen
from ampscope.tui.screens.run import RunScreen
from ampscope.tui.screens.waiting import WaitingScreen
from tests.helpers import ROOT, SIZE, engine_env, run, shown, wait_for
from tests.test_detach import make_record

HAS_SERVE = importlib.util.find_spec("textual_serve") is not None


def alive(proc: subprocess.Popen) -> bool:
    try:
        return psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.ui
def test_read_only_app_starts_nothing(tmp_path: Path) -> None:
    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path, read_only=True)
        async with app.run_test(size=SIZE) as pilot:
            presets = await shown(pilot, app, PresetsScreen)
            await pilot.press("enter", "r", "d", "s")
            await pilot.pause()
            await app.run_manager.start_run("fp32")
            assert app.run_manager.engine is None and not presets.detach
            assert not isinstance(app.screen, RunScreen)
            provider = PresetCommands(app.screen)
            await provider.startup()
            assert provider.presets == []  # the palette offers no runs either

    run(go())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.subprocess
def test_viewer_follows_the_newest_live_run_without_controls(tmp_path: Path) -> None:
    first = subprocess.Popen(["sleep", "60"], start_new_session=True)
    second = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:

        async def go() -> None:
            app = AmpscopeApp(runs_dir=tmp_path, read_only=True, follow_live=True)
            async with app.run_test(size=SIZE) as pilot:
                await shown(pilot, app, WaitingScreen)
                await pilot.press("s", "r", "enter", "d")
                assert app.run_manager.engine is None and list(tmp_path.iterdir()) == []
                run_a = make_record(tmp_path, "20260101T000001Z-fp32", first.pid, steps=4)
                assert await wait_for(pilot, lambda: isinstance(app.screen, RunScreen))
                screen = app.screen
                assert isinstance(screen.source, AttachSource) and screen.source.run_dir == run_a
                assert await wait_for(pilot, lambda: screen.state.step_count == 4)
                active = {b.binding.action for b in screen.active_bindings.values()}
                assert not active & {"stop", "restart", "pause"}
                for action in ("stop", "restart"):
                    assert screen.check_action(action, ()) is False
                await pilot.press("s", "r", "space")
                await pilot.pause()
                assert alive(first) and not screen.source.stopping
                # the run ends; the next one starts: the viewer moves on
                with (run_a / "events.jsonl").open("ab") as fh:
                    fh.write(b"\n" + ev.encode(ev.empty_done("ok")))
                assert await wait_for(pilot, lambda: screen.source.ended)
                assert isinstance(app.screen, RunScreen)  # still shows the finished one
                run_b = make_record(tmp_path, "20260101T000002Z-fp32", second.pid, steps=2)
                assert await wait_for(
                    pilot,
                    lambda: (
                        isinstance(app.screen, RunScreen) and app.screen.source.run_dir == run_b
                    ),
                )
                assert len(app.screen_stack) == 3  # default, waiting, the run
                await pilot.press("escape")
                await shown(pilot, app, WaitingScreen)
                await pilot.press("enter")  # back to the current run
                await shown(pilot, app, RunScreen)

        run(go())
        assert alive(first) and alive(second)
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()


class FakeServer:
    made: list[FakeServer] = []

    def __init__(self, command: str, host: str, port: int, title: str, **options) -> None:
        self.command, self.host, self.port = command, host, port
        self.options = options
        self.templates = Path(options["templates_path"])
        self.page = (self.templates / "app_index.html").read_text()  # gone once serving ends
        FakeServer.made.append(self)

    @staticmethod
    def run(server: FakeServer, sockets: list[socket.socket]) -> None:
        server.bound = [sock.getsockname()[1] for sock in sockets]


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.unit
@pytest.mark.skipif(not HAS_SERVE, reason="textual-serve is not installed")
@pytest.mark.skipif(not ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_serve_on_an_ipv6_address_links_its_page_in_brackets(tmp_path: Path, capsys):
    """On --host ::1 the page linked its files and websocket as http://::1:PORT/..., which no
    browser reads as an address: the tab never showed the dashboard."""
    from ampscope.cli.main import command_args

    FakeServer.made.clear()
    args = command_args(["serve", "--host", "::1", "--port", "0", "--runs-dir", str(tmp_path)])
    assert serve_cli.cmd_serve(args, server_class=FakeServer, serve=FakeServer.run) == 0
    (made,) = FakeServer.made
    assert made.options["public_url"] == f"http://[::1]:{made.port}"
    assert f"on http://[::1]:{made.port} to at most" in capsys.readouterr().err


@pytest.mark.unit
@pytest.mark.skipif(not HAS_SERVE, reason="textual-serve is not installed")
def test_serve_warns_off_loopback_and_runs_the_viewer(tmp_path: Path, capsys):
    from ampscope.cli.main import command_args

    def serve(*argv: str) -> int:
        args = command_args(["serve", *argv])
        return serve_cli.cmd_serve(args, server_class=FakeServer, serve=FakeServer.run)

    FakeServer.made.clear()
    assert serve("--port", "0", "--runs-dir", str(tmp_path)) == 0  # any free port
    said = capsys.readouterr().err
    assert "no authentication" not in said
    assert serve("--host", "0.0.0.0", "--port", "0") == 0
    first, second = FakeServer.made
    assert "no authentication" in capsys.readouterr().err
    assert first.host == "127.0.0.1" and first.port != 0 and first.bound == [first.port]
    assert f"on http://127.0.0.1:{first.port} to at most" in said  # the port it got, not 0
    assert second.port != 0 and second.bound == [second.port]
    assert "-m ampscope.cli.serve.viewer" in first.command and str(tmp_path) in first.command
    # the page loads its font from the server itself: offline GPU boxes reach nothing else
    assert "fonts.googleapis" not in first.page and "RobotoMono" in first.page
    assert "https://" not in first.page
    assert serve_cli.is_loopback("localhost") and serve_cli.is_loopback("::1")
    assert not serve_cli.is_loopback("192.168.1.5")


@pytest.mark.unit
@pytest.mark.skipif(not HAS_SERVE, reason="textual-serve is not installed")
def test_serve_on_a_port_already_taken_says_only_that(tmp_path: Path, capsys) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert cli_main(["serve", "--port", str(port), "--runs-dir", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""  # no banner, no "Serving ... on"
    assert err == (
        f"ampscope: cannot serve on 127.0.0.1:{port}: another program already listens on "
        f"port {port}. Stop it, or give another port: ampscope serve --port {port + 1}.\n"
    )


@pytest.mark.unit
@pytest.mark.skipif(not HAS_SERVE, reason="textual-serve is not installed")
def test_serve_refuses_a_runs_folder_that_is_a_file(tmp_path: Path, capsys) -> None:
    """--runs-dir naming a file was served, its viewers told of no live run for ever."""
    from ampscope.cli.main import command_args

    (tmp_path / "file").write_text("")
    args = command_args(["serve", "--port", "0", "--runs-dir", str(tmp_path / "file")])
    assert serve_cli.cmd_serve(args, server_class=FakeServer, serve=FakeServer.run) == 2
    out, err = capsys.readouterr()
    assert out == "" and "serving" not in err
    assert f"the runs folder {tmp_path / 'file'} is a file, not a folder of run records" in err


@pytest.mark.unit
def test_serve_without_textual_serve_exits_2(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "textual_serve.server", None)
    assert cli_main(["serve"]) == 2
    assert "pip install 'ampscope[serve]'" in capsys.readouterr().err


BANNER = re.compile(rb" on http://127\.0\.0\.1:(\d+) ")


def serve_process(runs_dir: Path, log: Path, **popen) -> tuple[subprocess.Popen, int]:
    """``ampscope serve --port 0`` and the port its banner names: a port picked here and handed
    over could be taken first by another test's serve (two took the same one at load 12)."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ampscope", "serve", "--port", "0", "--runs-dir", str(runs_dir)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=engine_env(),
            cwd=ROOT,
            **popen,
        )
    deadline = time.monotonic() + 60
    while (found := BANNER.search(log.read_bytes())) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise AssertionError(f"serve named no port: {log.read_text()!r}")
        time.sleep(0.1)
    return proc, int(found.group(1))


@pytest.mark.subprocess
@pytest.mark.skipif(not HAS_SERVE, reason="textual-serve is not installed")
def test_serve_answers_http_on_loopback(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    proc, port = serve_process(tmp_path, log)
    try:
        body = b""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as resp:
                    assert resp.status == 200
                    body = resp.read()
                    break
            except OSError:
                time.sleep(0.2)
        assert b"<html" in body.lower(), log.read_text()
        page = body.decode()
        assert "fonts.googleapis" not in page
        font = re.search(r'url\("([^"]+RobotoMono-VariableFont_wght\.ttf)"\)', page)
        assert font is not None, page[:500]
        with urllib.request.urlopen(font.group(1), timeout=5) as resp:  # served, not fetched
            assert resp.status == 200 and len(resp.read()) > 10_000
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    said = log.read_text()
    assert said.startswith("ampscope: serving a read-only view")
    assert "Serving '" not in said and "Press Ctrl+C" not in said  # textual-serve's banner


# --------------------------------------------------------------------------- who may watch


@pytest.mark.unit
def test_only_the_viewers_own_page_may_open_its_websocket() -> None:
    refusal = serve_cli.refusal
    assert refusal("http://127.0.0.1:8000", "127.0.0.1:8000", True) is None
    assert refusal("http://localhost:8000", "localhost:8000", True) is None
    assert refusal(None, "127.0.0.1:8000", True) is None  # not a browser
    assert "not this viewer's own page" in refusal("https://evil.example", "127.0.0.1:8000", True)
    assert refusal("http://127.0.0.1:9999", "127.0.0.1:8000", True)  # another local server
    assert refusal("null", "127.0.0.1:8000", True)  # a sandboxed or file:// page
    # DNS rebinding: a page whose name resolves here is same-origin with itself
    assert "loopback" in refusal("http://evil.example:8000", "evil.example:8000", True)
    assert refusal("http://box.lan:8000", "box.lan:8000", False) is None  # served on the LAN


@pytest.mark.unit
@pytest.mark.skipif(not HAS_SERVE, reason="textual-serve is not installed")
def test_the_served_viewer_refuses_other_pages_and_tabs_past_the_limit() -> None:
    import asyncio

    import aiohttp
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    async def a_viewer(server, request: web.Request) -> web.WebSocketResponse:
        """Stands for a tab's viewer (serve_tab starts one): holds the socket open."""
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for _message in ws:
            pass
        return ws

    server = serve_cli.viewer_server_class()(
        "true", host="127.0.0.1", port=0, title="t", max_viewers=2, tab=a_viewer
    )

    async def go() -> None:
        async with TestClient(TestServer(await server._make_app(), host="127.0.0.1")) as client:
            own = f"http://127.0.0.1:{client.port}"
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await client.ws_connect("/ws", origin="https://evil.example")
            assert refused.value.status == 403
            first = await client.ws_connect("/ws", origin=own)
            second = await client.ws_connect("/ws", origin=own)
            with pytest.raises(aiohttp.WSServerHandshakeError) as full:
                await client.ws_connect("/ws", origin=own)
            assert full.value.status == 503 and server.viewers == 2
            await first.close()
            for _ in range(50):  # the server sees the tab go
                if server.viewers < 2:
                    break
                await asyncio.sleep(0.02)
            third = await client.ws_connect("/ws", origin=own)  # a place is free again
            await second.close()
            await third.close()

    asyncio.run(go())


@pytest.mark.unit
@pytest.mark.skipif(not HAS_SERVE, reason="textual-serve is not installed")
def test_serve_refuses_a_viewer_limit_out_of_range(capsys) -> None:
    assert cli_main(["serve", "--max-viewers", "0"]) == 2
    assert "--max-viewers 0 is out of range (1 to 64)" in capsys.readouterr().err


@pytest.mark.subprocess
def test_the_viewer_finds_the_live_run_without_reading_every_record(
    tmp_path: Path, monkeypatch
) -> None:
    from ampscope.core import records
    from ampscope.core.records import folders
    from ampscope.tui.model.live_runs import NEWEST, LiveRunFinder

    for i in range(300):
        folder = tmp_path / f"20250101T{i:06d}Z-fp32"
        folder.mkdir()
        (folder / records.EVENTS_FILE).write_bytes(b"")
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        finder = LiveRunFinder(tmp_path)
        assert finder.newest_live() is None
        reads: list[Path] = []
        real_read = records.read_live
        for module in (records, folders):  # called from outside the module and from inside it
            monkeypatch.setattr(module, "read_live", lambda d: reads.append(d) or real_read(d))
            monkeypatch.setattr(module, "load_run", lambda *a, **k: pytest.fail("read a record"))
        for _ in range(5):  # five polls
            assert finder.newest_live() is None
        assert len(reads) <= 5 * NEWEST
        live = make_record(tmp_path, "20260101T000000Z-fp32", sleeper.pid, steps=1)
        assert finder.newest_live() == live  # a new folder changes the folder's mtime
        older_live = make_record(tmp_path, "20250101T000100Z-old", sleeper.pid, steps=1)
        assert finder.newest_live() == live
        assert older_live.is_dir()
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.unit
def test_a_terminal_size_out_of_range_is_refused_in_words() -> None:
    refused = serve_cli.size_refusal
    assert refused({}) is None and refused({"width": "120", "height": "40"}) is None
    assert refused({"width": "10", "height": "1000"}) is None
    assert refused({"width": "-5", "height": "-5"}) == (
        "width=-5 is not a terminal size: give a whole number from 10 to 1000"
    )
    assert "height=5000 is not a terminal size" in (refused({"height": "5000"}) or "")
    assert "width=abc\\x1b" in (refused({"width": "abc\x1b"}) or "")  # shown escaped


@pytest.mark.unit
@pytest.mark.skipif(not HAS_SERVE, reason="textual-serve is not installed")
def test_the_served_viewer_answers_400_to_a_size_it_cannot_start_on() -> None:
    import asyncio

    import aiohttp
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    started: list[str] = []

    async def a_viewer(server, request: web.Request) -> web.WebSocketResponse:
        """Stands for a tab's viewer (serve_tab), which would start at that size."""
        started.append(request.query_string)
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.close()
        return ws

    server = serve_cli.viewer_server_class()(
        "true", host="127.0.0.1", port=0, title="t", tab=a_viewer
    )

    async def go() -> None:
        async with TestClient(TestServer(await server._make_app(), host="127.0.0.1")) as client:
            own = f"http://127.0.0.1:{client.port}"
            for query in ("width=-5&height=-5", "width=80&height=0", "width=x"):
                with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                    await client.ws_connect(f"/ws?{query}", origin=own)
                assert refused.value.status == 400
            answer = await client.get("/ws?width=-5&height=-5", headers={"Origin": own})
            assert answer.status == 400
            assert (await answer.text()).startswith("ampscope serve: width=-5 is not a terminal")
            ws = await client.ws_connect("/ws?width=100&height=30", origin=own)
            await ws.close()
        assert started == ["width=100&height=30"]  # no viewer started on a bad size

    asyncio.run(go())


# --------------------------------------------------------------------------- what a tab sends


@pytest.mark.unit
def test_every_message_from_a_browser_is_checked_before_the_viewer_gets_it() -> None:
    read = messages.browser_message
    assert read('["stdin", "q"]') == ("stdin", "q")
    assert read('["ping", "1712345678901"]') == ("ping", "1712345678901")
    assert read('["focus"]') == ("focus", None) and read('["blur"]') == ("blur", None)
    assert read('["resize", {"width": 120, "height": 40}]') == ("resize", (120, 40))
    # a size past the range is brought into it: no viewer draws 100000 columns
    assert read('["resize", {"width": 100000, "height": 100000}]') == ("resize", (1000, 1000))
    assert read('["resize", {"width": 4, "height": 2}]') == ("resize", (10, 10))
    bad = {
        '["resize", {"width": "x", "height": 30}]': 'a resize to width="x", which is not a whole number',
        '["resize", {"width": 1e308, "height": 30}]': "width=1e+308",
        '["resize", {"width": 80, "height": true}]': "height=true",
        '["resize", {"width": 80.5, "height": 30}]': "width=80.5",
        '["resize", 5]': "a resize without width and height",
        '["stdin", 5]': "stdin that is not text",
        '["ping", "' + "9" * 100 + '"]': "a ping that is not text",
        '["exec", "rm -rf /"]': "a message of unknown kind exec",
        '{"resize": 1}': "not a [kind, data] list",
        "[]": "not a [kind, data] list",
        "nope": "a message that is not JSON",
        "[" * 100_000: "a message that is not JSON",  # no RecursionError either
    }
    for text, why in bad.items():
        with pytest.raises(messages.BadMessage) as refused:
            read(text)
        assert why in str(refused.value), (text[:40], str(refused.value))


@pytest.mark.unit
@pytest.mark.skipif(not HAS_SERVE, reason="textual-serve is not installed")
def test_a_bad_message_closes_its_socket_and_nothing_after_it_reaches_the_viewer() -> None:
    import asyncio

    from aiohttp import WSMsgType

    from ampscope.cli.serve import viewers

    class Message:
        def __init__(self, data: str) -> None:
            self.type, self.data = WSMsgType.TEXT, data

    class Tab:
        def __init__(self, *texts: str) -> None:
            self.texts = list(texts)
            self.closed_with: int | None = None
            self.sent: list[object] = []

        def __aiter__(self):
            return self

        async def __anext__(self) -> Message:
            if not self.texts or self.closed_with is not None:
                raise StopAsyncIteration
            return Message(self.texts.pop(0))

        async def close(self, code: int = 1000, message: bytes = b"") -> None:
            self.closed_with = code

        async def send_json(self, data: object) -> None:
            self.sent.append(data)

    class Viewer:
        def __init__(self) -> None:
            self.got: list[tuple] = []

        async def set_terminal_size(self, width: int, height: int) -> None:
            self.got.append(("resize", width, height))

        async def send_bytes(self, data: bytes) -> None:
            self.got.append(("stdin", data))

    class Request:
        remote = "192.0.2.7"

    tab, viewer = (
        Tab(
            '["resize", {"width": 100000, "height": 100000}]',
            '["ping", "42"]',
            '["stdin", "j"]',
            '["resize", {"width": 1e308, "height": 30}]',
            '["stdin", "q"]',
        ),
        Viewer(),
    )
    asyncio.run(viewers.pass_messages(tab, Request(), viewer))  # type: ignore[arg-type]
    assert viewer.got == [("resize", 1000, 1000), ("stdin", b"j")]
    assert tab.sent == [["pong", "42"]] and tab.closed_with == 1008


@pytest.mark.unit
def test_the_viewer_itself_acts_on_no_resize_that_is_not_a_terminal_size() -> None:
    """Its own guard, behind serve's: text or 1e308 is ignored, 100000 columns become 1000."""
    from ampscope.cli.serve.viewer_driver import ViewerDriver

    class App:
        def __init__(self) -> None:
            self.sizes: list[tuple[int, int]] = []

        def post_message(self, message) -> None:
            self.sizes.append(tuple(message.size))

    driver = ViewerDriver.__new__(ViewerDriver)  # no terminal, no input thread
    driver._app = app = App()  # type: ignore[assignment]
    for width in ("x", 1e308, True, None):
        driver.on_meta("resize", {"type": "resize", "width": width, "height": 30})
    driver.on_meta("resize", {"type": "resize", "width": 100000, "height": 40})
    assert app.sizes == [(1000, 40)]


@pytest.mark.unit
@pytest.mark.skipif(not HAS_SERVE, reason="textual-serve is not installed")
def test_a_plain_get_of_the_websocket_is_a_400_and_static_lists_no_folder(caplog) -> None:
    """A GET /ws without Upgrade got no HTTP reply and two raw tracebacks in serve's
    terminal; /static/ listed its folders."""
    import asyncio
    import logging

    from aiohttp.test_utils import TestClient, TestServer

    started: list[str] = []

    async def a_viewer(server, request):
        started.append(request.path)
        raise AssertionError("no viewer for a plain GET")

    server = serve_cli.viewer_server_class()(
        "true", host="127.0.0.1", port=0, title="t", tab=a_viewer
    )

    async def go() -> None:
        async with TestClient(TestServer(await server._make_app(), host="127.0.0.1")) as client:
            own = f"http://127.0.0.1:{client.port}"
            answer = await client.get("/ws", headers={"Origin": own})
            assert answer.status == 400
            assert "open / in a browser" in await answer.text()
            for folder in ("/static/", "/static/css/"):
                listing = await client.get(folder)
                assert listing.status in (403, 404)
                assert "xterm.css" not in await listing.text()
            css = await client.get("/static/css/xterm.css")  # the page's own files are served
            assert css.status == 200

    with caplog.at_level(logging.ERROR):
        asyncio.run(go())
    assert started == [] and server.viewers == 0
    assert not [r for r in caplog.records if r.exc_info]  # no traceback logged


@pytest.mark.unit
@pytest.mark.skipif(not HAS_SERVE, reason="textual-serve is not installed")
def test_a_malformed_request_is_one_line_in_serves_log_not_a_traceback(caplog) -> None:
    """Bytes that are no HTTP request (a port scanner, a header past aiohttp's limit, a bad
    Content-Length) each printed a page-long traceback with its locals in serve's terminal."""
    import asyncio
    import logging

    from aiohttp.test_utils import TestServer

    server = serve_cli.viewer_server_class()("true", host="127.0.0.1", port=0, title="t")
    malformed = [
        b"GET / HTTP/1.1\r\nHost: localhost\r\nX: " + b"a" * 200_000 + b"\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: -5\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ]
    answers: list[bytes] = []

    async def go() -> None:
        async with TestServer(await server._make_app(), host="127.0.0.1") as test_server:
            for request in malformed:
                reader, writer = await asyncio.open_connection("127.0.0.1", test_server.port)
                writer.write(request)
                await writer.drain()
                answers.append(await reader.read())
                writer.close()

    with caplog.at_level(logging.INFO):
        asyncio.run(go())
    assert all(answer.startswith(b"HTTP/1.0 400") for answer in answers), answers
    said = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert not [r for r in said if r.exc_info]  # no traceback logged
    lines = [r.getMessage() for r in said]
    assert len(lines) == len(malformed), lines
    assert all(line.startswith("refused a malformed request from 127.0.0.1: ") for line in lines)
    assert all("\n" not in line for line in lines)
    assert "Content-Length: -5" in lines[1]  # what was wrong, after what it was


@pytest.mark.unit
@pytest.mark.skipif(not HAS_SERVE, reason="textual-serve is not installed")
def test_serve_names_its_runs_folder_and_address_with_control_characters_spelled_out(
    tmp_path: Path, capsys
) -> None:
    """The banner printed the runs folder as it was: an escape sequence in a folder's name
    (or $AMPSCOPE_RUNS_DIR) reached the terminal. --host is named spelled out too."""
    from ampscope.cli.main import command_args

    FakeServer.made.clear()
    runs = tmp_path / "runs\x1b]0;pwned\x07"
    args = command_args(["serve", "--port", "0", "--runs-dir", str(runs)])
    assert serve_cli.cmd_serve(args, server_class=FakeServer, serve=FakeServer.run) == 0
    err = capsys.readouterr().err
    assert f"live runs in {tmp_path}/runs\\x1b]0;pwned\\x07 on http://127.0.0.1:" in err
    assert "\x1b" not in err and "\x07" not in err

    host = "nowhere\x1b[2J.invalid"
    assert cli_main(["serve", "--host", host, "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert "cannot serve on nowhere\\x1b[2J.invalid:" in err
    assert "\x1b" not in err


@pytest.mark.unit
@pytest.mark.skipif(not HAS_SERVE, reason="textual-serve is not installed")
def test_a_requests_headers_reach_serves_log_with_control_characters_spelled_out(caplog) -> None:
    """The access log names each request's User-Agent and Referer as the client sent them: a
    C1 escape (CSI, U+009B) or a bidi override in one reached serve's terminal."""
    import asyncio
    import logging

    from aiohttp.test_utils import TestServer

    server = serve_cli.viewer_server_class()("true", host="127.0.0.1", port=0, title="t")
    request = (
        "GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
        "User-Agent: a\u009b2Jb\u202ec\r\n\r\n"
    )

    async def go() -> bytes:
        async with TestServer(await server._make_app(), host="127.0.0.1") as test_server:
            reader, writer = await asyncio.open_connection("127.0.0.1", test_server.port)
            writer.write(request.encode("utf-8"))
            await writer.drain()
            answer = await reader.read()  # to its end: the access line is logged before it
            writer.close()
            return answer

    with caplog.at_level(logging.INFO):
        assert asyncio.run(go()).startswith(b"HTTP/1.1 200")
    (line,) = [r.getMessage() for r in caplog.records if r.name == "aiohttp.access"]
    assert '"a\\x9b2Jb\\u202ec"' in line
    assert "\u009b" not in line and "\u202e" not in line


@pytest.mark.unit
@pytest.mark.skipif(not HAS_SERVE, reason="textual-serve is not installed")
def test_a_tab_that_goes_in_its_handshake_is_one_line_in_serves_log(caplog) -> None:
    """A tab closed (or reloaded) while its websocket was being accepted printed a page-long
    traceback with its locals ('ConnectionResetError: Connection lost') in serve's terminal."""
    import asyncio
    import logging
    from unittest import mock

    from aiohttp.test_utils import make_mocked_request

    from ampscope.cli.serve import viewers

    server = serve_cli.viewer_server_class()("true", host="127.0.0.1", port=0, title="t")
    upgrade = {
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version": "13",
    }
    # the client went: aiohttp has no transport for it any more
    gone = mock.Mock(transport=None, peername=("127.0.0.1", 50000))

    async def go() -> None:
        request = make_mocked_request("GET", "/ws", headers=upgrade, protocol=gone, transport=None)
        await viewers.serve_tab(server, request)

    with caplog.at_level(logging.DEBUG, logger="textual-serve"):
        asyncio.run(go())
    said = [r for r in caplog.records if r.name == "textual-serve"]
    assert not [r for r in said if r.exc_info]  # no traceback
    assert [r.getMessage() for r in said if r.levelno >= logging.INFO] == [
        "ampscope serve: the tab of 127.0.0.1 went before its viewer started (Connection lost)."
    ]
