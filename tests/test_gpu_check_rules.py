"""The GPU check's verdicts on what an H200 would leave behind, forged: CI never sees a GPU,
and the lent machine's 15 minutes must not be spent finding a wrong threshold or a typo in a
rule. A good run passes every check; each fault fails its own check, and only that one."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ampscope.core import events as ev
from tests.helpers import ROOT, hello, step

sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check  # noqa: E402

pytestmark = pytest.mark.unit

H200 = "NVIDIA H200"
NOTE = "H200 SXM dense bf16 datasheet peak"
Spec = dict[str, dict[str, dict[str, Any]]]


def good_spec() -> Spec:
    """stage -> preset -> figures, as the script's stages would record them on an H200."""
    return {
        "probe": {"tf32": {"ms": 20.0, "compile": "max-autotune-no-cudagraphs"}},
        "eager": {
            "fp32": {"ms": 250.0},
            "tf32": {"ms": 120.0},
            "amp-bf16": {"ms": 45.0, "mfu": 0.33, "sys": True},
            "amp-fp16": {"ms": 46.0, "skipped": 2, "zeros": 0.001},
            "amp-fp16-noscale": {"ms": 46.0, "zeros": 0.4, "scaler": "off"},
            "bf16": {"ms": 40.0},
            "fp16": {"ms": 40.0, "status": "failed", "final": None},
        },
        "compile": {
            "compile-default": {"ms": 35.0},
            "compile-reduce-overhead": {"ms": 30.0, "recompiles": 0},
        },
        "max-autotune": {"compile-max-autotune": {"ms": 28.0}},
        "fp8": {
            "compile-default": {"ms": 70.0, "final": 7.0},
            "fp8-tensorwise": {"ms": 55.0, "final": 7.05},
            "fp8-rowwise": {"ms": 60.0, "final": 7.02},
        },
        "ranks": {
            "amp-bf16": {"ms": 10.0, "strategy": "ddp"},
            "amp-bf16 ": {"ms": 10.0, "strategy": "fsdp2"},  # the trailing space keeps keys apart
            "amp-fp16": {"ms": 10.0, "strategy": "fsdp2"},
        },
    }


def write_run(folder: Path, preset: str, f: dict[str, Any]) -> None:
    folder.mkdir(parents=True)
    config = {
        "precision": "fp32",
        "compile": f.get("compile", "off"),
        "grad_scaler": f.get("scaler", "auto"),
        "steps": 40,
        "device": "cuda",
    }
    events: list[ev.Event] = [
        hello(
            preset=preset,
            config=config,
            device="cuda:0",
            device_name=H200,
            peak_tflops=f.get("peak", 989.4),
            peak_tflops_note=f.get("note", NOTE),
            world_size=1,
            backend="nccl" if "strategy" in f else None,
            strategy=f.get("strategy"),
        )
    ]
    events += [
        step(i, f["ms"], loss=10.0 - i * 0.1, grad_zero_frac=f.get("zeros")) for i in range(5)
    ]
    if f.get("sys"):
        sample = {"gpu_util": 97.0, "power_w": f.get("power", 610.0), "gpu_mem_used": 30 << 30}
        events.append(ev.SysEvent(**sample))
    if "recompiles" in f:
        events.append(
            ev.CompileEvent(
                step=3,
                graphs=2,
                frames=2,
                recompiles=f["recompiles"],
                graph_breaks=0,
                break_reasons={},
                cudagraph_skips=0,
                compile_s=20.0,
            )
        )
    for code in f.get("warnings", []):
        events.append(ev.WarningEvent(code=code, message=f"{code} happened"))
    done = ev.empty_done(f.get("status", "ok"), None if f.get("status", "ok") == "ok" else "nan")
    done.steps_done, done.step_ms_median, done.mfu = 40, f["ms"], f.get("mfu")
    done.loss_first, done.loss_final = 10.0, f.get("final", 6.0)
    done.skipped_steps, done.compile_s = f.get("skipped", 0), 20.0 if "compile" in f else None
    events.append(done)
    (folder / "events.jsonl").write_bytes(b"".join(ev.encode(e) for e in events))


