"""The precision plan (``ampscope plan``): which layer in which format, and why. Torch-free.

The engine measures (``ampscope.engine.plan``: the shapes that ran, the casts, GEMM timings,
the verify runs); this package decides and words it, and writes the files.

    report.py  the plan as data: the JSON contract of docs/plan.md
    speed.py   the roofline: a layer's fp8 speed-up over bf16, its constants and their sources
    decide.py  the fp8 decision per layer, and its reason in words
    fp16.py    the fp16 decision per module (which stay in fp32)
    steps.py   several observed fp32 steps as one set of figures (worst first), and their words
    files.py   the preset, torchao's filter, torchtitan's list, the JSON
    proof.py   ``--verify``'s table, read back from the run records as ``bench`` reads them
    text.py    the plan for a terminal
"""

from __future__ import annotations

from collections.abc import Sequence

from ampscope.core.plan.decide import LayerFacts, plan_layer
from ampscope.core.plan.report import ConstantUsed, LayerPlan, Plan
from ampscope.core.plan.speed import CONSTANTS, RECIPES, GemmTimes, Machine, Shape

RECIPE_CHOICES = ("auto", *RECIPES)


def candidates(recipe: str) -> list[str]:
    """The recipes a layer may get: all for ``auto``, else the one asked."""
    return list(RECIPES) if recipe == "auto" else [recipe]


def constants_used() -> list[ConstantUsed]:
    return [
        ConstantUsed(name=c.name, value=c.value, unit=c.unit, source=c.source) for c in CONSTANTS
    ]


def plan_layers(
    facts: Sequence[LayerFacts],
    machine: Machine,
    recipe: str,
    factor: float = 1.0,
    times: GemmTimes | None = None,
) -> list[LayerPlan]:
    return [plan_layer(f, machine, candidates(recipe), factor, times) for f in facts]


def gemm_plan(shapes: Sequence[Shape], machine: Machine, recipe: str, gpu_source: str) -> Plan:
    """``--gemm M,K,N ...``: each shape's predicted speed-up and decision from the model
    alone (never timed, numerics unknown)."""
    facts = [LayerFacts(f"{m},{k},{n}", "GEMM", [(m, k, n)], None, None) for m, k, n in shapes]
    return Plan(
        target="fp8",
        gpu=machine.name,
        gpu_source=gpu_source,
        speed_source="model",
        recipe=recipe,
        model=None,
        tokens=None,
        layers=plan_layers(facts, machine, recipe),
        constants=constants_used(),
    )
