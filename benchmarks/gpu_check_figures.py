"""The GPU check's verdicts on figures only a GPU gives: peak row, MFU, speed order, compile
modes, fp8, NVML samples; and on the several-process runs and the dashboard, on any device.

A smoke run on the CPU SKIPs the GPU figures, saying so. docs/gpu-check.md has the thresholds.
"""

from __future__ import annotations

from gpu_check_rules import (
    BF16_PEAKS,
    FAIL,
    FP8_LOSS_TOLERANCE,
    GPU_ONLY,
    MFU_RANGE,
    PASS,
    SKIP,
    Check,
    Evidence,
    median_ms,
    ms,
    not_there,
    run_config,
)

from ampscope.core import events as ev
from ampscope.core import records


def peak_checks(e: Evidence) -> list[Check]:
    what = "peak row"
    if e.smoke:
        return [SKIP(what, GPU_ONLY)]
    run = e.run("eager", "amp-bf16")
    if run is None or run.hello is None:
        return [not_there(e, "eager", what)]
    h = run.hello
    smi = e.nvidia_smi[0] if e.nvidia_smi else []
    name = smi[0] if smi else ""
    power = watts(smi[2]) if len(smi) > 2 else None
    mig = smi[1] if len(smi) > 1 else "?"
    note = h.peak_tflops_note or ""
    row = note.split(" dense ")[0] if " dense " in note else ""
    where = (
        f"{name or h.device_name} ({power or '?'} W, MIG {mig}): '{note}', {h.peak_tflops} TFLOP/s"
    )
    problems = []
    if name and not same_gpu(h.device_name or "", name, mig):
        problems.append(f"torch names it '{h.device_name}', nvidia-smi '{name}'")
    if not row:
        problems.append("no peak row matched")
    elif row.split()[0].upper() not in (name or h.device_name or "").upper():
        problems.append(f"row {row} is another GPU")
    else:
        problems += variant_problems(row, name or h.device_name or "", power)
    expected = BF16_PEAKS.get(row)
    if expected is not None and "MIG" not in note and abs((h.peak_tflops or 0) - expected) > 0.1:
        problems.append(f"bf16 peak {h.peak_tflops}, the datasheet's is {expected}")
    return [(FAIL(what, f"{'; '.join(problems)} - {where}") if problems else PASS(what, where))]


def watts(text: str) -> float | None:
    try:
        return float(text.strip().split()[0])
    except (ValueError, IndexError):
        return None


def same_gpu(torch_name: str, smi_name: str, mig: str) -> bool:
    """torch and nvidia-smi name one GPU; a MIG slice is the GPU's name plus its profile
    ('NVIDIA H200 MIG 3g.71gb' on an 'NVIDIA H200' whose MIG mode is Enabled)."""
    if torch_name == smi_name:
        return True
    return mig.strip().lower() == "enabled" and torch_name.startswith(f"{smi_name} MIG ")


def board(name: str, power: float | None) -> str:
    """An H100/H200's board: NVL or PCIe when its name says so, else SXM, except a bare
    'NVIDIA H100' limited to 400 W or less, a PCIe board. A power limit an administrator
    lowered does not make an SXM board another one (ampscope.core.machine.hardware.identify agrees)."""
    upper = " ".join(name.upper().replace("-", " ").replace("_", " ").split())
    if "NVL" in upper.split():
        return "NVL"
    if "PCIE" in upper.split():
        return "PCIe"
    if upper in ("NVIDIA H100", "H100") and power is not None and power <= 400:
        return "PCIe"
    return "SXM"


def variant_problems(row: str, name: str, power: float | None) -> list[str]:
    if not any(g in row for g in ("H100", "H200")):
        return []
    want = board(name, power)
    return [] if want in row else [f"'{name}' at {power} W is the {want} board, the row {row}"]


def mfu_checks(e: Evidence) -> list[Check]:
    what = "MFU amp-bf16"
    if e.smoke:
        return [SKIP(what, GPU_ONLY)]
    run = e.run("eager", "amp-bf16")
    if run is None or run.done is None or run.done.status != "ok":
        return [not_there(e, "eager", what)]
    mfu = run.done.mfu
    lo, hi = MFU_RANGE
    ok = mfu is not None and lo <= mfu <= hi
    detail = (
        f"{mfu if mfu is None else f'{mfu:.1%}'} (plausible: {lo:.0%}-{hi:.0%}), eager, GPT large"
    )
    return [(PASS if ok else FAIL)(what, f"{detail}, {run.done.tflops or 0:.0f} TFLOP/s")]