def gpu_outdir(tmp: Path, tweak: Callable[[Spec, dict[str, Any]], None] | None = None) -> Path:
    spec = good_spec()
    files: dict[str, Any] = {
        "stages": {name: "0" for name in gpu_check.rules.STAGES},
        "smi": "NVIDIA H200, Disabled, 700.00 W, 580.95, 143771 MiB",
        "dashboard": {"preset": "amp-bf16", "steps": 12, "exit_code": 143, "problems": []},
    }
    if tweak is not None:
        tweak(spec, files)
    (tmp / "preflight").mkdir(parents=True)
    (tmp / "mode.json").write_text(json.dumps({"smoke": False, "stages": ""}))
    (tmp / "stages.tsv").write_text(
        "".join(f"{name}\t{rc}\t30\t120\n" for name, rc in files["stages"].items())
    )
    (tmp / "preflight" / "nvidia-smi.csv").write_text(files["smi"] + "\n")
    modules = {"torch": {"ok": True, "version": "2.11.0+cu130"}}
    imports = {"modules": modules, "ampscope_from": "x", "ampscope_from_checkout": True}
    (tmp / "preflight" / "imports.json").write_text(json.dumps(imports))
    doctor = {"torch": "2.11.0+cu130", "cuda_available": True}
    doctor["compile"] = {"cuda": {"ok": True, "why": "a tiny function compiled and ran"}}
    (tmp / "preflight" / "doctor.json").write_text(json.dumps(doctor))
    (tmp / "dashboard.json").write_text(json.dumps(files["dashboard"]))
    for stage, presets in spec.items():
        for n, (preset, figures) in enumerate(presets.items()):
            write_run(tmp / "runs" / stage / f"{n:02d}-run", preset.strip(), figures)
    return tmp


def failures(outdir: Path) -> set[str]:
    lines = (outdir / "checks.txt").read_text().splitlines()
    return {ln.split(": ", 1)[0].removeprefix("FAIL ") for ln in lines if ln.startswith("FAIL")}


def test_a_good_h200_run_passes_every_check(tmp_path: Path, capsys) -> None:
    out = gpu_outdir(tmp_path)
    assert gpu_check.cmd_check(out) == 0, capsys.readouterr().out
    lines = (out / "checks.txt").read_text().splitlines()
    assert [ln for ln in lines if not ln.startswith("PASS")] == [
        "SKIP fsdp2 amp-fp16 on 2+ GPUs: 1 GPU here: the 1-rank fsdp2 amp-fp16 run covers the path"
    ]
    assert "PASS peak row: NVIDIA H200 (700.0 W, MIG Disabled)" in "\n".join(lines)
    assert "PASS MFU amp-bf16: 33.0% (plausible: 15%-70%)" in "\n".join(lines)
    results = (out / "gpu-results.md").read_text()
    for heading in ("## Checks", "## eager", "## compile", "## fp8", "## ranks"):
        assert heading in results
    assert "| fp8-tensorwise |" in results and "| amp-fp16 fsdp2 x1 |" in results
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["runs"]) == 17
    figures = {(r["stage"], r["preset"]): r for r in summary["runs"]}
    assert figures[("eager", "amp-bf16")]["done"]["mfu"] == 0.33


def edit(stage: str, preset: str, **figures: Any) -> Callable[[Spec, dict[str, Any]], None]:
    def tweak(spec: Spec, files: dict[str, Any]) -> None:
        spec[stage][preset].update(figures)

    return tweak


def stage_rc(name: str, rc: str) -> Callable[[Spec, dict[str, Any]], None]:
    def tweak(spec: Spec, files: dict[str, Any]) -> None:
        files["stages"][name] = rc

    return tweak


def smi(line: str) -> Callable[[Spec, dict[str, Any]], None]:
    def tweak(spec: Spec, files: dict[str, Any]) -> None:
        files["smi"] = line

    return tweak


