"""serve's page answers a terminal size its viewer cannot start on with HTTP 400 and the
reason, as the README says and as the websocket does; a good size gets the page."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from ampscope.cli.serve import serve as serve_cli

pytestmark = pytest.mark.unit

HAS_SERVE = importlib.util.find_spec("textual_serve") is not None


@pytest.mark.skipif(not HAS_SERVE, reason="textual-serve is not installed")
def test_the_page_answers_400_to_a_size_it_cannot_show() -> None:
    from aiohttp.test_utils import TestClient, TestServer

    server = serve_cli.viewer_server_class()("true", host="127.0.0.1", port=0, title="t")

    async def go() -> None:
        async with TestClient(TestServer(await server._make_app(), host="127.0.0.1")) as client:
            answer = await client.get("/?width=5&height=5")
            assert answer.status == 400
            said = await answer.text()
            assert said == (
                "ampscope serve: width=5 is not a terminal size: give a whole number from 10 "
                "to 1000.\n"
            )
            answer = await client.get("/?width=100&height=x")
            assert answer.status == 400 and "height=x" in await answer.text()
            for good in ("/", "/?width=100&height=30", "/?fontsize=14"):
                answer = await client.get(good)
                assert answer.status == 200, good
                assert "<html" in (await answer.text()).lower()

    asyncio.run(go())
