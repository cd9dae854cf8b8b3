"""Every dotted name a docstring cites is a real module, class, function or value: a newcomer
follows them, and a move or rename that leaves one behind fails here."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ampscope"

CITED = re.compile(
    r"\b((?:ampscope|core|engine|tui|cli|watching|integrations)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)"
)
NOT_PYTHON = {
    "engine.log": "the engine's log file in a run's folder",
    "ampscope.forward": "the name of a profiler range",
}


@functools.cache
def _body(path: Path) -> list[ast.stmt]:
    return ast.parse(path.read_text()).body


def _module_file(parts: list[str]) -> Path | None:
    base = PACKAGE.joinpath(*parts)
    if (base / "__init__.py").exists():
        return base / "__init__.py"
    if base.with_suffix(".py").exists():
        return base.with_suffix(".py")
    return None


def _defined(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    names: dict[str, ast.stmt] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            names.update({t.id: node for t in node.targets if isinstance(t, ast.Name)})
            for target in node.targets:  # __all__ names what a package loads lazily
                if isinstance(target, ast.Name) and target.id == "__all__":
                    value = ast.literal_eval(node.value)
                    names.update(dict.fromkeys(value, node))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update({(a.asname or a.name).split(".")[0]: node for a in node.names})
        elif isinstance(node, ast.If | ast.Try):
            names.update(_defined(node.body))
    return names


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    if parts[0] == "ampscope":
        parts = parts[1:]
    for cut in range(len(parts), 0, -1):
        path = _module_file(parts[:cut])
        if path is None:
            continue
        body = _body(path)
        for name in parts[cut:]:
            found = _defined(body).get(name)
            if found is None:
                return False
            body = found.body if isinstance(found, ast.ClassDef) else []
        return True
    if not parts:
        return True
    top_level = _defined(_body(PACKAGE / "__init__.py"))
    return len(parts) == 1 and parts[0] in top_level


def cited_names() -> list[tuple[str, str]]:
    cited = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                doc = ast.get_docstring(node)
                for name in CITED.findall(doc or ""):
                    if name not in NOT_PYTHON and not name.endswith(".py"):
                        cited.append((str(path.relative_to(ROOT)), name))
    return cited


@pytest.mark.unit
def test_every_dotted_name_a_docstring_cites_resolves() -> None:
    cited = cited_names()
    assert len(cited) > 30
    assert [(where, name) for where, name in cited if not resolves(name)] == []


@pytest.mark.unit
def test_the_resolver_tells_a_stale_name_from_a_real_one() -> None:
    assert resolves("ampscope.core.records")
    assert resolves("ampscope.watch")  # lazily loaded, named in __all__
    assert resolves("tui.model.replay")
    assert not resolves("tui.replay")
    assert not resolves("ampscope.core.records.NoSuchThing")
