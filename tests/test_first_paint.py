"""The dashboard stays quick to start: drawing its first screen imports neither torch nor
numpy (seconds on a busy host), nor psutil, plotext, the run manager, the comparisons, the
machine checks or any screen it does not show (each is loaded when first opened, with the
other screens' styles), and its command line builds no command's parser; the garbage
collector, off while the first screen is built, is on again once it is drawn. The time
itself is measured in benchmarks/first_paint.py, beside a minimal Textual app: a benchmark,
not a test, as timings are."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from tests.helpers import ROOT, engine_env


def python_c(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by a fresh Python from the checkout, as a user's shell would start one."""
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=engine_env(), capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip


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
        styles = sorted(Path(p).name for p, _ in app.stylesheet.source if p.endswith('.tcss'))
        await pilot.pause(0.3)
        heavy = {'torch', 'numpy', 'ml_dtypes', 'transformers', 'pynvml', 'psutil'}
        heavy &= set(sys.modules)
        later = {'plotext', 'ampscope.tui.model.run_manager', 'ampscope.tui.model.run_state'}
        later |= {'ampscope.core.comparison', 'ampscope.core.machine'}
        later |= {m for m in sys.modules if m.startswith('ampscope.tui.screens.')}
        shown = {'installed', 'presets', 'preset_form', 'help', 'dialogs'}
        print(sorted(later & set(sys.modules) - {'ampscope.tui.screens.' + s for s in shown}))
        print(sorted(heavy))
        print(styles)

asyncio.run(go())
"""


@pytest.mark.subprocess
def test_the_first_screen_is_drawn_without_torch_or_numpy() -> None:
    done = python_c(FIRST_PAINT)
    assert done.returncode == 0, done.stderr
    *_, not_shown, heavy, style_files = done.stdout.strip().splitlines()
    assert heavy == "[]"
    assert not_shown == "[]"  # loaded before they are asked for: the first screen waits
    assert style_files == "['app.tcss']"  # as it is built: the other screens' (screens.tcss) wait


DASHBOARD_COMMAND_LINE = """
import sys
from ampscope.cli.main import dispatch
import ampscope.cli.main as cli
cli.cmd_dashboard = lambda args: print(args.command, args.top_runs_dir, args.refresh) or 0
dispatch(['--runs-dir', 'elsewhere', '--refresh', '2'])
print(sorted(m for m in sys.modules if m.startswith(('ampscope.cli.', 'ampscope.core.comparison'))))
"""


@pytest.mark.subprocess
def test_the_dashboards_command_line_loads_no_other_commands_code() -> None:
    done = python_c(DASHBOARD_COMMAND_LINE)
    assert done.returncode == 0, done.stderr
    parsed, loaded = done.stdout.strip().splitlines()
    assert parsed == "None elsewhere 2.0"
    assert loaded == "['ampscope.cli.main', 'ampscope.cli.output']"


FIRST_SCREEN_WITHOUT_COLLECTION = """
import asyncio, gc, tempfile
from pathlib import Path
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.screens.presets import PresetsScreen

async def go():
    gc.disable()  # as 'ampscope' with no command leaves it while the first screen is built
    app = AmpscopeApp(runs_dir=Path(tempfile.mkdtemp()))
    async with app.run_test(size=(80, 24)) as pilot:
        while not (isinstance(app.screen, PresetsScreen) and app.screen.presets):
            await pilot.pause(0.05)
        await pilot.pause(0.3)
        print(gc.isenabled(), any(p.endswith('screens.tcss') for p, _ in app.stylesheet.source))

asyncio.run(go())
"""


@pytest.mark.subprocess
def test_once_the_first_screen_is_drawn_collection_is_on_and_the_other_styles_read() -> None:
    done = python_c(FIRST_SCREEN_WITHOUT_COLLECTION)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == ["True", "True"]


@pytest.mark.unit
def test_a_dashboard_that_cannot_start_leaves_garbage_collection_on(monkeypatch, capsys) -> None:
    from ampscope.cli.main import dispatch

    monkeypatch.setenv("TERM", "dumb")  # refused before the screen is taken over
    assert dispatch(["--runs-dir", "elsewhere"]) == 2
    assert "cannot show the dashboard" in capsys.readouterr().err
    assert gc.isenabled()
