"""Every dotted name and every file path a docstring cites is real: a newcomer follows them,
and a move or rename that leaves one behind fails here.

A dotted name is resolved wherever a reader would look for it: from the package root
(``core.records.files``), from any module named by its last folders (``lifecycle.training``,
``training``), or from the names the citing module defines or imports (``RunState.wall_s``).
A name that starts with something else (``torch.autocast``, ``live.step()`` in a usage
example) must be listed below as another library's or an example's, with why: a name that
is none of these is a stale one (``config.Workload`` after config.py became presets/)."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ampscope"
SOURCES = sorted(
    path
    for path in [
        *PACKAGE.rglob("*.py"),
        *(ROOT / "benchmarks").glob("*.py"),
        *(ROOT / "tests").glob("*.py"),
    ]
    if path != Path(__file__).resolve()  # this file's docstrings quote stale names on purpose
)

DOTTED = re.compile(r"(?<![\w./\-~:@])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?![\w/\-])")
FILE_PATH = re.compile(
    r"(?<![\w./\-~:@])((?:[\w.\-]+/)+[\w.\-]*|[\w\-]+(?:\.[\w\-]+)*\.(?:py|md|toml|tcss))(?![\w/\-])"
)
TOP = {"ampscope", "core", "engine", "tui", "cli", "watching", "integrations"}
FILE_SUFFIXES = {"py", "md", "tcss", "toml", "json", "jsonl", "log", "txt", "csv", "svg", "png", "h", "com", "tmp"}  # fmt: skip
NOT_PYTHON = {
    "engine.log": "the engine's log file in a run's folder",
    "ampscope.forward": "the name of a profiler range",
    "run.stop": "a key binding's id (tui/keys.py)",
    "presets.history": "a key binding's id (tui/keys.py)",
    "cvt.rna.tf32.f32": "the PTX instruction that rounds to tf32",
    "e.g": "for example",
    "optimiser.fused": "a mistyped --set key, the example of what is blamed",
}
OTHER_LIBRARIES = {
    "torch", "nn", "F", "cuda", "cudnn", "Module", "Event", "torchao", "transformers", "trainer",
    "wandb", "SummaryWriter", "os", "sys", "time", "asyncio", "subprocess", "statistics",
    "plotext", "rich", "App", "Text", "Content", "msgspec", "textual", "DOMNode",
}  # fmt: skip
EXAMPLE_OBJECTS = {
    "mon": "the Monitor that ampscope.watch returns, in usage examples",
    "model": "a user's model", "optimizer": "a user's optimizer", "scaler": "a user's GradScaler",
    "ctx": "the ModelContext a factory is given", "output": "a model's output",
    "outputs": "a model's outputs", "loss": "a user's loss tensor", "logits": "a model's logits",
    "x": "a tensor", "W": "a weight matrix", "b": "a matrix", "fmt": "a number format",
    "out": "a layer named out", "out_proj": "a layer named out_proj", "attention": "a layer",
    "trunk": "a layer", "pkg": "a user's package", "my_pkg": "a user's package",
    "fonts": "fonts.googleapis.com, a host the page never loads from",
}  # fmt: skip
NOT_IN_REPO = {
    "FILE.py": "a user's model file, as --model spells it",
    "path/to/file.py": "a user's model file",
    "path/to/my_model.py": "a user's model file",
    "models/my_model.py": "a user's model file",
    "train.py": "a user's training script",
    "engine.py": "a file of the user's own repository",
    "torchao_fp8_filter.py": "a file ampscope plan writes",
    "torchtitan_fp8.py": "a file ampscope plan writes",
    "torchao/float8/float8_ops.py": "torchao's source",
    "torch/_inductor/kernel/conv.py": "torch's source",
    "tests/snapshots/NAME.txt": "a snapshot's file, named for its test",
    "tests/snapshots/NAME.svg": "a snapshot's file, named for its test",
    "benchmarks/.venv-watch-overhead": "the environment the benchmark makes for its peers",
}


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _body(path: Path) -> list[ast.stmt]:
    return _tree(path).body


@functools.cache
def _modules() -> dict[str, Path]:
    """Every module by its dotted path below ``ampscope`` (``core.records.files``) or ``benchmarks``."""
    found = {f"benchmarks.{path.stem}": path for path in (ROOT / "benchmarks").glob("*.py")}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


@functools.cache
def _classes() -> dict[str, list[ast.ClassDef]]:
    """Every class of the package and the benchmarks, by name."""
    found: dict[str, list[ast.ClassDef]] = {}
    for path in _modules().values():
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(node)
    return found


@functools.cache
def _events() -> dict[str, list[ast.ClassDef]]:
    """The event classes of core/events.py by their tag (``done`` is DoneEvent)."""
    found = {}
    for node in _body(PACKAGE / "core" / "events.py"):
        for keyword in getattr(node, "keywords", []):
            if keyword.arg == "tag" and isinstance(keyword.value, ast.Constant):
                found[keyword.value.value] = [node]
    return found


@functools.cache
def _preset_keys() -> frozenset[str]:
    """Every dotted key a preset file or ``--set`` takes (``workload.model``)."""
    import msgspec

    from ampscope.core.presets import Preset

    def keys(struct: type, prefix: str) -> set[str]:
        found = set()
        for field in msgspec.structs.fields(struct):
            kind = field.type
            found.add(prefix + field.encode_name)
            if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
                found |= keys(kind, f"{prefix}{field.encode_name}.")
        return found

    return frozenset(keys(Preset, ""))


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


def _members(node: ast.stmt) -> dict[str, ast.stmt]:
    """A class's names: its body's, the ``self.x`` its methods assign, and its bases'."""
    if not isinstance(node, ast.ClassDef):
        return {}
    names = _defined(node.body)
    for inner in ast.walk(node):
        assigned = isinstance(inner, ast.Attribute) and isinstance(inner.ctx, ast.Store)
        if assigned and isinstance(inner.value, ast.Name) and inner.value.id == "self":
            names.setdefault(inner.attr, node)
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id != node.name:
            for parent in _classes().get(base.id, []):
                names = {**_members(parent), **names}
    return names


