"""The dashboard stays quick to start: drawing its first screen imports neither torch nor
numpy (seconds on a busy host). The time itself is measured in benchmarks/first_paint.py,
beside a minimal Textual app: a benchmark, not a test, as timings are."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import ROOT, engine_env

FIRST_PAINT = """
import asyncio, sys, tempfile
from pathlib import Path
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.screens.presets import PresetsScreen

async def go():
    app = AmpscopeApp(runs_dir=Path(tempfile.mkdtemp()))
    async with app.run_test(size=(80, 24)) as pilot:
        while not (isinstance(app.screen, PresetsScreen) and app.screen.presets):
            await pilot.pause(0.05)
        await pilot.pause(0.3)
        heavy = {'torch', 'numpy', 'ml_dtypes', 'transformers', 'pynvml'} & set(sys.modules)
        print(sorted(heavy))

asyncio.run(go())
"""


@pytest.mark.subprocess
def test_the_first_screen_is_drawn_without_torch_or_numpy() -> None:
    done = subprocess.run(
        [sys.executable, "-c", FIRST_PAINT],
        cwd=ROOT,
        env=engine_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
