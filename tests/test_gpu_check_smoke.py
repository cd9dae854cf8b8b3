"""The GPU check's smoke mode, in an environment like the lent GPU machine's.

That machine has torch and a few packages preinstalled, no package registry, and gets the rest
as wheels installed with ``pip --target`` onto PYTHONPATH; ampscope runs from the checkout,
never installed. Here: a fresh venv holding links to only the preinstalled packages (taken
from this venv), the rest in a --target folder (from the wheels when this machine has them,
else linked from this venv, as CI has no wheels), and the script run with that venv's python,
so that every child it starts sees the same. It must start, check, and fail when told to.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.slow

PREINSTALLED = ("torch", "numpy", "ml_dtypes", "psutil", "nvidia-ml-py", "rich", "pytest")
CARRIED = (  # /work/shared/device-wheels: what the check installs with pip --target
    "msgspec",
    "torchao",
    "textual",
    "mdit-py-plugins",
    "linkify-it-py",
    "uc-micro-py",
    "platformdirs",
    "plotext",
    "textual-plotext",
)
WHEELS = Path(os.environ.get("AMPSCOPE_DEVICE_WHEELS", "/work/shared/device-wheels"))
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
LINE = re.compile(r"^(PASS|FAIL|SKIP) [^:]+: .+$")


def requirements(name: str) -> list[str]:
    """The distributions ``name`` needs (extras left out), as installed here."""
    out = []
    for req in metadata.distribution(name).requires or []:
        if "extra ==" in req:
            continue
        out.append(re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0])
    return out


def with_requirements(names: tuple[str, ...]) -> set[str]:
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        try:
            todo += requirements(name)
        except metadata.PackageNotFoundError:
            continue  # not for this platform (CUDA libraries on a CPU build)
        seen.add(key)
    return seen


def link_distribution(name: str, into: Path) -> None:
    """Every top-level file and folder of an installed distribution, linked into ``into``."""
    dist = metadata.distribution(name)
    tops = {Path(str(f)).parts[0] for f in dist.files or []}
    for top in tops - {"..", "__pycache__"}:
        source = Path(str(dist.locate_file(top)))
        if source.exists() and not (into / top).exists():
            (into / top).symlink_to(source)


def device_like(tmp: Path) -> tuple[Path, Path]:
    """A python with only the device's preinstalled packages, and the carried ones' folder."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            text=True,
        ).strip()
    )
    carried = {n.lower() for n in CARRIED}
    for name in sorted(with_requirements(PREINSTALLED) - carried):
        link_distribution(name, site)
    target = tmp / "carried"
    target.mkdir()
    wheels = sorted(WHEELS.glob("*.whl")) if WHEELS.is_dir() else []
    # msgspec's wheel there is cp312 (the device's Python 3.12), which this Python cannot load:
    # it comes from this venv, like every carried package when no wheels are at hand (CI).
    wheels = [w for w in wheels if not w.name.startswith("msgspec-")]
    if wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
            + ["--no-compile", "--target", str(target), *map(str, wheels)],
            check=True,
        )
    installed = {w.name.split("-")[0].lower().replace("_", "-") for w in wheels}
    for name in CARRIED:
        if name not in installed:
            with contextlib.suppress(metadata.PackageNotFoundError):  # textual's optional parts
                link_distribution(name, target)
    return python, target


def run_check(python: Path, carried: Path, out: Path, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    env.update(PY=str(python), PYTHONPATH=str(carried), GPU_CHECK_SMOKE="1", **extra)
    return subprocess.run(
        ["bash", str(SCRIPT), str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )


def test_the_smoke_check_runs_where_only_the_devices_packages_are(tmp_path: Path) -> None:
    python, carried = device_like(tmp_path)
    found = subprocess.run(
        [str(python), "-c", "import ampscope"],
        capture_output=True,
        env={"PATH": os.environ["PATH"]},
        cwd=tmp_path,
    )
    assert found.returncode != 0, "ampscope is importable without the checkout"

    out = tmp_path / "smoke"
    proc = run_check(python, carried, out)
    log = (out / "log.txt").read_text()
    assert proc.returncode == 0, log[-4000:]
    assert "== checks" in log and "== done" in log  # the log holds what was printed
    lines = (out / "checks.txt").read_text().splitlines()
    assert lines and all(LINE.match(line) for line in lines), lines
    kinds = {line.split()[0] for line in lines}
    assert kinds == {"PASS", "SKIP"}, [ln for ln in lines if ln.startswith("FAIL")]
    for name in ("stage eager", "loss falls", "torchrun fsdp2 amp-fp16 x1", "dashboard"):
        assert any(ln.startswith(f"PASS {name}:") for ln in lines), (name, lines)
    assert any(ln.startswith("SKIP peak row:") for ln in lines)

    imports = json.loads((out / "preflight" / "imports.json").read_text())
    assert imports["ampscope_from_checkout"] and imports["ampscope_from"] == str(ROOT / "ampscope")
    modules = imports["modules"]
    assert modules["textual"]["path"].startswith(str(carried))  # carried, not preinstalled
    assert not modules["torch"]["path"].startswith(str(carried))

    summary = json.loads((out / "summary.json").read_text())
    assert summary["smoke"] is True and len(summary["runs"]) >= 10
    assert [c["status"] for c in summary["checks"]] == [ln.split()[0] for ln in lines]
    results = (out / "gpu-results.md").read_text()
    assert "## Checks" in results and "## eager" in results and "| amp-bf16 |" in results

    # Told to fail: the probe is made to raise, a check FAILs and the exit code says so.
    failing = tmp_path / "failing"
    proc = run_check(python, carried, failing, GPU_CHECK_INJECT_FAIL="1", GPU_CHECK_STAGES="probe")
    assert proc.returncode == 1, (failing / "log.txt").read_text()[-3000:]
    lines = (failing / "checks.txt").read_text().splitlines()
    assert any(ln.startswith("FAIL tf32 compile probe:") for ln in lines), lines
    assert any(ln.startswith("SKIP stage eager: not selected") for ln in lines)
    shutil.rmtree(tmp_path / "venv")
