"""The GPU check's verdicts: what the run records of ``benchmarks/gpu_check.sh`` must show.

Each rule reads the evidence (stage exit codes, run records, preflight files) and returns
``Check`` lines: PASS, FAIL, or SKIP with the reason (a GPU-only figure in a smoke run on the
CPU, a stage that was not selected). docs/gpu-check.md explains each one and its threshold.
Standard library and ``ampscope.core`` only: it runs where nothing else is installed.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from typing import Any

from ampscope.core import events as ev
from ampscope.core import records

STAGES = (
    "preflight",
    "probe",
    "eager",
    "compile",
    "ranks",
    "dashboard",
    "profile",
    "numerics",
    "machine",
    "fp8",
    "max-autotune",
)
TIMED_OUT = ("124", "137")  # timeout's own code, and SIGKILL after its grace period
NO_TIME = "no-time"  # the stage was not started: less than it needs was left of the budget
MFU_RANGE = (0.15, 0.7)  # amp-bf16, eager, the large GPT (12 x 768, 16 x 1024 tokens)
MAX_SKIPPED = 5  # amp-fp16: GradScaler's first steps may overflow at 2**16, a few at most
FP8_LOSS_TOLERANCE = 0.02  # final loss of an fp8 recipe against compiled amp-bf16
MEANT_TO_FAIL = {"fp16": "pure fp16 runs out of range", "amp-fp16-noscale": "gradients underflow"}
# Peaks from the datasheets (REFERENCE.md), independent of the engine's table: bf16 dense.
# What an H200 delivered here before (REFERENCE.md: 8192-cubed bf16 at about 790 TFLOP/s, a
# device-to-device copy at about 4.3 TB/s): doctor --bench must find at least this much.
MACHINE_H200 = {"bf16_tflops": 700.0, "copy_gbps": 3500.0}
BF16_PEAKS = {"H200 SXM": 989.4, "H100 SXM": 989.4, "H200 NVL": 836.0, "H100 NVL": 836.0}
# Warnings a run may give: everywhere, and on the CPU of a smoke run.
EXPECTED_WARNINGS = {"nvml-process-not-listed"}  # a container's PID namespace (said, handled)
CPU_WARNINGS = {
    "tf32-on-cpu",
    "slow-fp16-cpu",
    "slow-bf16-cpu",
    "cudagraphs-cpu",
    "nvml-no-driver",
    "nvml-missing",
    "nvml-init-failed",
}
SCALER_WARNINGS = {"skipped-step"}  # presets with a GradScaler skip a step now and then
# A MIG slice's NVML handle answers NOT_SUPPORTED for some figures: said, and left blank.
MIG_WARNINGS = {"nvml-field-unsupported"}


@dataclass(frozen=True)
class Check:
    status: str  # PASS | FAIL | SKIP
    name: str
    detail: str

    def line(self) -> str:
        return f"{self.status} {self.name}: {self.detail}"


@dataclass(frozen=True)
class Stage:
    name: str
    rc: str  # the exit status, or NO_TIME when the budget had too little left to start it
    seconds: int
    limit: int  # the seconds it was given (its cap, or less: what the budget had left)
    cap: int = 0  # its own time limit
    need: int = 0  # the seconds it must have left to be started

    def budget_note(self) -> str:
        """Why a stage was not started, or that the budget cut its time limit."""
        if self.rc == NO_TIME:
            return (
                f"not started: {self.limit} s of GPU_CHECK_BUDGET_S were left and it needs "
                f"{self.need} s (GPU_CHECK_STAGES={self.name} runs it alone)"
            )
        if self.cap > self.limit:
            return f", cut from its {self.cap} s by GPU_CHECK_BUDGET_S"
        return ""


@dataclass
class Evidence:
    """What one run of the script left in OUTDIR (``gpu_check.read_evidence``)."""

    smoke: bool = False
    selected: str = ""  # GPU_CHECK_STAGES, empty for all
    interim_after: str = ""  # set while stages are still to come: the last one that ended
    stages: dict[str, Stage] = field(default_factory=dict)
    runs: dict[str, list[records.RunRecord]] = field(default_factory=dict)
    nvidia_smi: list[list[str]] = field(default_factory=list)  # a row of fields per GPU
    doctor: dict[str, Any] | None = None
    imports: dict[str, Any] | None = None
    dashboard: dict[str, Any] | None = None
    profile: dict[str, Any] | None = None  # what ``ampscope profile --json`` printed
    numerics: dict[str, Any] | None = None  # what ``ampscope numerics --json`` printed
    machine: dict[str, Any] | None = None  # what ``ampscope doctor --bench --json`` printed

    def run(self, stage: str, preset: str) -> records.RunRecord | None:
        found = [r for r in self.runs.get(stage, []) if r.preset == preset]
        return found[-1] if found else None

    def ran(self, stage: str) -> bool:
        """Whether ``stage`` was started (a stage the budget had no time for was not)."""
        st = self.stages.get(stage)
        return st is not None and st.rc != NO_TIME


def PASS(name: str, detail: str) -> Check:  # noqa: N802 - reads as the line it writes
    return Check("PASS", name, detail)


def FAIL(name: str, detail: str) -> Check:  # noqa: N802
    return Check("FAIL", name, detail)


def SKIP(name: str, detail: str) -> Check:  # noqa: N802
    return Check("SKIP", name, detail)


GPU_ONLY = "a GPU figure; this smoke run is on the CPU"


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def run_config(run: records.RunRecord) -> dict[str, Any]:
    """The run's resolved preset from its hello, else the config.json written before it."""
    if run.hello is not None:
        return run.hello.config or {}
    try:
        data = json.loads((run.path / records.CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def median_ms(run: records.RunRecord | None) -> float | None:
    if run is None or run.done is None or run.done.status != "ok":
        return None
    return run.done.step_ms_median


def not_there(e: Evidence, stage: str, what: str) -> Check:
    """Why a figure of ``stage`` is missing: the stage was not selected, the budget left it no
    time, a smoke run leaves that preset out, or (a FAIL) the stage left no record of it."""
    st = e.stages.get(stage)
    if st is not None and st.rc == NO_TIME:
        return SKIP(what, f"stage {stage} {st.budget_note()}")
    if st is None and e.interim_after:
        return SKIP(what, f"stage {stage} not yet run (interim checks)")
    if st is None:
        return SKIP(what, f"stage {stage} not run (GPU_CHECK_STAGES={e.selected or 'all'})")
    if e.smoke and st.rc == "0":
        return SKIP(what, f"not in the smoke run's stage {stage} (the GPU run has it)")
    return FAIL(what, f"no finished run in stage {stage} to read it from")


def stage_checks(e: Evidence) -> list[Check]:
    out = []
    for name in STAGES:
        what = f"stage {name}"
        st = e.stages.get(name)
        if name == "max-autotune" and e.smoke:
            out.append(SKIP(what, "GPU only: on a CPU max-autotune tunes C++ GEMMs for minutes"))
        elif st is None and e.interim_after:
            out.append(SKIP(what, f"not yet run (interim checks, after stage {e.interim_after})"))
        elif st is None:
            out.append(SKIP(what, f"not selected (GPU_CHECK_STAGES={e.selected})"))
        elif st.rc == NO_TIME:
            out.append(SKIP(what, st.budget_note()))
        elif st.rc in TIMED_OUT:
            note = st.budget_note()
            out.append(FAIL(what, f"timed out after {st.limit} s{note} (log.txt: how far it got)"))
        elif st.rc != "0":
            out.append(FAIL(what, f"exited {st.rc} after {st.seconds} s (log.txt says why)"))
        else:
            out.append(PASS(what, f"{st.seconds} s of at most {st.limit} s"))
    return out


def preflight_checks(e: Evidence) -> list[Check]:
    if not e.ran("preflight"):
        return [not_there(e, "preflight", "imports")]
    out = []
    imp = e.imports or {}
    missing = {k: v for k, v in (imp.get("modules") or {}).items() if not v.get("ok")}
    where = imp.get("ampscope_from", "?")
    if not imp:
        out.append(FAIL("imports", "preflight/imports.json is missing"))
    elif missing:
        out.append(FAIL("imports", "; ".join(f"{k}: {v.get('error')}" for k, v in missing.items())))
    elif not imp.get("ampscope_from_checkout"):
        out.append(FAIL("imports", f"ampscope came from {where}, not from the checkout"))
    else:
        out.append(PASS("imports", f"{len(imp['modules'])} modules; ampscope from {where}"))
    doc = e.doctor
    device = "cpu" if e.smoke else "cuda"
    verdict = ((doc or {}).get("compile") or {}).get(device) or {}
    untried_ok = e.smoke and verdict.get("ok") is None  # the smoke run's compile stage compiles
    if doc is None:
        out.append(FAIL("doctor", "doctor --json wrote no readable JSON"))
    elif not e.smoke and not doc.get("cuda_available"):
        out.append(FAIL("doctor", f"torch {doc.get('torch')} sees no CUDA GPU"))
    elif verdict.get("ok") is not True and not untried_ok:
        out.append(FAIL("doctor", f"torch.compile on {device}: {verdict.get('why')}"))
    else:
        out.append(
            PASS(
                "doctor",
                f"torch {doc.get('torch')}; torch.compile on {device}: {verdict.get('why')}",
            )
        )
    return out


def probe_checks(e: Evidence) -> list[Check]:
    """tf32 and fp32 compiled: the states after which torch's legacy TF32 getters raised, and
    inductor reads them (mm templates; convolution templates read cudnn.allow_tf32)."""
    out = []
    for preset in ("tf32", "fp32"):
        what = f"{preset} compile probe"
        run = e.run("probe", preset)
        if preset == "fp32" and e.smoke:
            out.append(SKIP(what, "GPU only: inductor's convolution templates need max-autotune"))
            continue
        if run is None:
            out.append(not_there(e, "probe", what))
            continue
        config = run_config(run)
        mode, kind = config.get("compile", "?"), (config.get("workload") or {}).get("kind", "?")
        if run.done is None or run.done.status != "ok":
            error = run.done.error if run.done else "no done event"
            out.append(FAIL(what, f"{preset} {kind} compile = '{mode}' {run.status}: {error}"))
            continue
        if mode == "off":  # a smoke run's probe: the plumbing, not the compile
            out.append(PASS(what, f"{preset} {kind} trained eager (a smoke run's probe)"))
            continue
        took = f"{run.done.compile_s or 0:.1f} s"
        out.append(PASS(what, f"{preset} {kind} compiled ({mode}) in {took} and trained"))
    return out


def finished_checks(e: Evidence) -> list[Check]:
    """Every run of the training stages ends ok; fp16 may fail, as it is meant to."""
    bad, good = [], 0
    for stage in ("eager", "compile", "fp8", "ranks", "max-autotune"):
        for run in e.runs.get(stage, []):
            if run.status == "ok" or (run.preset == "fp16" and run.status == "failed"):
                good += 1
                continue
            error = run.done.error if run.done and run.done.error else run.problem
            if not error:  # no done event and nothing to say: the stage's time ran out first
                error = f"no done event: stage {stage} ended before the run did"
            bad.append(f"{run.preset} ({stage}) {run.status}: {error[:200]}")
    if bad:
        return [FAIL("runs finished", "; ".join(bad))]
    return [PASS("runs finished", f"{good} runs ended ok (fp16 may fail: it is meant to)")]


def trained(run: records.RunRecord) -> bool:
    return run.done is not None and run.done.status == "ok"


def loss_checks(e: Evidence) -> list[Check]:
    falls, flat = [], []
    for stage in ("eager", "compile", "fp8", "ranks", "max-autotune"):
        for run in e.runs.get(stage, []):
            if run.preset in MEANT_TO_FAIL or not trained(run):
                continue
            d = run.done
            assert d is not None
            pair = f"{run.preset} ({stage}) {d.loss_first} -> {d.loss_final}"
            ok = d.loss_first is not None and d.loss_final is not None
            (falls if ok and d.loss_final < d.loss_first else flat).append(pair)
    left_out = ", ".join(f"{k} ({v})" for k, v in MEANT_TO_FAIL.items())
    if flat:
        return [FAIL("loss falls", f"not in {'; '.join(flat)}")]
    if not falls:
        stages = ("eager", "compile", "fp8", "ranks", "max-autotune")
        if any(e.ran(s) for s in stages):
            return [FAIL("loss falls", "no training run finished to read it from")]
        return [SKIP("loss falls", "no training stage run (GPU_CHECK_STAGES)")]
    return [PASS("loss falls", f"in all {len(falls)} runs; left out: {left_out}")]


def fp16_checks(e: Evidence) -> list[Check]:
    out = []
    amp = e.run("eager", "amp-fp16")
    what = "amp-fp16 finite"
    if amp is None or amp.done is None:
        out.append(not_there(e, "eager", what))
    else:
        d = amp.done
        detail = f"{amp.status}, final loss {d.loss_final}, {d.skipped_steps} skipped steps"
        ok = d.status == "ok" and d.loss_final is not None and d.skipped_steps <= MAX_SKIPPED
        out.append((PASS if ok else FAIL)(what, f"{detail} (at most {MAX_SKIPPED})"))
    what = "noscale grad zeros"
    noscale = e.run("eager", "amp-fp16-noscale")
    if e.smoke:  # 1/(tokens x vocab) of a tiny model is well inside fp16's range
        out.append(SKIP(what, "the smoke run's tiny gradients do not underflow; GPU sizes do"))
        return out
    if amp is None or noscale is None:
        out.append(not_there(e, "eager", what))
        return out
    scaled, unscaled = grad_zeros(amp), grad_zeros(noscale)
    if scaled is None or unscaled is None:
        out.append(FAIL(what, "a run measured no grad_zero_frac (grad_zero_every)"))
    else:
        detail = f"amp-fp16-noscale {unscaled:.2%} of output gradients zero, amp-fp16 {scaled:.2%}"
        out.append((PASS if unscaled > scaled else FAIL)(what, detail))
    return out


def grad_zeros(run: records.RunRecord) -> float | None:
    values = [
        s.grad_zero_frac
        for s in run.events
        if isinstance(s, ev.StepEvent) and s.grad_zero_frac is not None
    ]
    return statistics.mean(values) if values else None


def warning_checks(e: Evidence) -> list[Check]:
    seen: dict[str, list[str]] = {}
    unexpected: dict[str, tuple[list[str], str]] = {}
    mig = any(len(row) > 1 and row[1].lower() == "enabled" for row in e.nvidia_smi)
    for stage, runs in e.runs.items():
        for run in runs:
            allowed = EXPECTED_WARNINGS | (CPU_WARNINGS if e.smoke else set())
            allowed |= MIG_WARNINGS if mig else set()
            if run.hello is not None and run.hello.config.get("grad_scaler") != "off":
                allowed |= SCALER_WARNINGS if run.preset.startswith("amp-fp16") else set()
            for w in run.events:
                if not isinstance(w, ev.WarningEvent) or w.code in ev.NOTE_CODES:
                    continue  # a note (a new epoch, numerics off under compile) is no warning
                seen.setdefault(w.code, []).append(run.preset)
                if w.code not in allowed:
                    presets, _ = unexpected.setdefault(w.code, ([], w.message))
                    presets.append(f"{run.preset} ({stage})")
    if unexpected:
        detail = "; ".join(
            f"{code} in {', '.join(sorted(set(p)))}: {msg[:160]}"
            for code, (p, msg) in sorted(unexpected.items())
        )
        return [FAIL("warnings", detail)]
    kinds = ", ".join(f"{c} x{len(p)}" for c, p in sorted(seen.items())) or "none"
    return [PASS("warnings", f"only expected kinds: {kinds}")]


def machine_checks(e: Evidence) -> list[Check]:
    """``doctor --bench``: every format measured beside its datasheet; on an H200, bf16 and the
    copy at least what the H200 here delivered before. A smoke run checks the CPU's figures."""
    if not e.ran("machine"):
        return [not_there(e, "machine", "machine check")]
    data = e.machine or {}
    matmul = data.get("matmul") or {}
    memory = data.get("memory") or {}
    if not matmul:
        return [FAIL("machine check", "machine/machine.json is missing or has no matmul figures")]
    device = str(data.get("device", "?"))
    want = ("fp32", "bf16", "fp16") if e.smoke else ("fp32", "tf32", "bf16", "fp16", "fp8")
    missing = [f for f in want if not (matmul.get(f) or {}).get("tflops")]
    listed = ", ".join(
        f"{f} {float(m['tflops']):.4g}" for f, m in matmul.items() if m.get("tflops")
    )
    out = [
        FAIL("machine check", f"{device}: no figure for {', '.join(missing)} ({listed})")
        if missing
        else PASS(
            "machine check",
            f"{device}: TFLOP/s {listed}; {len(data.get('verdicts') or [])} verdicts",
        )
    ]
    if e.smoke:
        return [*out, SKIP("machine bf16", GPU_ONLY), SKIP("machine copy", GPU_ONLY)]
    if "H200" not in device.upper():
        why = f"the thresholds are an H200's; this is {device}"
        return [*out, SKIP("machine bf16", why), SKIP("machine copy", why)]
    bf16 = float((matmul.get("bf16") or {}).get("tflops") or 0.0)
    floor = MACHINE_H200["bf16_tflops"]
    out.append(
        (PASS if bf16 >= floor else FAIL)(
            "machine bf16", f"{bf16:.0f} TFLOP/s (at least {floor:.0f} on an H200)"
        )
    )
    copy = float(memory.get("gbps") or 0.0)
    floor = MACHINE_H200["copy_gbps"]
    out.append(
        (PASS if copy >= floor else FAIL)(
            "machine copy", f"{copy:,.0f} GB/s (at least {floor:,.0f} on an H200)"
        )
    )
    return out
