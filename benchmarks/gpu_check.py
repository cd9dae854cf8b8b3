"""The GPU check's Python side, called by ``benchmarks/gpu_check.sh`` (the stages live there):

    python3 benchmarks/gpu_check.py imports OUT.json
    python3 benchmarks/gpu_check.py dashboard OUT.json --runs-dir D --autostart "PRESET k=v" -- CMD...
    python3 benchmarks/gpu_check.py check OUTDIR

``check`` reads what the stages left in OUTDIR and writes checks.txt (``PASS|FAIL|SKIP name:
detail``), summary.json (every figure) and gpu-results.md; it exits 1 when a check FAILs.
Standard library and ``ampscope.core`` only, so that it runs on a machine with nothing
installed but torch's own packages and the wheels the check carries.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import json
import sys
import time
from pathlib import Path
from typing import Any

import gpu_check_figures as figures
import gpu_check_rules as rules
import gpu_check_tools as tools

from ampscope.core import comparison, events, records

ROOT = Path(__file__).resolve().parent.parent
NEEDED = (
    "torch",
    "numpy",
    "ml_dtypes",
    "psutil",
    "pynvml",
    "rich",
    "msgspec",
    "textual",
    "textual_plotext",
    "plotext",
    "platformdirs",
    "torchao",
    "ampscope",
)
DISTRIBUTIONS = {
    "pynvml": "nvidia-ml-py",
    "textual_plotext": "textual-plotext",
    "ml_dtypes": "ml-dtypes",
}
TABLES = (  # stage, baseline: one comparison table each in gpu-results.md
    ("eager", "fp32"),
    ("compile", "compile-default"),
    ("max-autotune", "amp-bf16"),
    ("fp8", "compile-default"),
    ("ranks", "amp-bf16"),
)


def distribution_version(module: str) -> str:
    """The installed version of the distribution behind ``module`` (pynvml, rich and
    textual_plotext carry no ``__version__``), or "?" where nothing says."""
    try:
        return importlib.metadata.version(DISTRIBUTIONS.get(module, module))
    except importlib.metadata.PackageNotFoundError:
        return "?"


def cmd_imports(out: Path) -> int:
    """Every package the check needs, its version or why it cannot be imported, and where
    ampscope came from: the checkout, never an installed copy."""
    modules: dict[str, dict[str, Any]] = {}
    for name in NEEDED:
        try:
            mod = importlib.import_module(name)
            where = str(Path(mod.__file__).resolve()) if getattr(mod, "__file__", None) else "?"
            version = str(getattr(mod, "__version__", "") or distribution_version(name))
            modules[name] = {"ok": True, "version": version, "path": where}
        except Exception as exc:  # noqa: BLE001 - any failure to import is the finding
            modules[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    ampscope = sys.modules.get("ampscope")
    where = str(Path(ampscope.__file__).resolve().parent) if ampscope and ampscope.__file__ else ""
    report = {
        "python": sys.version.split()[0],
        "modules": modules,
        "ampscope_from": where,
        "ampscope_from_checkout": where == str(ROOT / "ampscope"),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    for name, m in modules.items():
        print(f"  {name:16} {m.get('version') or m.get('error')}")
    print(f"  ampscope from {where}")
    return 0 if all(m["ok"] for m in modules.values()) else 1


def read_evidence(outdir: Path) -> rules.Evidence:
    mode = read_json(outdir / "mode.json") or {}
    e = rules.Evidence(smoke=bool(mode.get("smoke")), selected=str(mode.get("stages") or ""))
    with contextlib.suppress(OSError):
        for line in (outdir / "stages.tsv").read_text().splitlines():
            name, rc, *numbers = (line.split("\t") + ["0"] * 5)[:6]
            seconds, limit, cap, need = (int(n) for n in numbers)
            e.stages[name] = rules.Stage(name, rc, seconds, limit, cap, need)
    runs_root = outdir / "runs"
    for stage in rules.STAGES:
        folder = runs_root / stage
        if folder.is_dir():
            found = sorted(p for p in folder.iterdir() if (p / records.EVENTS_FILE).is_file())
            e.runs[stage] = [records.load_run(p) for p in found]
    with contextlib.suppress(OSError):
        text = (outdir / "preflight" / "nvidia-smi.csv").read_text()
        e.nvidia_smi = [[f.strip() for f in ln.split(",")] for ln in text.splitlines() if ln]
    e.doctor = read_json(outdir / "preflight" / "doctor.json")
    e.imports = read_json(outdir / "preflight" / "imports.json")
    e.dashboard = read_json(outdir / "dashboard.json")
    e.profile = read_json(outdir / "profile" / "profile.json")
    e.numerics = read_json(outdir / "numerics" / "numerics.json")
    e.machine = read_json(outdir / "machine" / "machine.json")
    return e


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def all_checks(e: rules.Evidence) -> list[rules.Check]:
    return [
        *rules.stage_checks(e),
        *rules.preflight_checks(e),
        *rules.probe_checks(e),
        *rules.finished_checks(e),
        *figures.peak_checks(e),
        *figures.mfu_checks(e),
        *figures.speed_checks(e),
        *figures.graph_checks(e),
        *rules.loss_checks(e),
        *rules.fp16_checks(e),
        *figures.fp8_checks(e),
        *figures.telemetry_checks(e),
        *rules.warning_checks(e),
        *figures.rank_checks(e),
        *figures.dashboard_checks(e),
        *tools.profile_checks(e),
        *tools.numerics_checks(e),
        *rules.machine_checks(e),
    ]


def run_figures(stage: str, run: records.RunRecord) -> dict[str, Any]:
    h, d = run.hello, run.done
    last_compile = next(
        (c for c in reversed(run.events) if type(c).__name__ == "CompileEvent"), None
    )
    return {
        "stage": stage,
        "preset": run.preset,
        "record": str(run.path),
        "status": run.status,
        "device_name": h.device_name if h else None,
        "config": h.config if h else None,
        "peak_tflops": h.peak_tflops if h else None,
        "peak_tflops_note": h.peak_tflops_note if h else None,
        "flops_per_step": h.flops_per_step if h else None,
        "world_size": h.world_size if h else None,
        "strategy": h.strategy if h else None,
        "done": events.to_dict(d) if d is not None else None,
        "grad_zero_frac_mean": rules.grad_zeros(run),
        "compile": events.to_dict(last_compile) if last_compile is not None else None,
        "warnings": [w.code for w in run.events if type(w).__name__ == "WarningEvent"],
    }


def first_hello(e: rules.Evidence) -> events.HelloEvent | None:
    """Any run's ``hello``: what a run says of its machine where preflight said nothing."""
    return next((r.hello for runs in e.runs.values() for r in runs if r.hello), None)


