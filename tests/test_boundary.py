"""The architecture's one rule: the engine never imports textual, the UI never imports torch.

The UI process must start fast and never hold a CUDA context; the shared modules under
ampscope/ (presets, events, records) are what both sides use, so they import neither.
"""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from tests.conftest import ROOT, engine_env

SHARED = [
    "ampscope.cli",
    "ampscope.config",
    "ampscope.events",
    "ampscope.records",
    "ampscope.console",
    "ampscope.peaks",
    "ampscope.units",
]


def imported_modules(package: str) -> set[str]:
    """Every module named by an import statement anywhere under a package, lazy ones too."""
    names: set[str] = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return names


def test_engine_never_imports_textual_or_the_ui() -> None:
    assert not imported_modules("engine") & {"textual", "textual_plotext", "tui"}


def test_ui_never_imports_torch_or_the_engine() -> None:
    assert (ROOT / "tui").is_dir()
    assert not imported_modules("tui") & {"torch", "engine", "triton"}


def loaded_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(m.split('.')[0] for m in sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=engine_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(out.split())


@pytest.mark.parametrize(
    "statement",
    [
        "import tui.app",
        "from ampscope.cli import build_parser; build_parser().parse_args(['presets'])",
    ],
)
def test_ui_side_loads_without_torch(statement: str) -> None:
    loaded = loaded_after(statement)
    assert "torch" not in loaded


def test_shared_modules_import_neither_torch_nor_textual() -> None:
    loaded = loaded_after("; ".join(f"import {m}" for m in SHARED))
    assert not loaded & {"torch", "textual", "tui", "engine"}
