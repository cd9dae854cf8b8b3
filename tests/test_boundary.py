"""The architecture's rules, checked on the real import graph and in fresh interpreters.

The layers (front-ends on top, the engine and the dashboard side by side, the core at the
bottom) are import-linter contracts in pyproject.toml; these tests run them, look for import
circles, and check what a process really loads.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp
import pytest

from tests.helpers import ROOT, engine_env


@pytest.mark.subprocess
def test_every_import_linter_contract_is_kept() -> None:
    lint_imports = Path(sys.executable).parent / "lint-imports"
    out = subprocess.run([lint_imports, "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def import_circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), imports in functions included."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in graph.find_modules_directly_imported_by(module):
            if other not in graph.modules or not other.startswith("ampscope"):
                continue
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == module:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    sys.setrecursionlimit(10_000)
    for module in sorted(m for m in graph.modules if m.startswith("ampscope")):
        if module not in index:
            visit(module)
    return circles


@pytest.mark.unit
def test_no_import_circle_anywhere() -> None:
    graph = grimp.build_graph("ampscope", include_external_packages=True, cache_dir=None)
    assert len([m for m in graph.modules if m.startswith("ampscope.")]) > 40  # the scan saw it all
    assert import_circles(graph) == []


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


@pytest.mark.subprocess
@pytest.mark.parametrize(
    "statement",
    [
        "import ampscope",
        "import ampscope; ampscope.Workload(model=None, batches=[]); ampscope.ModelContext",
        "import ampscope.tui.app",
        "from ampscope.cli.main import build_parser; build_parser().parse_args(['presets'])",
    ],
)
def test_ui_side_and_package_root_load_without_torch(statement: str) -> None:
    assert "torch" not in loaded_after(statement)


@pytest.mark.subprocess
def test_core_loads_neither_torch_nor_textual() -> None:
    package = ROOT / "ampscope"
    core = sorted(
        ".".join(p.relative_to(package).with_suffix("").parts).removesuffix(".__init__")
        for p in (package / "core").rglob("*.py")
    )
    assert "core.presets" in core and "core.records.files" in core  # every package, every module
    loaded = loaded_after("; ".join(f"import ampscope.{m}" for m in core))
    assert not loaded & {"torch", "textual", "rich"}


@pytest.mark.subprocess
def test_the_engine_is_always_ampscopes_own_whatever_the_folder_holds(tmp_path: Path) -> None:
    """Training repos (DETR, DeiT, MAE) have their own engine.py: it must never run instead."""
    for name in ("engine.py", "tui.py", "ampscope.py"):
        (tmp_path / name).write_text("raise SystemExit('the folder\\'s own module ran')\n")
    from ampscope.core.processes.launch import child_env, engine_command

    out = subprocess.run(
        engine_command("mlp-demo", ["steps=2", "device='cpu'"], exit_with_parent=False)
        + ["--no-record"],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert '"type": "done"' in out.stdout or '"type":"done"' in out.stdout


@pytest.mark.subprocess
def test_reading_events_and_records_loads_neither_numpy_nor_ml_dtypes() -> None:
    """Every reader of records (the dashboard, `ampscope runs`, a stop) imports the events; the
    format limits' numpy and ml_dtypes cost 0.7 s there, so they stay out."""
    for readers in ("from ampscope.core import events, records", "import ampscope.tui.app"):
        code = (
            f"import sys; {readers}; "
            "assert not {'numpy', 'ml_dtypes'} & set(sys.modules), sorted(sys.modules)"
        )
        subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=engine_env())