def speed_checks(e: Evidence) -> list[Check]:
    if e.smoke:
        names = ["step time order", "compile-default beats eager"]
        names += ["compile-reduce-overhead beats eager", "compile-max-autotune beats eager"]
        return [SKIP(n, GPU_ONLY) for n in names]
    out = []
    order = [(p, median_ms(e.run("eager", p))) for p in ("fp32", "tf32", "amp-bf16")]
    text = " > ".join(f"{p} {ms(t)}" for p, t in order)
    if any(t is None for _, t in order):
        out.append(not_there(e, "eager", "step time order"))
    else:
        times = [t for _, t in order]
        ok = times[0] > times[1] > times[2]  # type: ignore[operator]
        out.append((PASS if ok else FAIL)("step time order", text))
    for stage, preset, base in (
        ("compile", "compile-default", "eager"),
        ("compile", "compile-reduce-overhead", "eager"),
        ("max-autotune", "compile-max-autotune", "max-autotune"),  # the small GPT, both
    ):
        what = f"{preset} beats eager"
        compiled, eager = median_ms(e.run(stage, preset)), median_ms(e.run(base, "amp-bf16"))
        if compiled is None or eager is None:
            out.append(not_there(e, stage if compiled is None else base, what))
            continue
        model = "small GPT" if stage == "max-autotune" else "GPT large"
        detail = f"{ms(compiled)} against amp-bf16 eager {ms(eager)} ({eager / compiled:.2f}x)"
        out.append((PASS if compiled < eager else FAIL)(what, f"{detail}, {model}"))
    return out


def graph_checks(e: Evidence) -> list[Check]:
    what = "reduce-overhead graphs"
    if e.smoke:
        return [SKIP(what, "CUDA graphs: GPU only")]
    run = e.run("compile", "compile-reduce-overhead")
    stats = [c for c in run.events if isinstance(c, ev.CompileEvent)] if run else []
    if not stats:
        return [not_there(e, "compile", what)]
    last = stats[-1]
    detail = (
        f"{last.recompiles} recompiles, {last.cudagraph_skips} cudagraph skips, "
        f"{last.graphs} graphs, {last.graph_breaks} graph breaks"
    )
    ok = last.recompiles == 0 and last.cudagraph_skips == 0
    return [(PASS if ok else FAIL)(what, detail)]


FP8_SPEED_FLOOR = {"fp8-tensorwise": 1.0, "fp8-rowwise": 0.85}
"""The least speed-up over compiled amp-bf16 each recipe must show on the width-2048 Llama.
Tensorwise must win. Rowwise, one scale per row and CUTLASS's kernel, is torchao's accurate
recipe and pays only on wider matmuls: on an H200 it ran at 0.93x there (tensorwise 1.12x),
so it is held to not losing more than 15 %."""


def fp8_checks(e: Evidence) -> list[Check]:
    out = []
    base = e.run("fp8", "compile-default")
    for preset, floor in FP8_SPEED_FLOOR.items():
        run = e.run("fp8", preset)
        fast = f"{preset} faster" if floor >= 1.0 else f"{preset} speed"
        close = f"{preset} final loss"
        if run is None or base is None or run.done is None or base.done is None:
            out += [not_there(e, "fp8", fast), not_there(e, "fp8", close)]
            continue
        if e.smoke:
            out.append(SKIP(fast, "GPU only: on a CPU fp8 is emulated"))
        else:
            t, b = median_ms(run), median_ms(base)
            ok = t is not None and b is not None and (t < b if floor >= 1.0 else b / t >= floor)
            detail = f"{ms(t)} against compiled amp-bf16 {ms(b)}"
            ratio = f" ({b / t:.2f}x" if t and b else " ("
            need = "faster" if floor >= 1.0 else f"at least {floor:.2f}x"
            out.append((PASS if ok else FAIL)(fast, f"{detail}{ratio}; {need}), Llama large"))
        mine, theirs = run.done.loss_final, base.done.loss_final
        if mine is None or theirs is None:
            out.append(FAIL(close, f"final loss {mine} against {theirs}: not finite"))
            continue
        gap = abs(mine - theirs) / abs(theirs)
        detail = f"{mine:.4f} against {theirs:.4f} ({gap:.2%}; at most {FP8_LOSS_TOLERANCE:.0%})"
        out.append((PASS if gap <= FP8_LOSS_TOLERANCE else FAIL)(close, detail))
    return out


