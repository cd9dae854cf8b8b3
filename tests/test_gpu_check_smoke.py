"""The GPU check's smoke mode, in an environment like the lent GPU machine's.

That machine has torch and a few packages preinstalled, no package registry, and gets the rest
as wheels installed with ``pip --target`` onto PYTHONPATH; ampscope runs from the checkout,
never installed. Here: a fresh venv holding links to only the preinstalled packages (taken
from this venv), the rest in a --target folder (from the wheels when this machine has them,
else linked from this venv, as CI has no wheels), and the script run with that venv's python,
so that every child it starts sees the same. It must start, check, and fail when told to.

One run, told to fail, of the stages that meet the device's environment (imports from the
carried folder, the engine, torchrun, the dashboard on a pty): about 40 s on two cores. Its
probe trains eager: the suite's one cold compile is tests/test_engine.py's. Every stage's commands, the GPU's included, are checked by tests/test_gpu_check_plan.py;
the checks on what each stage leaves, by tests/test_gpu_check_rules.py.
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

# It starts ranks through torchrun, so it runs beside the torchrun tests, one after the other.
pytestmark = [pytest.mark.subprocess, pytest.mark.slow, pytest.mark.xdist_group("gpu-check")]

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
STAGES = "preflight,probe,eager,ranks,dashboard"


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


def stray_python_shim(folder: Path) -> Path:
    """A ``python`` first on PATH that leaves a mark and fails: the device has python3 only."""
    folder.mkdir()
    shim = folder / "python"
    shim.write_text(f'#!/bin/sh\necho "python $*" >> {folder / "called"}\nexit 97\n')
    shim.chmod(0o755)
    return folder


def run_check(python: Path, carried: Path, out: Path, shims: Path) -> subprocess.CompletedProcess:
    # XDG_CONFIG_HOME: the test's own (conftest), never the user's kept machine check, which
    # on a machine where 'ampscope doctor --bench' ran busy warned in every run and failed this
    kept = ("HOME", "LANG", "TMPDIR", "XDG_CONFIG_HOME")
    env = {k: v for k, v in os.environ.items() if k in kept}
    env.update(
        PATH=f"{shims}:{os.environ['PATH']}",
        PY=str(python),
        PYTHONPATH=str(carried),
        GPU_CHECK_SMOKE="1",
        GPU_CHECK_INJECT_FAIL="1",
        GPU_CHECK_STAGES=STAGES,
    )
    return subprocess.run(
        ["bash", str(SCRIPT), str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=2100,  # the stages' own limits end it first: 4 x 485 s at most, under load
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

    out, shims = tmp_path / "smoke", stray_python_shim(tmp_path / "shims")
    proc = run_check(python, carried, out, shims)
    log = (out / "log.txt").read_text()
    assert not (shims / "called").exists(), (shims / "called").read_text()  # python3/$PY only
    # Told to fail: the probe raises at its second step, its checks FAIL and the exit code says so.
    assert proc.returncode == 1, log[-4000:]
    assert "== checks" in log and "== done" in log  # the log holds what was printed
    lines = (out / "checks.txt").read_text().splitlines()
    assert lines and all(LINE.match(line) for line in lines), lines
    failed = {ln.split(": ", 1)[0] for ln in lines if ln.startswith("FAIL")}
    assert failed == {"FAIL stage probe", "FAIL tf32 compile probe"}, log[-4000:]
    assert "failure injected at step 2" in "\n".join(lines)
    for name in ("stage preflight", "imports", "doctor", "stage eager", "runs finished"):
        assert any(ln.startswith(f"PASS {name}:") for ln in lines), (name, lines)
    for name in ("loss falls", "amp-fp16 finite", "warnings", "torchrun fsdp2 amp-fp16 x1"):
        assert any(ln.startswith(f"PASS {name}:") for ln in lines), (name, lines)
    assert any(ln.startswith("PASS dashboard:") for ln in lines), lines
    assert "SKIP peak row: a GPU figure; this smoke run is on the CPU" in lines
    assert any(
        ln.startswith(f"SKIP stage fp8: not selected (GPU_CHECK_STAGES={STAGES})") for ln in lines
    )

    imports = json.loads((out / "preflight" / "imports.json").read_text())
    assert imports["ampscope_from_checkout"] and imports["ampscope_from"] == str(ROOT / "ampscope")
    modules = imports["modules"]
    assert modules["textual"]["path"].startswith(str(carried))  # carried, not preinstalled
    assert not modules["torch"]["path"].startswith(str(carried))

    summary = json.loads((out / "summary.json").read_text())
    assert summary["smoke"] is True and len(summary["runs"]) >= 4
    assert [c["status"] for c in summary["checks"]] == [ln.split()[0] for ln in lines]
    results = (out / "gpu-results.md").read_text()
    assert "## Checks" in results and "## eager" in results and "| amp-fp16 |" in results

    # The caches it made in /tmp are gone; a second run into the same folder is refused.
    caches = re.search(r"^budget \d+ s; caches in (\S+) and (\S+)$", log, re.M)
    assert caches and not any(Path(c).exists() for c in caches.groups()), caches
    again = run_check(python, carried, out, shims)
    assert again.returncode == 2 and "is not empty" in again.stderr
    shutil.rmtree(tmp_path / "venv")
