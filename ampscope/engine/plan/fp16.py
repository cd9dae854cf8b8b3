"""Which modules leave fp16's range: one fp32 step watched, then a check step in amp-fp16.

The fp32 step puts a forward hook on every module (containers too) that measures its
floating-point inputs and outputs with the numerics' own counters (``engine.numerics.measure``:
amax, what overflows fp16, what rounds to zero), summed over its calls. ``core.plan.fp16``
decides from them. The check step then runs the same batch forward under fp16 autocast with
the modules chosen kept in fp32 (``engine.step.fp32_modules``): where an output turns inf/NaN
although its inputs and every submodule's output stayed finite, that module's own code
overflowed (a functional op); it is kept too and the check runs again, up to ``CHECKS`` times.
"""

from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ampscope.core.plan.fp16 import ModuleFacts, leaves_range
from ampscope.core.plan.report import CastFigures
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
from ampscope.engine.step.fp32_modules import keep_in_fp32
from ampscope.engine.workloads.user import UserWorkload

CHECKS = 8  # check steps at most: each may find one more module whose own code overflows


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


@dataclass
class _Seen:
    input: _Sums = field(default_factory=_Sums)
    output: _Sums = field(default_factory=_Sums)
    has_input: bool = False
    has_output: bool = False


@dataclass
class Fp16Capture:
    modules: list[ModuleFacts]
    root_inf: bool  # under amp-fp16, with every chosen module kept, the forward still overflows
    loss: float


def capture_fp16(workload: UserWorkload) -> Fp16Capture:
    """The fp32 step's figures per module, and the check steps' findings."""
    model = workload.model
    inputs, targets = workload.first_batch()
    named = list(model.named_modules())
    constants = torch.tensor(CONSTANTS, dtype=torch.float32, device=_device(model))
    seen = {name: _Seen() for name, _ in named}
    handles = [
        module.register_forward_hook(_fp32_hook(seen[name], constants), with_kwargs=True)
        for name, module in named
    ]
    try:
        loss = workload.loss(workload.forward(model, inputs), targets)
    finally:
        for handle in handles:
            handle.remove()
    facts = []
    for name, module in named:
        s = seen[name]
        facts.append(
            ModuleFacts(
                name=name,
                kind=type(module).__name__,
                leaf=not any(module.children()),
                input=s.input.figures() if s.has_input else None,
                output=s.output.figures() if s.has_output else None,
            )
        )
    root_inf = _check(workload, facts)
    return Fp16Capture([f for f in facts if f.name], root_inf, float(loss.detach()))


def chosen(facts: list[ModuleFacts]) -> list[str]:
    """The modules the plan keeps in fp32: leaves that leave the range, and containers whose
    own code does."""
    return [
        f.name
        for f in facts
        if f.name and (f.own_inf or (f.leaf and (leaves_range(f.input) or leaves_range(f.output))))
    ]


def _fp32_hook(seen: _Seen, constants: torch.Tensor) -> Any:
    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        for t in [*tensors_in(list(args)), *tensors_in(kwargs)]:
            seen.input.add(t, constants)
            seen.has_input = True
        for t in tensors_in(out):
            seen.output.add(t, constants)
            seen.has_output = True

    return hook


def _check(workload: UserWorkload, facts: list[ModuleFacts]) -> bool:
    """Run the batch forward under fp16 autocast with the chosen modules kept in fp32; mark
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
        culprit = _first_own_inf(model, workload, device)
        if culprit is None:
            return False
        if culprit == "":
            return True
        if by_name[culprit].own_inf:  # kept already and still overflowing: nothing more to do
            return False
        by_name[culprit].own_inf = True
    return False


def _first_own_inf(model: nn.Module, workload: UserWorkload, device: torch.device) -> str | None:
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
    inputs, _ = workload.first_batch()
    try:
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.float16):
            workload.forward(model, inputs)
    except Exception:  # noqa: BLE001 - a model that cannot run in fp16 here: no finding
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
