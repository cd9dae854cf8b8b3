"""Which modules leave fp16's range: fp32 steps watched, each followed by a check in amp-fp16.

Through the fp32 training steps (``fp32_steps``) a forward hook on every module (containers
too) measures its floating-point inputs and outputs with the numerics' own counters
(``engine.numerics.measure``: amax, what overflows fp16, what rounds to zero), summed over a
step's calls; each step's figures are merged with the steps before, worst first
(``core.plan.steps``). ``core.plan.fp16`` decides from them. After each step's backward, before
its update, a check runs that step's batch forward under fp16 autocast on a copy of the model
with the modules chosen so far kept in fp32 (``engine.step.fp32_modules``): where an output
turns inf/NaN although its inputs and every submodule's output stayed finite, that module's own
code overflowed (a functional op); it is kept too and the check runs again, up to ``CHECKS``
times a step.
"""

from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ampscope.core.plan.fp16 import ModuleFacts, leaves_range
from ampscope.core.plan.report import CastFigures
from ampscope.core.plan.steps import STEPS, worst
from ampscope.engine.numerics.hooks import tensors_in
from ampscope.engine.numerics.measure import (
    AMAX,
    CONSTANTS,
    NONFINITE,
    NONZERO,
    NUMEL,
    OVER,
    UNDER,
    measure,
    row_of,
)
from ampscope.engine.plan.fp32_steps import fp32_steps
from ampscope.engine.step.fp32_modules import keep_in_fp32
from ampscope.engine.step.module_calls import never_runs_as_module
from ampscope.engine.workloads.user import UserWorkload

CHECKS = 8  # checks a step at most: each may find one more module whose own code overflows


@dataclass
class _Sums:
    numel: float = 0.0
    nonfinite: float = 0.0
    nonzero: float = 0.0
    over: float = 0.0
    under: float = 0.0
    amax: float = 0.0
    err2: float = 0.0
    ref2: float = 0.0

    def add(self, t: torch.Tensor, constants: torch.Tensor) -> None:
        with torch.no_grad():
            row = row_of(measure(t, constants).tolist())
            self.numel += row[NUMEL]
            self.nonfinite += row[NONFINITE]
            self.nonzero += row[NONZERO]
            self.over += row[OVER["fp16"]]
            self.under += row[UNDER["fp16"]]
            self.amax = max(self.amax, row[AMAX])
            x = t.detach().float()
            y = x.to(torch.float16).float()
            kept = torch.isfinite(y) & torch.isfinite(x)
            self.err2 += float((torch.where(kept, y - x, 0.0).double() ** 2).sum())
            self.ref2 += float((torch.where(kept, x, 0.0).double() ** 2).sum())

    def figures(self) -> CastFigures:
        return CastFigures(
            underflow=self.under / self.nonzero if self.nonzero else 0.0,
            rel_error=math.sqrt(self.err2 / self.ref2) if self.ref2 > 0 else 0.0,
            nonfinite=int(self.nonfinite),
            format="fp16",
            scaling="none",
            overflow=self.over / self.numel if self.numel else 0.0,
            amax=self.amax,
        )


def _worst(before: CastFigures | None, step: _Sums | None) -> CastFigures | None:
    if step is None:
        return before
    return step.figures() if before is None else worst(before, step.figures())


@dataclass
class _Seen:
    """One module over the steps: this step's sums, the steps' figures, its calls."""

    input: _Sums | None = None
    output: _Sums | None = None
    inputs: CastFigures | None = None
    outputs: CastFigures | None = None
    calls: int = 0

    def end_step(self) -> None:
        """Fold this step's sums into the steps' figures; the next step starts afresh."""
        self.inputs = _worst(self.inputs, self.input)
        self.outputs = _worst(self.outputs, self.output)
        self.input = self.output = None


@dataclass
class _Watching:
    """What the hooks add to; ``on`` is off while a check runs (a copy of the model carries
    the hooks too)."""

    seen: dict[str, _Seen]
    constants: torch.Tensor
    on: bool = True


@dataclass
class Fp16Capture:
    modules: list[ModuleFacts]
    root_inf: bool  # under amp-fp16, with every chosen module kept, the forward still overflows
    loss: float  # the first step's
    steps: int  # fp32 steps observed


