"""What an install holds: the wheel carries the presets, the engine and the UI; the sdist is
the checkout's tree once; an editable install exposes ampscope alone."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from ampscope.core.presets.toml_text import tomllib  # tomli before Python 3.11
from ampscope.core.processes import launch
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
    assert {f"ampscope/model_examples/{n}" for n in models} <= names and len(models) == 4
    assert {
        "ampscope/engine/lifecycle/run.py",
        "ampscope/engine/lifecycle/loop.py",
        "ampscope/tui/app.py",
        "ampscope/core/events.py",
    } <= names
    # Installed, ampscope claims no generic top-level import name (engine, tui) of its own.
    assert {n.split("/")[0] for n in names if not n.startswith("ampscope-")} == {"ampscope"}
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "ampscope = ampscope.cli.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


@pytest.mark.subprocess
def test_the_sdist_holds_each_source_file_once_under_ampscope(tmp_path: Path) -> None:
    """The top-level engine/ and tui/ are links into ampscope/: the sdist has the tree once,
    under the module names it is imported by, and nothing the checkout lacks."""
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "sdist", "-d", str(tmp_path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    (sdist,) = tmp_path.glob("ampscope-*.tar.gz")
    with tarfile.open(sdist) as tar:
        members = [m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name]
    tops = {name.split("/")[0] for name in members}
    assert {"ampscope", "tests", "docs", "pyproject.toml", "README.md"} <= tops
    assert not tops & {"engine", "tui", "presets", "examples"}, sorted(tops)
    sources = sorted(m for m in members if m.endswith(".py") and m.startswith("ampscope/"))
    assert len(sources) == len(set(sources))
    tracked = subprocess.run(
        ["git", "ls-files", "ampscope"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    if tracked:  # a git checkout (CI's clone is one): the sdist is its package tree
        assert sources == sorted(p for p in tracked if p.endswith(".py"))
    assert "ampscope/engine/lifecycle/loop.py" in sources and "ampscope/tui/app.py" in sources
    assert any(m.startswith("ampscope/presets/") and m.endswith(".toml") for m in members)


@pytest.mark.subprocess
def test_an_install_makes_only_ampscope_importable(tmp_path: Path) -> None:
    """From any folder, ampscope imports and the checkout's other folders do not, in this
    process's children and in the engine's: with the checkout on sys.path, ``engine.lifecycle.exits``
    and ``ampscope.engine.lifecycle.exits`` were two modules."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if launch.found_without_path():  # the engine's, bench's and torchrun's children as well
        env = launch.child_env(env)
    probe = (  # engine.exits imports no torch: the probe takes a tenth of a second, not three
        "import importlib.util as u, ampscope.engine.lifecycle.exits as exits; "
        "print(exits.__file__); "
        "print([n for n in ('engine', 'tui', 'tests', 'benchmarks', 'examples') if u.find_spec(n)])"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    where, leaked = out.stdout.splitlines()
    assert leaked == "[]"
    assert Path(where).name == "exits.py" and Path(where).parent.name == "lifecycle"


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