def versions(e: rules.Evidence) -> tuple[str, str]:
    """torch's and Python's versions: doctor's, else the import check's (doctor may have run
    out of time), else a run's own hello."""
    doc = e.doctor or {}
    imports = e.imports or {}
    torch_import = ((imports.get("modules") or {}).get("torch") or {}).get("version")
    hello = first_hello(e)
    torch_version = doc.get("torch") or torch_import or (hello.torch_version if hello else None)
    python = doc.get("python") or imports.get("python") or (hello.python_version if hello else None)
    return str(torch_version or "?"), str(python or "?")


def results_markdown(e: rules.Evidence, checks: list[rules.Check]) -> str:
    """The tables for docs/gpu-results.md: the checks, then one comparison a stage."""
    smi = e.nvidia_smi[0] if e.nvidia_smi else []
    hello = first_hello(e)
    if smi:
        gpu = f"{smi[0]} ({', '.join(smi[1:])})"
    else:  # preflight did not run (GPU_CHECK_STAGES): the runs name their device
        gpu = f"{hello.device_name} (from its runs)" if hello else "no GPU named by nvidia-smi"
    if e.smoke:
        gpu = "a smoke run on the CPU (GPU_CHECK_SMOKE=1), not a GPU's figures"
    torch_version, python = versions(e)
    lines = [
        "# GPU check results",
        "",
        f"{time.strftime('%Y-%m-%d', time.gmtime())}, {gpu}; torch {torch_version}, "
        f"Python {python}. Written by `benchmarks/gpu_check.sh` "
        "(docs/gpu-check.md): one repeat of each preset, so speed-ups carry no confidence "
        "interval; the check's thresholds are in docs/gpu-check.md.",
        "",
        *(
            [f"Interim: written after stage {e.interim_after}; the later stages had not run.", ""]
            if e.interim_after
            else []
        ),
        "## Checks",
        "",
        "| result | check | detail |",
        "|---|---|---|",
    ]
    lines += [f"| {c.status} | {c.name} | {c.detail.replace('|', '/')} |" for c in checks]
    for stage, baseline in TABLES:
        runs = e.runs.get(stage, [])
        if not runs:
            continue
        by_preset: dict[str, list[records.RunRecord]] = {}
        for run in runs:
            key = run.preset
            if run.hello is not None and run.hello.strategy:
                key = f"{run.preset} {run.hello.strategy} x{run.hello.world_size}"
            by_preset.setdefault(key, []).append(run)
        base = baseline if baseline in by_preset else next(iter(by_preset))
        rows = [comparison.row_from_runs(p, rs) for p, rs in by_preset.items()]
        rows = comparison.compare(rows, base)
        lines += ["", f"## {stage}", "", comparison.render(rows, base, "markdown")]
    return "\n".join(lines) + "\n"


