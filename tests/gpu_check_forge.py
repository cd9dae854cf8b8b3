"""What ``benchmarks/gpu_check.sh`` would leave in OUTDIR on an H200, forged for the rules'
tests: stage times, nvidia-smi's line, the preflight files, a record a run, and the JSON
``ampscope profile`` and ``ampscope numerics`` print (made by their own functions)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ampscope.core import events as ev
from ampscope.core import profiles
from ampscope.core.numerics import FORMATS
from ampscope.core.numerics.event import FormatShare, ModuleNumerics, TensorNumerics
from ampscope.core.numerics.report import NumericsSummary
from ampscope.core.profiles.rules import OpTime
from tests.helpers import ROOT, hello, step

sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check  # noqa: E402

H200 = "NVIDIA H200"
NOTE = "H200 SXM dense bf16 datasheet peak"
SMI = "NVIDIA H200, Disabled, 700.00 W, 580.95, 143771 MiB"
Spec = dict[str, dict[str, dict[str, Any]]]
Files = dict[str, Any]
Tweak = Callable[[Spec, Files], None]
PROBE = {"compile": "max-autotune-no-cudagraphs", "kind": "cnn"}


def good_spec() -> Spec:
    """stage -> preset -> figures, as the script's stages would record them on an H200."""
    return {
        "probe": {"tf32": {"ms": 20.0, **PROBE}, "fp32": {"ms": 22.0, **PROBE}},
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
        "max-autotune": {"amp-bf16": {"ms": 9.0}, "compile-max-autotune": {"ms": 3.0}},
        "fp8": {
            "compile-default": {"ms": 70.0, "final": 7.0},
            "fp8-tensorwise": {"ms": 55.0, "final": 7.05},
            "fp8-rowwise": {"ms": 60.0, "final": 7.02},
        },
        "ranks": {
            "amp-bf16": {"ms": 10.0, "strategy": "ddp"},
            "amp-fp16": {"ms": 10.0, "strategy": "fsdp2"},
        },
        "profile": {"amp-bf16": {"ms": 45.0}},
        "numerics": {"amp-fp16": {"ms": 12.0}},
    }


def write_run(folder: Path, preset: str, f: dict[str, Any]) -> None:
    folder.mkdir(parents=True)
    config = {
        "precision": "fp32",
        "compile": f.get("compile", "off"),
        "grad_scaler": f.get("scaler", "auto"),
        "steps": 40,
        "device": "cuda",
        "workload": {"kind": f.get("kind", "gpt")},
    }
    world = f.get("world", 1)
    events: list[ev.Event] = [
        hello(
            preset=preset,
            config=config,
            device="cuda:0",
            device_name=f.get("device_name", H200),
            peak_tflops=f.get("peak", 989.4),
            peak_tflops_note=f.get("note", NOTE),
            world_size=world,
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
                cudagraph_skips=f.get("cudagraph_skips", 0),
                compile_s=20.0,
            )
        )
    for code in f.get("warnings", []):
        events.append(ev.WarningEvent(code=code, message=f"{code} happened"))
    done = ev.empty_done(f.get("status", "ok"), None if f.get("status", "ok") == "ok" else "nan")
    done.steps_done, done.step_ms_median, done.mfu = 40, f["ms"], f.get("mfu")
    done.loss_first, done.loss_final = 10.0, f.get("final", 6.0)
    done.skipped_steps, done.compile_s = f.get("skipped", 0), 20.0 if "compile" in f else None
    sums = f.get("checksums", ["ab12"] * world if world > 1 else None)
    if sums is not None:
        done.ranks = [
            ev.RankDone(
                rank=r, step_ms_median=f["ms"], mem_peak=None, skipped_steps=0, param_checksum=c
            )
            for r, c in enumerate(sums)
        ]
    events.append(done)
    (folder / "events.jsonl").write_bytes(b"".join(ev.encode(e) for e in events))


def profile_json(timing: str = "device", matmul: str = "bf16") -> dict[str, Any]:
    """What ``ampscope profile amp-bf16 --steps 3 --json`` prints, from the engine's summary."""
    ops = [
        OpTime("sm90_xmma_gemm_bf16bf16", "matmul", 24_000.0, 72, matmul),
        OpTime("flash_fwd_kernel", "attention", 9_000.0, 36),
        OpTime("vectorized_elementwise_kernel", "elementwise", 6_000.0, 400),
        OpTime("multi_tensor_apply_kernel", "optimizer", 3_000.0, 3),
    ]
    profile = profiles.summarize(ops, 45_000.0, step=4, steps=3, timing=timing, idle_us=3_000.0)
    return profiles.to_json(profile, "amp-bf16")


