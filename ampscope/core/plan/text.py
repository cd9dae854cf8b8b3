"""A plan for a terminal: a row per layer, then why, then what was written and how to train it."""

from __future__ import annotations

from ampscope.core.comparison import text_table
from ampscope.core.plan.report import LayerPlan, Plan
from ampscope.core.plan.steps import steps_words
from ampscope.core.text import visible, wrap


def decision_cell(layer: LayerPlan) -> str:
    return f"fp8 {layer.recipe}" if layer.decision == "fp8" else layer.decision


def gemm_cell(layer: LayerPlan) -> str:
    g = layer.gemm
    return f"{g.M},{g.K},{g.N}" if g else "-"


def render(plan: Plan, width: int | None = None) -> str:
    """The whole plan as text fitted to ``width`` columns (None: lines as they come)."""
    lines = wrap(_title(plan), width, "", "  ")
    if plan.target == "fp8":
        heads = ["layer", "GEMM M,K,N", "speed-up", "decision"]
        body = [
            [
                visible(layer.name, 48),
                gemm_cell(layer),
                f"{layer.predicted_speedup:.2f}x" if layer.predicted_speedup else "-",
                decision_cell(layer),
            ]
            for layer in plan.layers
        ]
    else:
        heads = ["module", "kind", "decision"]
        body = [[visible(m.name, 48), visible(m.kind, 24), m.decision] for m in plan.layers]
    lines += text_table(heads, body, width) if body else ["(no layer to plan)"]
    why = [m for m in plan.layers if plan.target == "fp8" or m.decision == "fp32"]
    if why:
        lines += ["", "why:"]
        for layer in why:
            lines += wrap(
                f"{visible(layer.name, 120)}: {visible(layer.reason, 1000)}", width, "  ", "    "
            )
    lines += ["", _summary(plan)]
    lines += [line for note in plan.notes for line in wrap(f"note: {note}", width, "", "  ")]
    return "\n".join(lines)


def _title(plan: Plan) -> str:
    model = f" for {visible(plan.model, 200)}" if plan.model else ""
    seen = f"; numerics from {steps_words(plan.steps)}" if plan.steps else ""
    if plan.target == "fp16":
        return f"fp16 plan{model}: which modules amp-fp16 keeps in fp32{seen}"
    speed = "GEMMs timed here" if plan.speed_source == "measured" else "the speed model"
    return (
        f"fp8 plan{model}, recipe {plan.recipe}, for {plan.gpu} "
        f"({visible(plan.gpu_source, 200)}); speed-ups from {speed}{seen}"
    )


def _summary(plan: Plan) -> str:
    total = len(plan.layers)
    if plan.target == "fp16":
        if plan.preset_precision == "amp-bf16":
            return "amp-fp16 cannot hold this model (see the note): the preset trains amp-bf16."
        kept = len(plan.fp32_layers)
        return f"{total - kept} of {total} modules in fp16, {kept} in fp32."
    if total == 0:
        return (
            "No linear layer to plan: fp8 training converts nn.Linear layers only, "
            "so the preset trains amp-bf16."
        )
    if not plan.fp8_layers:
        return f"No layer in fp8: all {total} in bf16."
    by = plan.recipes()
    mix = ", ".join(f"{r} {len(names)}" for r, names in by.items())
    return (
        f"{len(plan.fp8_layers)} of {total} layers in fp8"
        + (f" ({mix})" if mix else "")
        + ", the rest in bf16."
    )


def files_lines(plan: Plan) -> list[str]:
    """Where the plan was written and the command that trains it."""
    f = plan.files
    if f.preset is None:
        return []
    lines = ["", "written:"]
    for label, path in (
        ("preset", f.preset),
        ("torchao module_filter_fn", f.torchao),
        ("torchtitan filter_fqns", f.torchtitan),
        ("json", f.json),
    ):
        if path:
            lines.append(f"  {label}: {visible(path, 500)}")
    lines.append(f"train it: ampscope run {visible(f.preset, 500)}")
    return lines
