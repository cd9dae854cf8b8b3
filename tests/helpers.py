"""What the dashboard tests share: driving the app headless and watching processes go."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import psutil

from tui.app import AmpscopeApp
from tui.screens.presets import PresetsScreen

FAST = ["workload.kind='mlp'", "device='cpu'"]  # a small MLP: milliseconds a step on a CPU
SIZE = (120, 40)


def run(coro) -> None:
    asyncio.run(coro)


async def wait_for(pilot, cond: Callable[[], bool], timeout: float = 60.0) -> bool:
    """Let the app run until ``cond()`` holds; False if it still does not after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        await pilot.pause(0.2)
    return cond()


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.1)
    return gone(pid)


def select_preset(app: AmpscopeApp, name: str) -> None:
    screen = app.screen
    assert isinstance(screen, PresetsScreen)
    options = screen.query_one("#preset-list")
    options.highlighted = [p.name for p in screen.presets].index(name)
    options.focus()