def telemetry_checks(e: Evidence) -> list[Check]:
    what = "sys telemetry"
    if e.smoke:
        return [SKIP(what, "NVML: GPU only")]
    run = e.run("eager", "amp-bf16")
    if run is None:
        return [not_there(e, "eager", what)]
    samples = [s for s in run.events if isinstance(s, ev.SysEvent)]
    full = [
        s
        for s in samples
        if s.gpu_util is not None and s.power_w is not None and s.gpu_mem_used is not None
    ]
    if not full:
        return [FAIL(what, f"{len(samples)} sys events, none with GPU utilization, power, memory")]
    util = max(s.gpu_util or 0 for s in full)
    power = max(s.power_w or 0 for s in full)
    mem = max(s.gpu_mem_used or 0 for s in full) / 2**30
    detail = f"{len(full)} of {len(samples)} samples: util up to {util:.0f} %, "
    detail += f"power up to {power:.0f} W, memory up to {mem:.1f} GiB"
    return [(PASS if util > 0 and power > 0 else FAIL)(what, detail)]


def rank_checks(e: Evidence) -> list[Check]:
    runs = e.runs.get("ranks", [])
    if not runs:
        return [not_there(e, "ranks", "torchrun")]
    out = [rank_check(e, r) for r in runs]
    gpus = len(e.nvidia_smi)
    what = "fsdp2 amp-fp16 on 2+ GPUs"
    several = [
        r
        for r in runs
        if r.hello
        and r.hello.world_size > 1
        and r.hello.strategy == "fsdp2"
        and r.preset == "amp-fp16"
    ]
    if e.smoke:
        out.append(SKIP(what, GPU_ONLY))
    elif gpus < 2:
        out.append(SKIP(what, f"{gpus} GPU here: the 1-rank fsdp2 amp-fp16 run covers the path"))
    elif not several:
        out.append(FAIL(what, f"{gpus} GPUs, but no fsdp2 amp-fp16 record on several ranks"))
    return out


def rank_check(e: Evidence, run: records.RunRecord) -> Check:
    h, d = run.hello, run.done
    strategy = h.strategy if h else (run_config(run).get("parallel") or {}).get("strategy", "?")
    size = h.world_size if h else 0
    what = f"torchrun {strategy} {run.preset} x{size}"
    if h is None or d is None or d.status != "ok":
        return FAIL(what, f"{run.status}: {d.error if d else run.problem}")
    backend = "gloo" if e.smoke else "nccl"
    sums = [r.param_checksum for r in d.ranks or []]
    problems = []
    if h.backend != backend:
        problems.append(f"backend {h.backend}, expected {backend}")
    if size > 1 and (len(sums) != size or None in sums or len(set(sums)) != 1):
        problems.append(f"weights differ across ranks: {sums}")
    detail = f"{h.backend}, {d.steps_done} steps, {ms(d.step_ms_median)}, loss {d.loss_final}"
    detail += f", {d.skipped_steps} skipped"
    return FAIL(what, f"{'; '.join(problems)} ({detail})") if problems else PASS(what, detail)


def dashboard_checks(e: Evidence) -> list[Check]:
    what = "dashboard"
    if not e.ran("dashboard"):
        return [not_there(e, "dashboard", what)]
    tui = e.dashboard
    if tui is None:
        return [FAIL(what, "dashboard.json is missing: the pty driver did not finish")]
    problems = [p for p in tui.get("problems", []) if p]
    detail = (
        f"drew {tui.get('preset')} in {tui.get('seconds_to_draw')} s on a "
        f"{tui.get('size')} pty, {tui.get('steps')} steps in its record, "
        f"exit {tui.get('exit_code')} on SIGTERM"
    )
    return [FAIL(what, f"{'; '.join(problems)} ({detail})") if problems else PASS(what, detail)]