def cmd_check(outdir: Path, interim_after: str = "") -> int:
    """Judge OUTDIR; with ``interim_after``, quietly, while later stages are still to come.

    The script writes interim checks after every stage, so that a command killed at its time
    limit still leaves checks.txt, summary.json and gpu-results.md for what did run."""
    e = read_evidence(outdir)
    e.interim_after = interim_after
    checks = all_checks(e)
    head = f"# interim: written after stage {interim_after}; later stages not yet run\n"
    text = (head if interim_after else "") + "\n".join(c.line() for c in checks) + "\n"
    (outdir / "checks.txt").write_text(text)
    summary = {
        "smoke": e.smoke,
        "interim_after": e.interim_after or None,
        "stages": {n: vars(s) for n, s in e.stages.items()},
        "checks": [vars(c) for c in checks],
        "nvidia_smi": e.nvidia_smi,
        "doctor": e.doctor,
        "imports": e.imports,
        "dashboard": e.dashboard,
        "profile": e.profile,
        "numerics": e.numerics,
        "machine": e.machine,
        "runs": [run_figures(stage, r) for stage, runs in e.runs.items() for r in runs],
    }
    (outdir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (outdir / "gpu-results.md").write_text(results_markdown(e, checks))
    if interim_after:
        return 0
    print(text, end="")
    failed = [c for c in checks if c.status == "FAIL"]
    passed = sum(c.status == "PASS" for c in checks)
    print(f"{passed} PASS, {len(failed)} FAIL, {len(checks) - passed - len(failed)} SKIP")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("imports").add_argument("out", type=Path)
    check = sub.add_parser("check")
    check.add_argument("outdir", type=Path)
    check.add_argument("--interim-after", default="", metavar="STAGE")
    dash = sub.add_parser("dashboard")
    dash.add_argument("out", type=Path)
    dash.add_argument("--runs-dir", type=Path, required=True)
    dash.add_argument("--autostart", required=True)
    dash.add_argument("--seconds", type=float, default=30.0)
    dash.add_argument("cmd", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "imports":
        return cmd_imports(args.out)
    if args.command == "dashboard":
        from gpu_check_tty import drive_dashboard

        return drive_dashboard(args.out, args.cmd, args.runs_dir, args.autostart, args.seconds)
    return cmd_check(args.outdir, args.interim_after)


if __name__ == "__main__":
    sys.exit(main())
