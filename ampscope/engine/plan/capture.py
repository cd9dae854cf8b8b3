"""A user's model in fp32 training steps, watched: every linear layer's calls and casts.

The model is the user's own (their factory, ``engine.workloads.user``), trained for a few fp32
steps on its own batches (``fp32_steps``). A forward hook on every ``nn.Linear`` takes the rows
of each call (leading dimensions flattened: the GEMM's M) and casts its input and weight every
way torchao would (``casts``); a hook on the output takes the gradient that comes back. Each
step's casts are figured on their own and merged with the steps before, worst first
(``core.plan.steps``); the calls are those of every step. A layer no step called is named so.
Which layers fp8 conversion could take, and why not the others, is the run's own rule
(``engine.step.fp8.choose_layers``), the head included: the plan decides it on its figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ampscope.core.plan.decide import LayerFacts
from ampscope.core.plan.report import RecipeNumerics
from ampscope.core.plan.steps import STEPS, merge_numerics, never_called
from ampscope.core.workload import ModelContext
from ampscope.engine.plan.casts import LayerCasts
from ampscope.engine.plan.fp32_steps import fp32_steps
from ampscope.engine.step.fp8 import choose_layers
from ampscope.engine.step.module_calls import called_modules
from ampscope.engine.workloads.user import UserWorkload, build_user_workload

WATCHED_DTYPE = torch.bfloat16  # what an fp8 layer's input and gradient are under autocast


@dataclass
class Fp8Capture:
    """What the steps showed: a fact per layer, the rows of a step and how they were read."""

    layers: list[LayerFacts]
    linears: list[str]  # every nn.Linear by name: what torchao's conversion could reach
    rows: int  # a step's tokens: what --tokens scales from
    rows_from: str  # where ``rows`` was read
    model_name: str
    loss: float  # the first step's
    steps: int  # fp32 steps observed


@dataclass
class _Watch:
    """One layer over the steps: every call's shape, this step's casts, the steps' numerics."""

    shapes: list[tuple[int, int, int]] = field(default_factory=list)
    casts: LayerCasts = field(default_factory=LayerCasts)
    numerics: dict[str, RecipeNumerics] | None = None

    def end_step(self) -> None:
        """Fold this step's casts into the steps' figures; the next step starts afresh."""
        if self.casts.tallies:
            self.numerics = merge_numerics(self.numerics, self.casts.numerics())
        self.casts = LayerCasts()


def build(spec: str, device: torch.device, seed: int = 0) -> UserWorkload:
    """The user's workload on ``device``, its first batch read."""
    workload = build_user_workload(spec, ModelContext(device, None, seed, "fp32"))
    workload.prepare()
    return workload


def capture_fp8(workload: UserWorkload, steps: int = STEPS) -> Fp8Capture:
    """Train ``steps`` fp32 steps of ``workload`` with every linear layer watched."""
    model = workload.model
    batch = workload.first_batch()
    called = called_modules(model, batch, workload.forward)
    converted, skipped = choose_layers(model, skip_head=False, called=called)
    watches: dict[str, _Watch] = {}
    handles = []
    for name, module in model.named_modules():  # one name per module object
        if isinstance(module, nn.Linear) and name in converted:
            watch = watches.setdefault(name, _Watch())
            handles.append(module.register_forward_hook(_hook(watch), with_kwargs=True))
    losses = []
    try:
        for step in fp32_steps(workload, steps):
            losses.append(step.loss)
            for watch in watches.values():
                watch.end_step()
    finally:
        for handle in handles:
            handle.remove()
    facts = _facts(model, converted, skipped, watches, steps)
    rows, rows_from = _rows(workload, watches)
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    return Fp8Capture(facts, linears, rows, rows_from, workload.name, losses[0], steps)


def _hook(watch: _Watch) -> Any:
    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        x = args[0] if args else kwargs.get("input")
        if not isinstance(x, torch.Tensor) or not isinstance(out, torch.Tensor):
            return
        k, n = x.shape[-1], out.shape[-1]
        rows = x.numel() // max(k, 1)
        watch.shapes.append((rows, k, n))
        with torch.no_grad():
            watch.casts.add("input", x.detach().reshape(-1, k).to(WATCHED_DTYPE))
            weight = module.weight
            assert isinstance(weight, torch.Tensor)
            watch.casts.add("weight", weight.detach())
        if out.requires_grad:
            out.register_hook(
                lambda g: watch.casts.add("grad", g.detach().reshape(-1, n).to(WATCHED_DTYPE))
            )

    return hook


def _facts(
    model: nn.Module,
    converted: list[str],
    skipped: dict[str, str],
    watches: dict[str, _Watch],
    steps: int,
) -> list[LayerFacts]:
    """A fact per matmul layer, in the model's order: the watched ones with their calls and
    casts, the rest with why fp8 cannot take them."""
    facts = []
    listed = set()
    for name, module in model.named_modules():
        kind = type(module).__name__
        if name in watches:
            watch = watches[name]
            why = None if watch.shapes else never_called(steps)
            facts.append(LayerFacts(name, kind, watch.shapes, why, watch.numerics))
            listed.add(name)
        elif name in skipped:
            facts.append(LayerFacts(name, kind, [], skipped[name], None))
            listed.add(name)
        if isinstance(module, nn.MultiheadAttention):
            key = f"{name}.in_proj_weight" if name else "in_proj_weight"
            if key in skipped:
                facts.append(LayerFacts(key, kind, [], skipped[key], None))
                listed.add(key)
    for name, why in skipped.items():  # anything the rule named that the walk did not meet
        if name not in listed:
            facts.append(LayerFacts(name, "Linear", [], why, None))
    return facts


def _rows(workload: UserWorkload, watches: dict[str, _Watch]) -> tuple[int, str]:
    """A step's tokens: the workload's token count when it knows one (token-id inputs),
    else the most rows any linear layer was called with in one call."""
    if workload.tokens_per_step:
        return int(workload.tokens_per_step), "the tokens of the first batch"
    most = max((m for w in watches.values() for m, _, _ in w.shapes), default=0)
    return most, "the most rows a linear layer took in a call"