def capture_fp16(workload: UserWorkload, steps: int = STEPS) -> Fp16Capture:
    """The fp32 steps' figures per module, and the checks' findings."""
    model = workload.model
    named = list(model.named_modules())
    constants = torch.tensor(CONSTANTS, dtype=torch.float32, device=_device(model))
    watching = _Watching({name: _Seen() for name, _ in named}, constants)
    handles = [
        module.register_forward_hook(_fp32_hook(name, watching), with_kwargs=True)
        for name, module in named
    ]
    own_inf: set[str] = set()
    root_inf = False
    losses = []
    try:
        for step in fp32_steps(workload, steps):
            losses.append(step.loss)
            for seen in watching.seen.values():
                seen.end_step()
            facts = _facts(model, named, watching.seen, own_inf)
            watching.on = False
            root_inf = _check(workload, facts, step.batch) or root_inf
            watching.on = True
            own_inf |= {f.name for f in facts if f.own_inf}
    finally:
        for handle in handles:
            handle.remove()
    facts = _facts(model, named, watching.seen, own_inf)
    return Fp16Capture([f for f in facts if f.name], root_inf, losses[0], steps)


def _facts(
    model: nn.Module,
    named: list[tuple[str, nn.Module]],
    seen: dict[str, _Seen],
    own_inf: set[str],
) -> list[ModuleFacts]:
    return [
        ModuleFacts(
            name=name,
            kind=type(module).__name__,
            leaf=not any(module.children()),
            input=seen[name].inputs,
            output=seen[name].outputs,
            own_inf=name in own_inf,
            calls=seen[name].calls,
            why_not=never_runs_as_module(model, name) if name and not seen[name].calls else None,
        )
        for name, module in named
    ]


def chosen(facts: list[ModuleFacts]) -> list[str]:
    """The modules the plan keeps in fp32: leaves that leave the range, and containers whose
    own code does."""
    return [
        f.name
        for f in facts
        if f.name and (f.own_inf or (f.leaf and (leaves_range(f.input) or leaves_range(f.output))))
    ]


def _fp32_hook(name: str, watching: _Watching) -> Any:
    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        if not watching.on:
            return
        seen = watching.seen[name]
        seen.calls += 1
        for t in [*tensors_in(list(args)), *tensors_in(kwargs)]:
            seen.input = seen.input or _Sums()
            seen.input.add(t, watching.constants)
        for t in tensors_in(out):
            seen.output = seen.output or _Sums()
            seen.output.add(t, watching.constants)

    return hook


def _check(workload: UserWorkload, facts: list[ModuleFacts], batch: tuple[Any, Any]) -> bool:
    """Run ``batch`` forward under fp16 autocast with the chosen modules kept in fp32; mark
    each module whose own code turns finite inputs into inf/NaN. True when the model's own
    forward (the root) still does."""
    by_name = {f.name: f for f in facts}
    device = _device(workload.model)
    for _ in range(CHECKS):
        try:
            model = copy.deepcopy(workload.model)
        except Exception:  # noqa: BLE001 - a model that cannot be copied: no check step
            return False
        keep_in_fp32(model, chosen(facts), device.type)
        culprit = _first_own_inf(model, workload, batch[0], device)
        if culprit is None:
            return False
        if culprit == "":
            return True
        if by_name[culprit].own_inf:  # kept already and still overflowing: nothing more to do
            return False
        by_name[culprit].own_inf = True
    return False


def _first_own_inf(
    model: nn.Module, workload: UserWorkload, inputs: Any, device: torch.device
) -> str | None:
    """The first module (in the order outputs were computed) whose own code turned finite
    inputs into an inf/NaN output: its inputs finite, its output not, and no submodule that
    did the same; None when none."""
    seen: dict[str, tuple[bool, bool]] = {}  # name -> (inputs finite, output finite)
    order: list[str] = []
    children = {
        name: [f"{name}.{c}" if name else c for c, _ in m.named_children()]
        for name, m in model.named_modules()
    }

    def hook(name: str) -> Any:
        def record(
            module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
        ) -> None:
            given = [*tensors_in(list(args)), *tensors_in(kwargs)]
            ins = all(bool(torch.isfinite(t).all()) for t in given)
            outs = all(bool(torch.isfinite(t).all()) for t in tensors_in(out))
            seen[name] = (ins, outs)
            order.append(name)

        return record

    def originates(name: str) -> bool:
        ins, outs = seen.get(name, (True, True))
        return ins and not outs

    handles = [m.register_forward_hook(hook(n), with_kwargs=True) for n, m in model.named_modules()]
    try:
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.float16):
            workload.forward(model, inputs)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # noqa: BLE001 - a model that cannot run in fp16 here (whatever it
        # raises, an asyncio.CancelledError too): no finding
        return None
    finally:
        for handle in handles:
            handle.remove()
    for name in order:
        if originates(name) and not any(originates(c) for c in children.get(name, [])):
            return name
    return None


def _device(model: nn.Module) -> torch.device:
    with contextlib.suppress(StopIteration):
        return next(model.parameters()).device
    return torch.device("cpu")