def _resolves_below(body: list[ast.stmt], names: list[str]) -> bool:
    for i, name in enumerate(names):
        found = _defined(body).get(name) if i == 0 else _members(body[0]).get(name)
        if found is None:
            return False
        if not isinstance(found, ast.ClassDef):
            return True  # an attribute of a function or a value is the reader's to follow
        body = [found]
    return True


def _resolves_in_class(classes: list[ast.ClassDef], names: list[str]) -> bool:
    return any(_resolves_below([c], [c.name, *names]) for c in classes)


def resolves(dotted: str) -> bool:
    """Whether a name read from the package root (``core.records``, ``ampscope.watch``) is real."""
    parts = dotted.split(".")
    if parts[0] == "ampscope":
        parts = parts[1:]
    for cut in range(len(parts), 0, -1):
        path = _module_file(parts[:cut])
        if path is not None:
            return _resolves_below(_body(path), parts[cut:]) if parts[cut:] else True
    if not parts:
        return True
    top_level = _defined(_body(PACKAGE / "__init__.py"))
    return len(parts) == 1 and parts[0] in top_level


def resolves_in(where: Path, dotted: str) -> bool:
    """Whether a name cited in the module at ``where`` is real, read as a reader would."""
    parts = dotted.split(".")
    if dotted in NOT_PYTHON or parts[0] in OTHER_LIBRARIES or parts[0] in EXAMPLE_OBJECTS:
        return True
    if parts[-1] in FILE_SUFFIXES:
        return True  # a file's name (live.json), checked as a path where it is one of ours
    if parts[0] in TOP:
        return resolves(dotted)
    if dotted in _preset_keys():
        return True
    return any(
        (
            _names_a_module(parts),
            _resolves_below(_body(where), parts),  # a name of the citing module (or imported)
            _resolves_in_class(_classes().get(parts[0], []), parts[1:]),
            _resolves_in_class(_events().get(parts[0], []), parts[1:]),  # done.mem_peak
        )
    )


def _names_a_module(parts: list[str]) -> bool:
    """``loop``, ``lifecycle.loop.train``: a module named by its last folders, then names in it."""
    for cut in range(len(parts), 0, -1):
        tail = ".".join(parts[:cut])
        paths = [p for name, p in _modules().items() if f".{name}".endswith(f".{tail}")]
        if paths:
            return not parts[cut:] or any(_resolves_below(_body(p), parts[cut:]) for p in paths)
    return False


