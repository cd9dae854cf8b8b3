"""A plan from a user's model: the GPU it is for, the step measured, the decisions made.

``choose_gpu`` picks what the speed is predicted for (``--gpu``, else this machine's GPU,
else an assumed H100 SXM, said so) with the machine check's measured TFLOP/s where they are
for that GPU. ``plan_fp8`` and ``plan_fp16`` watch a few fp32 training steps (``capture``,
``fp16``; ``--steps``, ``core.plan.steps``), time the GEMM shapes where this GPU is the target
(``timing``), and let ``core.plan`` decide.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ampscope.core.machine import check
from ampscope.core.machine.hardware import identify
from ampscope.core.plan import candidates, constants_used, plan_layers
from ampscope.core.plan.decide import pct
from ampscope.core.plan.fp16 import amp_bf16_note, plan_module
from ampscope.core.plan.report import BAND_SOURCE, FITS_BAND, Plan, Tokens
from ampscope.core.plan.speed import GemmTimes, Machine, Shape, datasheet_machine, find_gpu
from ampscope.core.plan.steps import STEPS
from ampscope.core.presets.fp8_recipes import MIN_CAPABILITY
from ampscope.engine.plan.capture import Fp8Capture, capture_fp8
from ampscope.engine.plan.fp16 import capture_fp16
from ampscope.engine.workloads.user import UserWorkload

ASSUMED_GPU = "h100"
Timer = Callable[[list[Shape]], GemmTimes]


@dataclass(frozen=True)
class Target:
    """The GPU a plan's speed is predicted for."""

    machine: Machine
    source: str  # how it was chosen, in words
    here: bool  # it is this machine's GPU: its shapes can be timed


def this_gpu() -> tuple[str, tuple[int, int]] | None:
    """This machine's first CUDA device: (name, compute capability), or None."""
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0)


def choose_gpu(name: str | None, here: tuple[str, tuple[int, int]] | None) -> Target:
    """``--gpu NAME`` (raises UnknownGpu), else ``here``, else the assumed H100 SXM."""
    device_name = here[0] if here else None
    row_here = identify(device_name) if device_name else None
    if name is not None:
        gpu = find_gpu(name)
        same = row_here is not None and row_here.model == gpu.model
        source = f"--gpu {name}" + (" (this machine's GPU)" if same else "")
    elif row_here is not None:
        gpu, same, source = row_here, True, f"this machine's GPU ({device_name})"
    elif device_name is not None:
        gpu, same = find_gpu(ASSUMED_GPU), False
        source = f"assumed: '{device_name}' is not in the peak table; --gpu names another"
    else:
        gpu, same = find_gpu(ASSUMED_GPU), False
        source = "assumed: no GPU here; --gpu names another"
    measured = {}
    if same and device_name is not None:
        for fmt in ("bf16", "fp8"):
            peak = check.measured_peak(device_name, fmt)
            if peak.tflops:
                measured[fmt] = (peak.tflops, peak.note or "measured by ampscope doctor --bench")
    fp8_here = here is not None and here[1] >= MIN_CAPABILITY
    return Target(datasheet_machine(gpu, measured), source, same and fp8_here)


def plan_fp8(
    workload: UserWorkload,
    target: Target,
    recipe: str,
    tokens: int | None,
    timer: Timer | None,
    steps: int = STEPS,
) -> tuple[Plan, Fp8Capture]:
    """Watch the steps, time the shapes where this GPU is the target, decide every layer."""
    capture = capture_fp8(workload, steps)
    factor = tokens / capture.rows if tokens and capture.rows else 1.0
    times = None
    if timer is not None and target.here:
        shapes = sorted(
            {(max(1, round(m * factor)), k, n) for f in capture.layers for m, k, n in f.calls}
        )
        times = timer(shapes)
    layers = plan_layers(capture.layers, target.machine, recipe, factor, times)
    asked = candidates(recipe)
    timed = times is not None and all(layer.speed_from != "model" for layer in layers)
    notes = [
        f"a recipe fits a layer when none of its six casts flushes more than "
        f"{pct(FITS_BAND)} of its non-zero values to zero and none is inf/NaN ({BAND_SOURCE})",
    ]
    if tokens and not capture.rows:
        notes.append(  # layers fp8 cannot take (8 -> 4 features) ran, but have no M to scale
            f"--tokens {tokens}: no layer fp8 can take ran in the steps (each layer's reason is "
            "above), so no M to scale"
        )
    elif tokens:
        notes.append(
            f"M planned for {tokens} tokens a step: each layer's rows times {factor:.4g} "
            f"({capture.rows} in a measured step: {capture.rows_from}); the casts' figures "
            "are the measured batches'"
        )
    if times is not None:
        notes.append("GEMMs timed on this GPU; the casts' kernels from the speed model")
    plan = Plan(
        target="fp8",
        gpu=target.machine.name,
        gpu_source=target.source,
        speed_source="measured" if timed else "model",
        recipe=recipe if len(asked) == 1 else "auto",
        model=None,
        tokens=Tokens(measured=capture.rows, planned=tokens) if tokens else None,
        layers=layers,
        notes=notes,
        constants=constants_used(),
        steps=capture.steps,
    )
    return plan, capture


def plan_fp16(workload: UserWorkload, steps: int = STEPS) -> tuple[Plan, bool]:
    """Watch the steps, decide every module; True when no module holds the overflow (the
    model's own forward), so amp-bf16 is the answer."""
    capture = capture_fp16(workload, steps)
    leaves = [m for m in capture.modules if m.leaf or m.own_inf]
    layers = [plan_module(m, capture.steps) for m in leaves]
    notes = [
        f"a module stays in fp32 when any input or output reaches beyond fp16's 65504, or when "
        f"more than {pct(FITS_BAND)} of their non-zero values round to zero in fp16"
    ]
    if capture.root_inf:
        notes.append(amp_bf16_note())
    plan = Plan(
        target="fp16",
        gpu=None,
        gpu_source=None,
        speed_source=None,
        recipe=None,
        model=None,
        tokens=None,
        layers=layers,
        notes=notes,
        preset_precision="amp-bf16" if capture.root_inf else "amp-fp16",
        steps=capture.steps,
    )
    return plan, capture.root_inf