@pytest.mark.parametrize(
    ("fault", "failed"),
    [
        (edit("eager", "amp-bf16", mfu=0.9), "MFU amp-bf16"),
        (edit("eager", "amp-bf16", mfu=0.05), "MFU amp-bf16"),
        (edit("eager", "tf32", ms=260.0), "step time order"),
        (edit("compile", "compile-default", ms=50.0), "compile-default beats eager"),
        (edit("compile", "compile-reduce-overhead", recompiles=1), "reduce-overhead graphs"),
        (edit("fp8", "fp8-tensorwise", ms=75.0), "fp8-tensorwise faster"),
        (edit("fp8", "fp8-rowwise", final=7.3), "fp8-rowwise final loss"),
        (edit("eager", "amp-bf16", note="H200 NVL dense bf16 datasheet peak"), "peak row"),
        (smi("NVIDIA H100 80GB HBM3, Disabled, 700.00 W, 580.95, 81559 MiB"), "peak row"),
        (edit("eager", "amp-bf16", power=None), "sys telemetry"),
        (edit("eager", "amp-fp16-noscale", zeros=0.0), "noscale grad zeros"),
        (edit("eager", "amp-fp16", skipped=9), "amp-fp16 finite"),
        (edit("compile", "compile-default", warnings=["recompile"]), "warnings"),
        (edit("eager", "bf16", final=11.0), "loss falls"),
        (stage_rc("eager", "124"), "stage eager"),
        (stage_rc("max-autotune", "not-run"), "stage max-autotune"),
    ],
)
def test_each_fault_fails_its_own_check_alone(tmp_path: Path, fault, failed: str) -> None:
    out = gpu_outdir(tmp_path, fault)
    assert gpu_check.cmd_check(out) == 1
    assert failures(out) == {failed}


def test_a_stage_that_timed_out_says_so(tmp_path: Path) -> None:
    out = gpu_outdir(tmp_path, stage_rc("fp8", "124"))
    gpu_check.cmd_check(out)
    text = (out / "checks.txt").read_text()
    assert "FAIL stage fp8: timed out after 120 s" in text


def test_interim_checks_after_a_stage_judge_what_ran_and_wait_for_the_rest(
    tmp_path: Path, capsys
) -> None:
    """A command killed at its 10-minute limit still leaves the checks of the stages it ran."""
    out = gpu_outdir(tmp_path, lambda spec, files: files.update(stages={"preflight": "0"}))
    for stage in ("probe", "eager", "compile", "max-autotune", "fp8", "ranks"):
        for run in (out / "runs" / stage).iterdir():
            for f in run.iterdir():
                f.unlink()
            run.rmdir()
    (out / "dashboard.json").unlink()
    assert gpu_check.cmd_check(out, interim_after="preflight") == 0
    assert capsys.readouterr().out == ""  # the script's log shows only the final checks
    lines = (out / "checks.txt").read_text().splitlines()
    assert lines[0] == "# interim: written after stage preflight; later stages not yet run"
    assert "PASS stage preflight: 30 s of at most 120 s" in lines
    assert "SKIP stage eager: not yet run (interim checks, after stage preflight)" in lines
    assert failures(out) == set()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interim_after"] == "preflight"
    assert "Interim: written after stage preflight" in (out / "gpu-results.md").read_text()
    # the final call, once every stage has run, writes no interim line
    gpu_check.cmd_check(out)
    assert not (out / "checks.txt").read_text().startswith("#")
    assert "Interim" not in (out / "gpu-results.md").read_text()


def test_the_import_report_gives_versions_of_packages_without_a_version_attribute(
    tmp_path: Path, capsys
) -> None:
    """pynvml, rich and textual_plotext have no ``__version__``; the report read "?" for them."""
    import importlib.metadata

    gpu_check.cmd_imports(tmp_path / "imports.json")
    modules = json.loads((tmp_path / "imports.json").read_text())["modules"]
    assert modules["pynvml"]["version"] == importlib.metadata.version("nvidia-ml-py")
    assert modules["textual_plotext"]["version"] == importlib.metadata.version("textual-plotext")
    assert all(m["version"] != "?" for m in modules.values() if m["ok"]), modules