def numerics_json(names: tuple[str, ...] = ("tok", "blocks.0.qkv", "head")) -> dict[str, Any]:
    """What ``ampscope numerics amp-fp16 --json`` prints, from the engine's summary."""
    figures = {k: FormatShare(overflow=0.0, underflow=0.01) for k in FORMATS}
    tensor = TensorNumerics(numel=1024, amax=3.5, min_nonzero=1e-6, nonfinite=0, formats=figures)
    summary = NumericsSummary()
    for i in range(4):
        modules = [
            ModuleNumerics(name=n, kind="Linear", activation=tensor, gradient=tensor) for n in names
        ]
        summary.add(
            ev.NumericsEvent(step=i, loss_scale=65536.0, modules=modules, modules_total=len(names))
        )
    return summary.to_json("amp-fp16")


def gpu_outdir(tmp: Path, tweak: Tweak | None = None) -> Path:
    spec = good_spec()
    files: Files = {
        "stages": {name: "0" for name in gpu_check.rules.STAGES},
        "smi": SMI,
        "dashboard": {"preset": "amp-bf16", "steps": 12, "exit_code": 143, "problems": []},
        "imports": {
            "modules": {"torch": {"ok": True, "version": "2.11.0+cu130"}},
            "ampscope_from": "x",
            "ampscope_from_checkout": True,
        },
        "doctor": {
            "torch": "2.11.0+cu130",
            "cuda_available": True,
            "compile": {"cuda": {"ok": True, "why": "a tiny function compiled and ran"}},
        },
        "profile": profile_json(),
        "numerics": numerics_json(),
        "machine": machine_json(),
    }
    if tweak is not None:
        tweak(spec, files)
    (tmp / "preflight").mkdir(parents=True)
    (tmp / "mode.json").write_text(json.dumps({"smoke": False, "stages": ""}))
    rows = []
    for name, rc in files["stages"].items():
        left = "12" if rc == "no-time" else "120"
        rows.append(f"{name}\t{rc}\t{0 if rc == 'no-time' else 30}\t{left}\t120\t40\n")
    (tmp / "stages.tsv").write_text("".join(rows))
    (tmp / "preflight" / "nvidia-smi.csv").write_text(files["smi"] + "\n")
    (tmp / "preflight" / "imports.json").write_text(json.dumps(files["imports"]))
    (tmp / "preflight" / "doctor.json").write_text(json.dumps(files["doctor"]))
    (tmp / "dashboard.json").write_text(json.dumps(files["dashboard"]))
    for tool in ("profile", "numerics", "machine"):
        (tmp / tool).mkdir()
        (tmp / tool / f"{tool}.json").write_text(json.dumps(files[tool]))
    for stage, presets in spec.items():
        for n, (preset, figures) in enumerate(presets.items()):
            write_run(tmp / "runs" / stage / f"{n:02d}-run", preset.strip(), figures)
    return tmp


def machine_json(bf16: float = 752.0, copy_gbps: float = 4310.0) -> dict[str, Any]:
    """``doctor --bench --json`` on a healthy H200."""
    rates = {"fp32": 55.0, "tf32": 390.0, "bf16": bf16, "fp16": 748.0, "fp8": 1310.0}
    peaks = {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1979.0}
    return {
        "device": "NVIDIA H200",
        "matmul": {
            f: {"tflops": v, "shape": [8192, 8192, 16384], "datasheet_tflops": peaks[f],
                "ratio": v / peaks[f]}
            for f, v in rates.items()
        },
        "memory": {"gbps": copy_gbps, "datasheet_gbps": 4800.0},
        "verdicts": ["matmul at ... of the datasheet: typical for this GPU"],
    }  # fmt: skip


def failures(outdir: Path) -> set[str]:
    lines = (outdir / "checks.txt").read_text().splitlines()
    return {ln.split(": ", 1)[0].removeprefix("FAIL ") for ln in lines if ln.startswith("FAIL")}


def edit(stage: str, preset: str, **figures: Any) -> Tweak:
    def tweak(spec: Spec, files: Files) -> None:
        spec[stage][preset].update(figures)

    return tweak


def add_run(stage: str, preset: str, **figures: Any) -> Tweak:
    def tweak(spec: Spec, files: Files) -> None:
        spec[stage][preset] = figures

    return tweak


def stage_rc(name: str, rc: str) -> Tweak:
    def tweak(spec: Spec, files: Files) -> None:
        files["stages"][name] = rc

    return tweak


def smi(line: str) -> Tweak:
    def tweak(spec: Spec, files: Files) -> None:
        files["smi"] = line

    return tweak


def file(name: str, *path: str, value: Any) -> Tweak:
    """Set ``files[name][path...]`` to ``value`` (the whole file when no path is given)."""

    def tweak(spec: Spec, files: Files) -> None:
        if not path:
            files[name] = value
            return
        target = files[name]
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return tweak


def both(*tweaks: Tweak) -> Tweak:
    def tweak(spec: Spec, files: Files) -> None:
        for t in tweaks:
            t(spec, files)

    return tweak
