"""Rows measured on the device, as the event's modules: every tensor of a module and pass
(tuple outputs, a module called twice in a step) summed into one entry, each parameter's
gradient beside them; and the first tensor of the step that held an inf or NaN."""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

from ampscope.core.numerics import (
    DTYPE_LARGEST,
    FORMATS,
    FP8_KEYS,
    FirstNonfinite,
    FormatShare,
    ModuleNumerics,
    TensorNumerics,
    overflows_in,
)
from ampscope.core.numerics.event import INPUTS, OUTPUT, OWN, PARAMETER
from ampscope.engine.numerics.measure import (
    AMAX,
    MIN_NONZERO,
    NONFINITE,
    NUMEL,
    OVER,
    SCALED,
    UNDER,
)

FORWARD, BACKWARD = "forward", "backward"
WEIGHT = "weight"  # a parameter's gradient, measured whole
CHECK = "check"  # a parameter's gradient, only checked for inf/NaN (beyond the cap)


class Inputs(NamedTuple):
    """Where a call's inputs' inf/NaN would show: measured rows (a layer's output they are),
    checks (their smallest and largest values), and their widest format."""

    rows: tuple[int, ...] = ()
    checks: tuple[int, ...] = ()
    dtype: str = ""


class Slot(NamedTuple):
    """What one measured tensor was, in the order the step computed them."""

    owner: int  # the module's index among the event's modules
    which: str  # FORWARD, BACKWARD, WEIGHT or CHECK
    parameter: str = ""  # WEIGHT, CHECK: the parameter's name in the module
    row: int = -1  # its row among the measured rows (FORWARD, BACKWARD, WEIGHT)
    check: int = -1  # CHECK: its largest magnitude's index among the checks
    dtype: str = ""  # the format the tensor was in (torch's name)
    inputs: Inputs = Inputs()  # FORWARD: the module's inputs
    around: tuple[int, ...] = ()  # FORWARD: the non-leaf calls running around it, outermost first


class Call(NamedTuple):
    """A non-leaf module's forward call: its name and its inputs."""

    name: str
    inputs: Inputs


def narrowest(dtypes: list[str]) -> str:
    return min(dtypes, key=lambda d: DTYPE_LARGEST.get(d, math.inf))


@functools.cache
def _overflowed(dtype: str) -> tuple[str, ...]:
    """The formats an inf or NaN computed in ``dtype`` is an overflow of."""
    return tuple(key for key in FORMATS if overflows_in(dtype, key))


def _merge(rows: list[list[float]], dtypes: list[str]) -> TensorNumerics:
    """One module's pass: ``rows`` (its tensors, computed in ``dtypes``) summed. A tensor's
    inf and NaN values are the overflow of each format no wider than its own."""
    total = rows[0] if len(rows) == 1 else [sum(column) for column in zip(*rows, strict=True)]
    numel = max(total[NUMEL], 1.0)
    amax = max(r[AMAX] for r in rows)
    low = min(r[MIN_NONZERO] for r in rows)
    lost = dict.fromkeys(FORMATS, 0.0)
    for r, d in zip(rows, dtypes, strict=True):
        for key in _overflowed(d):
            lost[key] += r[NONFINITE]
    formats = {
        key: FormatShare(
            overflow=(total[OVER[key]] + lost[key]) / numel,
            underflow=total[UNDER[key]] / numel,
            scaled_underflow=total[SCALED[key]] / numel if key in FP8_KEYS else None,
        )
        for key in FORMATS
    }
    return TensorNumerics(
        numel=int(total[NUMEL]),
        amax=amax if total[NONFINITE] < total[NUMEL] else None,
        min_nonzero=low if math.isfinite(low) else None,
        nonfinite=int(total[NONFINITE]),
        formats=formats,
        dtype=max(dtypes, key=lambda d: DTYPE_LARGEST.get(d, 0.0)),
    )


