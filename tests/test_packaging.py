"""An installed (non-editable) wheel carries the presets, the engine and the UI."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

from tests.helpers import ROOT


@pytest.mark.subprocess
def test_wheel_ships_presets_engine_and_ui(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("ampscope-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {p.name for p in (ROOT / "presets").glob("*.toml")}
    assert {f"ampscope/presets/{n}" for n in shipped} <= names
    models = {p.name for p in (ROOT / "examples").glob("*.py")}
    assert {f"ampscope/model_examples/{n}" for n in models} <= names and len(models) == 3
    assert {
        "ampscope/engine/run.py",
        "ampscope/engine/loop.py",
        "ampscope/tui/app.py",
        "ampscope/core/events.py",
    } <= names
    # Installed, ampscope claims no generic top-level import name (engine, tui) of its own.
    assert {n.split("/")[0] for n in names if not n.startswith("ampscope-")} == {"ampscope"}
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "ampscope = ampscope.cli.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


@pytest.mark.unit
def test_no_extra_asks_for_a_package_that_would_replace_the_users_torch() -> None:
    """torch itself, and torchvision and torchaudio, whose every release pins one torch: an
    extra that named them would swap a user's CUDA (or CPU) torch for another."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins_torch = {"torch", "torchvision", "torchaudio"}
    named = [
        (extra, re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower())
        for extra, requirements in project["optional-dependencies"].items()
        for requirement in requirements
    ]
    assert len(named) > len(project["optional-dependencies"])  # every requirement, not one each
    assert [(extra, name) for extra, name in named if name in pins_torch] == []
    assert "torch" in {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0] for r in project["dependencies"]}