@functools.cache
def _repo_paths() -> frozenset[str]:
    paths = set()
    for path in ROOT.rglob("*"):
        relative = path.relative_to(ROOT).as_posix()
        if not relative.startswith((".git", ".venv")) and "__pycache__" not in relative:
            paths.add(relative)
    return frozenset(paths)


@functools.cache
def _folders() -> frozenset[str]:
    """The names a cited path may start with: the repository's folders and the package's."""
    return frozenset(p.rsplit("/", 1)[-1] for p in _repo_paths() if (ROOT / p).is_dir())


def is_path(cited: str) -> bool:
    """A cited file of ours (``lifecycle/training.py``, ``docs/model.md``), not a unit (TFLOP/s)."""
    return cited.endswith((".py", ".md", ".tcss")) or cited.split("/")[0] in _folders()


def path_exists(where: Path, cited: str) -> bool:
    """Whether a cited file or folder is in the repository, named from any folder down."""
    if cited in NOT_IN_REPO:
        return True
    cited = cited.strip("./")
    return (ROOT / cited).exists() or any(
        p == cited or p.endswith(f"/{cited}") for p in _repo_paths()
    )


def _names_in(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The arguments and the names a function (and what it nests) assigns."""
    return {
        n.arg if isinstance(n, ast.arg) else n.id
        for n in ast.walk(function)
        if isinstance(n, ast.arg) or (isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
    }


@functools.cache
def _docstrings(path: Path) -> list[tuple[str, tuple[ast.AST, ...]]]:
    """Each docstring of a module, with the functions it sits in: a docstring may cite their
    arguments (``plan.rounds``). Their names are read only for a docstring that cites one."""
    docs: list[tuple[str, tuple[ast.AST, ...]]] = []

    def visit(node: ast.AST, within: tuple[ast.AST, ...]) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            within = (*within, node)
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            docs.append((ast.get_docstring(node) or "", within))
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt | ast.ExceptHandler):  # where a docstring may sit
                visit(child, within)

    visit(_tree(path), ())
    return docs


def cited_names() -> list[tuple[Path, str]]:
    cited = []
    for path in SOURCES:
        for doc, within in _docstrings(path):
            names = DOTTED.findall(FILE_PATH.sub(" ", doc)) if doc else []
            if not names:
                continue
            local = set().union(*map(_names_in, within))  # type: ignore[arg-type]
            cited += [(path, name) for name in names if name.split(".")[0] not in local]
    return cited


def cited_paths() -> list[tuple[Path, str]]:
    return [
        (path, cited)
        for path in SOURCES
        for doc, _ in _docstrings(path)
        for cited in FILE_PATH.findall(doc)
        if is_path(cited)
    ]


@pytest.mark.unit
def test_every_dotted_name_a_docstring_cites_resolves() -> None:
    cited = cited_names()
    assert len(cited) > 300
    stale = [
        (str(where.relative_to(ROOT)), name)
        for where, name in cited
        if not resolves_in(where, name)
    ]
    assert stale == []


@pytest.mark.unit
def test_every_file_a_docstring_cites_is_in_the_repository() -> None:
    cited = cited_paths()
    assert len(cited) > 100
    missing = [(str(where.relative_to(ROOT)), p) for where, p in cited if not path_exists(where, p)]
    assert missing == []


@pytest.mark.unit
def test_the_resolver_tells_a_stale_name_from_a_real_one() -> None:
    assert resolves("ampscope.core.records")
    assert resolves("ampscope.watch")  # lazily loaded, named in __all__
    assert resolves("tui.model.replay")
    assert not resolves("tui.replay")
    assert not resolves("ampscope.core.records.NoSuchThing")
    here = PACKAGE / "tui" / "model" / "source.py"
    assert resolves_in(here, "lifecycle.training")  # a module by its last folders
    assert resolves_in(here, "torch.autocast")  # another library's
    assert not resolves_in(here, "config.check_combinations")  # config.py is gone
    assert not resolves_in(here, "training.NoSuchRun")
    assert path_exists(here, "lifecycle/training.py")
    assert path_exists(here, "tests/test_docstring_names.py")
    assert not path_exists(here, "REFERENCE.md")