def module_numerics(
    step: int,
    owners: list[tuple[str, str, list[str]]],
    slots: list[Slot],
    rows: list[list[float]],
    checks: list[tuple[float, float]],
    calls: list[Call],
) -> tuple[list[ModuleNumerics], FirstNonfinite | None]:
    """The modules measured this step, in the model's order, and the first tensor that held
    an inf or NaN, in the order the step computed them.

    ``owners`` names each module of the event (name, class, its parameters' names, in their
    order); ``slots`` say what each of
    ``rows`` (a module's output or output gradient, a parameter's gradient) and of the
    parameters' ``checks`` was. A parameter's gradient is computed in the narrowest format of
    its own and its module's outputs' (under autocast, a Linear's fp32 weight is cast to fp16,
    its gradient computed in fp16 and cast back)."""
    outputs: dict[int, list[str]] = {}
    for slot in slots:
        if slot.which == FORWARD:
            outputs.setdefault(slot.owner, []).append(slot.dtype)

    def computed_in(slot: Slot) -> str:
        if slot.which in (WEIGHT, CHECK):
            return narrowest([slot.dtype, *outputs.get(slot.owner, [])])
        return slot.dtype

    grouped: dict[tuple[int, str, str], list[tuple[list[float], str]]] = {}
    first = None
    for slot in slots:
        if slot.which == CHECK:
            if first is None and not all(map(math.isfinite, checks[slot.check])):
                first = _first(step, owners, slot, computed_in(slot), rows, checks, calls)
            continue
        row = rows[slot.row]
        grouped.setdefault((slot.owner, slot.which, slot.parameter), []).append(
            (row, computed_in(slot))
        )
        if first is None and row[NONFINITE] > 0:
            first = _first(step, owners, slot, computed_in(slot), rows, checks, calls)

    def merged(key: tuple[int, str, str]) -> TensorNumerics | None:
        found = grouped.get(key)
        return _merge([r for r, _ in found], [d for _, d in found]) if found else None

    out = []
    for index, (name, kind, own) in enumerate(owners):
        parameters = {p: t for p in own if (t := merged((index, WEIGHT, p))) is not None}
        activation, gradient = merged((index, FORWARD, "")), merged((index, BACKWARD, ""))
        if activation is None and gradient is None and not parameters:
            continue  # not called this step, and no gradient of its own
        out.append(
            ModuleNumerics(
                name=name,
                kind=kind,
                order=index,
                activation=activation,
                gradient=gradient,
                parameters=parameters,
            )
        )
    return out, first


def _spoilt(check: tuple[float, float]) -> bool:
    """Whether a tensor of these smallest and largest values held a NaN or a +inf. A -inf
    alone is what an attention mask holds by design (``nn.Transformer``'s causal mask),
    passed beside the values: no sign that they were spoilt."""
    lo, hi = check
    return math.isnan(lo) or math.isnan(hi) or hi == math.inf


def _held(inputs: Inputs, rows: list[list[float]], checks: list[tuple[float, float]]) -> bool:
    """Whether these inputs held an inf or NaN already (a measured layer's output: any)."""
    return any(rows[r][NONFINITE] > 0 for r in inputs.rows) or any(
        _spoilt(checks[c]) for c in inputs.checks
    )


def _first(
    step: int,
    owners: list[tuple[str, str, list[str]]],
    slot: Slot,
    dtype: str,
    rows: list[list[float]],
    checks: list[tuple[float, float]],
    calls: list[Call],
) -> FirstNonfinite:
    """Where the first inf/NaN was: ``slot``'s tensor; for a layer's output whose inputs held
    inf/NaN already, the innermost module running around it whose inputs did not (its own
    code computed it), or the model's inputs when every one's did."""
    name = owners[slot.owner][0]
    if slot.which in (WEIGHT, CHECK):
        return FirstNonfinite(
            step=step,
            module=name,
            pass_=BACKWARD,
            source=PARAMETER,
            parameter=slot.parameter,
            dtype=dtype,
        )
    if slot.which == FORWARD and _held(slot.inputs, rows, checks):
        computed = ("", INPUTS)  # no module running around it had finite inputs: the batch
        for call in reversed([calls[i] for i in slot.around]):
            if not _held(call.inputs, rows, checks):
                computed = (call.name, OWN)
                break
        return FirstNonfinite(
            step=step,
            module=computed[0],
            pass_=FORWARD,
            source=computed[1],
            received_by=name,
            dtype=slot.inputs.dtype,
        )
    return FirstNonfinite(step=step, module=name, pass_=slot.which, source=OUTPUT, dtype=dtype)
