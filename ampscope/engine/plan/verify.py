"""``--verify STEPS``: the plan proven by training, beside what it is measured against.

Each variant is a preset run as ``ampscope run`` runs it (``engine.lifecycle.run``), in this
process one after the other, with the same seed, the user's model and batches, and the same
number of steps; the records go under the plan's folder. fp8: the baseline (amp-bf16), every
layer fp8 can take, torchao's auto filter (its shape rule), and the plan's preset. fp16:
amp-fp16, the plan's preset, amp-bf16. On a CPU fp8 is emulated and nothing is compiled: the
losses are comparable, the step times are not (``core.plan.proof`` says so). The rows are
read back from the records (``core.plan.proof``), as ``ampscope bench`` reads its runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ampscope.core import events as ev
from ampscope.core import records
from ampscope.core.presets.fp8_recipes import MIN_CAPABILITY
from ampscope.core.presets.toml_text import toml_value
from ampscope.core.presets.workload_spec import model_override
from ampscope.engine.lifecycle.run import EXIT_STOPPED, run
from ampscope.engine.private_apis import torchao_auto_filter


@dataclass
class Variant:
    """One run: its row's name, the preset (a name or a file) and its overrides; ``skip``
    says why it is not run (torchao's auto filter converting nothing, say)."""

    name: str
    preset: str
    overrides: list[str]
    skip: str | None = None


@dataclass
class Ran:
    variant: Variant
    record: records.RunRecord | None
    code: int | None


def on_this_device(device: torch.device, fp8: bool) -> list[str]:
    """Overrides that make a run fit this device: a CPU runs eager, fp8 emulated; a GPU
    compiles (as the fp8 presets do) and emulates fp8 only without fp8 Tensor Cores."""
    if device.type != "cuda":
        return ["device='cpu'", "compile='off'", *(["fp8.emulate=true"] if fp8 else [])]
    where = f"device='cuda:{device.index or 0}'"
    emulate = fp8 and torch.cuda.get_device_capability(device) < MIN_CAPABILITY
    return [where, "compile='default'", *(["fp8.emulate=true"] if emulate else [])]


def common(spec: str, steps: int) -> list[str]:
    return [model_override(spec), f"steps={steps}", "numerics.every=0", "warmup_steps=1"]


def fp8_variants(
    spec: str,
    steps: int,
    device: torch.device,
    plan_preset: Path,
    recipe: str,
    auto_layers: list[str] | None,
    auto_recipe: str,
) -> list[Variant]:
    """The four fp8 runs: baseline, every layer, torchao's auto filter, the plan."""
    base = common(spec, steps)
    fp8_here = on_this_device(device, fp8=True)
    bf16_here = on_this_device(device, fp8=False)
    auto_skip = None
    if auto_layers is not None and not auto_layers:
        auto_skip = f"torchao's auto filter ({auto_recipe}) converts none of this model's layers"
    return [
        Variant("baseline (amp-bf16)", "amp-bf16", [*base, *bf16_here]),
        Variant(
            "every layer in fp8",
            "fp8-tensorwise",
            [*base, f"fp8.recipe='{recipe}'", "fp8.skip_head=false", *fp8_here],
        ),
        Variant(
            "torchao auto filter",
            "fp8-tensorwise",
            [
                *base,
                f"fp8.recipe='{auto_recipe}'",
                f"fp8.layers={toml_value(auto_layers or [])}",
                *fp8_here,
            ],
            skip=auto_skip or (None if auto_layers is not None else "torchao is not installed"),
        ),
        Variant("the plan", str(plan_preset), [*base, *fp8_here]),
    ]


def fp16_variants(spec: str, steps: int, device: torch.device, plan_preset: Path) -> list[Variant]:
    """The three fp16 runs: amp-fp16, the plan, amp-bf16 (the baseline of the gaps)."""
    base = [*common(spec, steps), *on_this_device(device, fp8=False)]
    return [
        Variant("amp-fp16", "amp-fp16", base),
        Variant("the plan", str(plan_preset), base),
        Variant("amp-bf16", "amp-bf16", base),
    ]


def auto_filter_layers(model: nn.Module, recipe: str, eligible: list[str]) -> list[str] | None:
    """The layers torchao's auto filter converts (by weight shape), among those that can run
    in fp8; None without torchao."""
    try:
        keep = torchao_auto_filter(recipe)
    except ImportError:
        return None
    modules = dict(model.named_modules())
    return [name for name in eligible if keep(modules[name], name)]


def run_variants(
    variants: list[Variant],
    runs_dir: Path,
    on_event: Callable[[str, ev.Event], None] | None = None,
) -> list[Ran]:
    """Run each variant (the skipped ones not), its record under ``runs_dir``."""
    out = []
    for variant in variants:
        if variant.skip is not None:
            out.append(Ran(variant, None, None))
            continue
        where: list[Path] = []
        told = (lambda e, n=variant.name: on_event(n, e)) if on_event else None
        code = run(
            variant.preset,
            variant.overrides,
            runs_dir=runs_dir,
            on_event=told,
            on_record=where.append,
        )
        record = records.load_run(where[0]) if where and where[0].is_dir() else None
        out.append(Ran(variant, record, code))
        if code == EXIT_STOPPED:  # Ctrl+C stops the run and the verify, not just this run
            raise KeyboardInterrupt
    return out
