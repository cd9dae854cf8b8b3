"""The GPU check's verdicts on the two tools it runs once: ``ampscope profile`` (kernel times
from CUPTI on a GPU) and ``ampscope numerics`` (every layer measured at every step).

They read what the stages printed with ``--json`` (OUTDIR/profile/profile.json and
OUTDIR/numerics/numerics.json) and the runs' records. docs/gpu-check.md has the thresholds.
"""

from __future__ import annotations

from typing import Any

from gpu_check_rules import FAIL, PASS, Check, Evidence, not_there

from ampscope.core.numerics import FORMATS

SHARES_TOLERANCE = 0.05  # the profile's class shares sum to 1 within this
PROFILE_PRESET = "amp-bf16"
NUMERICS_PRESET = "amp-fp16"


def profile_checks(e: Evidence) -> list[Check]:
    what = f"profile {PROFILE_PRESET}"
    if not e.ran("profile"):
        return [not_there(e, "profile", what)]
    p = e.profile
    if p is None:
        return [FAIL(what, "profile/profile.json is missing or not JSON (log.txt says why)")]
    classes: dict[str, Any] = p.get("classes") or {}
    total = sum(float(v) for v in classes.values() if isinstance(v, (int, float)))
    timing = p.get("timing")
    want = "cpu" if e.smoke else "device"
    bf16 = ((p.get("dtypes") or {}).get("matmul") or {}).get("bf16") or 0.0
    problems = []
    if abs(total - 1.0) > SHARES_TOLERANCE:
        problems.append(f"class shares sum to {total:.3f}, not 1 within {SHARES_TOLERANCE:.0%}")
    if timing != want:
        problems.append(f"timing '{timing}', expected '{want}' (kernel times on a GPU)")
    if not bf16 > 0:
        problems.append(f"no bf16 matmul among the classes {sorted(classes)}")
    detail = (
        f"{timing} timing, {p.get('step_ms')} ms a step over {p.get('steps')} steps, shares sum "
        f"to {total:.3f}, bf16 matmul {bf16:.0%}; advice: {str(p.get('advice'))[:120]}"
    )
    return [FAIL(what, f"{'; '.join(problems)} ({detail})") if problems else PASS(what, detail)]


def numerics_checks(e: Evidence) -> list[Check]:
    what = f"numerics {NUMERICS_PRESET}"
    if not e.ran("numerics"):
        return [not_there(e, "numerics", what)]
    n = e.numerics
    if n is None:
        return [FAIL(what, "numerics/numerics.json is missing or not JSON (log.txt says why)")]
    modules = [m for m in n.get("modules") or [] if isinstance(m, dict)]
    unnamed = [m for m in modules if not m.get("name")]
    costed = [m for m in modules if priced(m)]
    run = e.run("numerics", NUMERICS_PRESET)
    step_ms = run.done.step_ms_median if run is not None and run.done is not None else None
    problems = []
    if run is None or run.status != "ok":
        problems.append(f"its run {'left no record' if run is None else run.status}")
    if not modules or unnamed:
        problems.append(f"{len(modules)} modules, {len(unnamed)} of them without a name")
    if len(costed) != len(modules):
        problems.append(f"{len(modules) - len(costed)} modules without what each format would lose")
    if not n.get("steps_sampled"):
        problems.append("no step sampled")
    if step_ms is None:
        problems.append("its run record holds no step time (what measuring every layer cost)")
    names = ", ".join(str(m.get("name")) for m in modules[:4])
    detail = (
        f"{len(modules)} of {n.get('modules_total')} modules over {n.get('steps_sampled')} "
        f"steps ({names}, ...), each with fp16/bf16/fp8 overflow and underflow shares; "
        f"{step_ms} ms a measured step"
    )
    return [FAIL(what, f"{'; '.join(problems)} ({detail})") if problems else PASS(what, detail)]


def priced(module: dict[str, Any]) -> bool:
    """Each pass measured (outputs, gradients) says what every format would lose."""
    sides = [module[side] for side in ("activation", "gradient") if module.get(side)]
    return bool(sides) and all(losses(side.get("formats") or {}) for side in sides)


def losses(figures: dict[str, Any]) -> bool:
    return set(figures) == set(FORMATS) and all(
        isinstance(f, dict) and "overflow" in f and "underflow" in f for f in figures.values()
    )
