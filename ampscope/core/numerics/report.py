"""Sampled steps' numerics summed per module, and the verdicts a lecturer can read out.

The CLI (``ampscope numerics``), the record reader and the Numerics view share this: the
same shares, the same sentences. No torch here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ampscope.core import events as ev
from ampscope.core.numerics import (
    DTYPE_LABELS,
    FP8_KEYS,
    LIMITS,
    FirstNonfinite,
    PassTotals,
    group_label,
    overflows_in,
    pattern,
)
from ampscope.core.numerics.event import INPUTS, in_model
from ampscope.core.text import visible

PASS_WORDS = {"activation": "outputs", "gradient": "gradients"}
NOTABLE = 0.01  # an underflow share below this is not worth a sentence
ALSO = 3  # modules a verdict names after the worst one, then "and N more"
KEEP_EVENTS = 240  # sampled steps a view keeps for its heatmap (the summary keeps them all)


WEIGHT = "weight"  # a parameter's gradient
WORDS = {**PASS_WORDS, WEIGHT: "gradient"}  # "out.bias's gradient"


@dataclass
class ModuleTotals:
    name: str
    kind: str
    activation: PassTotals = field(default_factory=PassTotals)
    gradient: PassTotals = field(default_factory=PassTotals)
    parameters: dict[str, PassTotals] = field(default_factory=dict)  # their gradients, by name
    order: int | None = None  # its place in model.named_modules() order (None: older records)

    def side(self, which: str) -> PassTotals:
        return self.activation if which == "activation" else self.gradient

    @property
    def measured(self) -> bool:
        """Whether it is a layer that was measured (not a module with parameters alone)."""
        return bool(self.activation.steps or self.gradient.steps)

    def parameter_name(self, parameter: str) -> str:
        return f"{self.name}.{parameter}" if self.name else parameter


@dataclass(frozen=True)
class Measured:
    """One measured tensor over the run: a module's outputs or their gradients, or one of its
    parameters' gradient (``side`` WEIGHT, ``name`` the parameter's: ``out.bias``)."""

    name: str
    side: str
    totals: PassTotals

    @property
    def words(self) -> str:
        return f"{self.name}'s {WORDS[self.side]}"


@dataclass
class NumericsSummary:
    """Every ``numerics`` event of a run, folded: per module, and the first non-finite."""

    modules: dict[str, ModuleTotals] = field(default_factory=dict)
    steps: list[int] = field(default_factory=list)
    first_nonfinite: FirstNonfinite | None = None
    loss_scale: float | None = None
    modules_total: int = 0
    idle: dict[str, str] = field(default_factory=dict)  # hooked in every sampled step, never ran
    recent: deque[ev.NumericsEvent] = field(default_factory=lambda: deque(maxlen=KEEP_EVENTS))

    def add(self, event: ev.NumericsEvent) -> None:
        self.recent.append(event)
        self.steps.append(event.step)
        self.loss_scale = event.loss_scale
        self.modules_total = max(self.modules_total, event.modules_total)
        idle = event.modules_idle
        if len(self.steps) > 1:  # a module that ran in any sampled step was measured
            idle = {n: why for n, why in self.idle.items() if n in event.modules_idle}
        self.idle = idle
        first = event.first_nonfinite  # the earliest step's: a rerun step may come in late
        if first is not None and (
            self.first_nonfinite is None or first.step < self.first_nonfinite.step
        ):
            self.first_nonfinite = first
        arrived = False
        for m in event.modules:
            totals = self.modules.get(m.name)
            if totals is None:
                totals = self.modules[m.name] = ModuleTotals(m.name, m.kind, order=m.order)
                arrived = True
            if m.activation is not None:
                totals.activation.add(m.activation)
            if m.gradient is not None:
                totals.gradient.add(m.gradient)
            for name, gradient in m.parameters.items():
                totals.parameters.setdefault(name, PassTotals()).add(gradient)
        if arrived:  # in the model's order, whatever step a module first ran at
            self.modules = dict(sorted(self.modules.items(), key=lambda kv: in_model(kv[1].order)))

    def measured(self) -> list[Measured]:
        """Every measured tensor, in the model's order: each module's outputs, their
        gradients, then its parameters' gradients."""
        out = []
        for m in self.modules.values():
            out += [Measured(m.name, side, m.side(side)) for side in PASS_WORDS]
            out += [Measured(m.parameter_name(p), WEIGHT, t) for p, t in m.parameters.items()]
        return [f for f in out if f.totals.steps]

    def layers(self) -> int:
        """The layers measured: modules with outputs (not those with parameters alone)."""
        return sum(m.measured for m in self.modules.values())

    def never_ran(self) -> dict[str, str]:
        """The measured modules whose forward never ran in a sampled step, with why."""
        ran = {n for n, m in self.modules.items() if m.measured}
        return {n: why for n, why in self.idle.items() if n not in ran}

    def not_measured_line(self) -> str:
        """'3 never ran: a, b and 1 more (why)', or '' when every hooked module ran."""
        idle = self.never_ran()
        if not idle:
            return ""
        by_reason: dict[str, list[str]] = {}
        for name, why in idle.items():
            by_reason.setdefault(why, []).append(name)
        parts = []
        for why, names in by_reason.items():
            more = f" and {len(names) - 2} more" if len(names) > 2 else ""
            parts.append(f"{', '.join(names[:2])}{more} ({why})")
        return f"{len(idle)} never ran: " + "; ".join(parts)

    def to_json(self, preset: str) -> dict[str, object]:
        first = self.first_nonfinite
        return {
            "preset": preset,
            "steps_sampled": len(self.steps),
            "loss_scale": self.loss_scale,
            "modules_total": self.modules_total,
            "modules_measured": self.layers(),
            "modules_never_ran": self.never_ran(),
            "modules": [
                {
                    "name": m.name,
                    "kind": m.kind,
                    "activation": m.activation.to_json() if m.activation.steps else None,
                    "gradient": m.gradient.to_json() if m.gradient.steps else None,
                    "parameters": {p: t.to_json() for p, t in m.parameters.items() if t.steps},
                }
                for m in self.modules.values()
            ],
            "first_nonfinite": first_json(first) if first else None,
            "verdicts": verdicts(self),
        }


def _ranked(
    summary: NumericsSummary, share_of: Callable[[PassTotals], float], at_least: float
) -> list[tuple[Measured, float]]:
    """Every measured tensor whose ``share_of`` is ``at_least`` (above 0), largest first, the
    model's order among equals."""
    found = [(f, share_of(f.totals)) for f in summary.measured()]
    kept = [f for f in found if f[1] > 0 and f[1] >= at_least]
    return sorted(kept, key=lambda f: -f[1])


def _also(ranked: list[tuple[Measured, float]], what: str) -> str:
    """The tensors after the worst that cross the same line, up to ``ALSO`` named, then "and N
    more"; the members of a repeated block as one (``blocks.1-11.attn.proj``), its worst share."""
    groups: dict[tuple[str, str], list[tuple[Measured, float]]] = {}
    for found in ranked[1:]:  # largest first: each group's first member is its worst
        groups.setdefault((pattern(found[0].name), found[0].side), []).append(found)
    named = []
    for members in groups.values():
        label = group_label([f.name for f, _ in members])
        words = WORDS[members[0][0].side]
        named.append(f"{visible(label, 120)}'s {words} ({_pct(members[0][1])})")
    if not named:
        return ""
    shown = named[:ALSO]
    if len(named) > ALSO:
        shown.append(f"{len(named) - ALSO} more")
    listed = shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]
    return f" Also {what}: {listed}."


def _holds(t: PassTotals, key: str) -> bool:
    """Whether ``key`` holds this tensor: none beyond it, few lost to zero, and no inf/NaN
    whose value is unknown to it."""
    return t.share(key, 0) == 0 and t.share(key, 1) < NOTABLE and not t.hidden.get(key)


def magnitude(x: float | None) -> str:
    """7.8e4, 0.5, 6e-08 -> 6.0e-8: short enough to read out."""
    if x is None:
        return "-"
    if x == 0 or 0.01 <= abs(x) < 1000:
        return f"{x:.3g}"
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def limit(x: float) -> str:
    """A format's largest finite value as its datasheet writes it: 65504, 448, 3.4e38."""
    return f"{x:g}" if x < 1e6 else magnitude(x)


def _pct(share: float) -> str:
    if share == 0:
        return "none"
    return f"{share:.0%}" if share >= 0.01 else f"{share:.2%}"


def verdict(summary: NumericsSummary, key: str) -> str:
    """One or two sentences for one format, e.g. "fp16: trunk.boost's outputs reach 7.8e4,
    beyond fp16's 65504; amp-fp16 will skip every step. bf16 holds it."; "every layer fits"
    only when nothing overflowed, inf and NaN included."""
    if not summary.modules:
        return f"{key}: nothing measured."
    spread = _beyond_every_format(summary)
    over = _overflow(summary, key, finite_only=spread)
    said = [s for s in (over, _underflow(summary, key), _unknown(summary, key)) if s]
    lim = LIMITS[key]
    amax = max((f.totals.amax or 0.0) for f in summary.measured())
    fits = f"(largest magnitude {magnitude(amax)}, limit {limit(lim.largest)})"
    if spread:  # the inf/NaN say nothing of this format: what its finite values do
        lead = "the inf/NaN after the first one above are its spread, beyond every format"
        if over is None:
            lead += f"; the finite values fit {fits}"
        return f"{key}: {lead}." + "".join(f" {s}" for s in said)
    if said:
        return f"{key}: " + " ".join(said)
    return f"{key}: every layer fits {fits}."


def _beyond_every_format(summary: NumericsSummary) -> bool:
    """Whether the first inf/NaN was beyond every format: computed in fp32 (or wider), or in
    the batch itself. The inf/NaN after it are its spread (an upstream inf makes every later
    gradient inf), not an overflow of a narrower format: a verdict led by "100% of the first
    layer's weight gradient overflow fp16" blamed fp16 for what fp32 computed."""
    first = summary.first_nonfinite
    if first is None:
        return False
    return first.source == INPUTS or _first_dtype(summary) in ("float32", "float64")


def _first_dtype(summary: NumericsSummary) -> str | None:
    """The format the first inf/NaN was computed in; an older record that does not say: the
    format of the module's tensor that held it."""
    first = summary.first_nonfinite
    if first is None:
        return None
    if first.dtype is not None:
        return first.dtype
    side = "activation" if first.pass_ == "forward" else "gradient"
    held = summary.modules.get(first.module)
    return held.side(side).dtype if held is not None else None


def _computed_in(t: PassTotals) -> str:
    # a format's name as a record gives it: shown, never obeyed
    return DTYPE_LABELS.get(
        t.dtype or "", visible(t.dtype or "", 40) or "the format the run computes in"
    )


def _overflow(summary: NumericsSummary, key: str, finite_only: bool = False) -> str | None:
    """The worst overflow of ``key``; ``finite_only``: only finite values beyond its range
    count (the inf/NaN are an earlier inf's spread)."""
    ranked = _ranked(summary, lambda t: t.share(key, 0), 0.0)
    if finite_only:
        at = LIMITS[key].overflow_at
        ranked = [(f, s) for f, s in ranked if f.totals.amax is not None and f.totals.amax >= at]
    if not ranked:
        return None
    worst, share = ranked[0]
    totals = worst.totals
    name, words = visible(worst.name, 120), WORDS[worst.side]
    beyond = totals.amax is not None and totals.amax >= LIMITS[key].overflow_at
    lost = totals.nonfinite - totals.hidden.get(key, 0)  # inf/NaN counted as key's overflow
    if beyond:  # finite values measured beyond it: how far is known
        reach = "reaches" if worst.side == WEIGHT else "reach"  # one gradient, many outputs
        out = (
            f"{name}'s {words} {reach} {magnitude(totals.amax)}, beyond {key}'s "
            f"{limit(LIMITS[key].largest)}"
        )
        if lost:
            out += f", and {_pct(lost / totals.numel)} are inf/NaN, computed in "
            out += _computed_in(totals)
    else:  # inf/NaN where they were computed: the format itself overflowed
        out = (
            f"{_pct(share)} of {name}'s {words} overflow {key}: inf/NaN, computed in "
            f"{_computed_in(totals)}"
        )
    if key == "fp16" and beyond and _held_wider_without_skips(summary, totals):
        out += (
            f"; in this loss-scaled run autocast held it in {_computed_in(totals)} and no "
            "inf/NaN came, so amp-fp16 skipped no step for it"
        )
    elif key == "fp16" and beyond:
        every = totals.overflow_steps.get(key, 0) >= totals.steps
        out += "; amp-fp16 will skip every step" if every else "; amp-fp16 will skip steps"
    if key == "fp16" and _holds(totals, "bf16"):
        out += ". bf16 holds it"
    elif key == "fp16" and totals.hidden.get("bf16"):
        out += ". Whether bf16 holds them, a run in fp32 shows ('ampscope numerics fp32')"
    elif key in FP8_KEYS and not totals.nonfinite:
        scaled = _pct(totals.share(key, 2))
        out += f"; scaled by their amax (tensorwise fp8) they fit, and {scaled} round to 0"
    return out + "." + _also(ranked, f"beyond {key}")


def _held_wider_without_skips(summary: NumericsSummary, totals: PassTotals) -> bool:
    """Whether a tensor beyond fp16's range was measured under a GradScaler (amp-fp16) in a
    wider format than fp16 (an embedding's or a norm's gradient, which autocast keeps in fp32)
    in a run that met no inf/NaN at all: that run itself shows it cost no skipped step, so
    "amp-fp16 will skip steps" would contradict the run it was measured in."""
    wider = overflows_in(totals.dtype, "fp16") and totals.dtype != "float16"
    return summary.loss_scale is not None and summary.first_nonfinite is None and wider


def _underflow(summary: NumericsSummary, key: str) -> str | None:
    ranked = _ranked(summary, lambda t: t.share(key, 1), NOTABLE)
    if not ranked:
        return None
    worst, share = ranked[0]
    totals = worst.totals
    out = (
        f"{_pct(share)} of {visible(worst.name, 120)}'s {WORDS[worst.side]} round to zero "
        f"(at or below {magnitude(LIMITS[key].smallest / 2)}, half of {key}'s smallest "
        f"subnormal {magnitude(LIMITS[key].smallest)})"
    )
    if key == "fp16" and worst.side != "activation":
        out += (
            "; a larger loss scale lifts them"
            if summary.loss_scale
            else "; a loss scale lifts them"
        )
    if key == "fp16" and _holds(totals, "bf16"):
        out += ". bf16 holds them"
    if key in FP8_KEYS:
        out += f"; scaled by their amax (tensorwise fp8), {_pct(totals.share(key, 2))} do"
    return out + "." + _also(ranked, "rounding to zero")


def _unknown(summary: NumericsSummary, key: str) -> str | None:
    """inf/NaN values not counted as ``key``'s overflow: computed in a narrower format (their
    true size was lost there) or, in an older record, in a format it does not name."""
    ranked = _ranked(summary, lambda t: t.hidden.get(key, 0) / t.numel if t.numel else 0.0, 0.0)
    if not ranked:
        return None
    worst, share = ranked[0]
    return (
        f"{_pct(share)} of {visible(worst.name, 120)}'s {WORDS[worst.side]} are inf/NaN, "
        f"computed in {_computed_in(worst.totals)}: whether {key} holds them, a run in fp32 "
        "shows ('ampscope numerics fp32')." + _also(ranked, "inf/NaN")
    )


def first_json(first: FirstNonfinite) -> dict[str, object]:
    """The first inf/NaN as ``ampscope numerics --json`` prints it."""
    out: dict[str, object] = {"step": first.step, "module": first.module, "pass": first.pass_}
    out["source"] = first.source
    if first.parameter is not None:
        out["parameter"] = first.parameter
    if first.received_by is not None:
        out["received_by"] = first.received_by
    out["words"] = first.place()
    return out


def first_words(summary: NumericsSummary) -> str | None:
    """ "inf/NaN first appears in X at step N: an overflow of fp16, and of every narrower
    format." (the batch's own inf/NaN is no overflow; one computed in fp32 may be a 0/0 as
    well as an overflow); None when none was found."""
    first = summary.first_nonfinite
    if first is None:
        return None
    dtype = _first_dtype(summary)
    said = f"inf/NaN first appears in {visible(first.place(), 400)} at step {first.step}"
    if first.source == INPUTS:
        return said + ": no layer made them; the data or the code that builds the batch did."
    where = DTYPE_LABELS.get(
        dtype or "", visible(dtype or "", 40) or "the format it is computed in"
    )
    if dtype in ("float32", "float64"):  # no wider format to overflow into: NaN is as likely
        return said + (
            f": computed in {where}, so beyond {where}'s range or no number at all (0/0, inf - inf, "
            "the log of a negative); no narrower format holds it either."
        )
    return said + f": an overflow of {where}, and of every narrower format."


def verdicts(summary: NumericsSummary) -> list[str]:
    out = [verdict(summary, key) for key in LIMITS]
    first = first_words(summary)
    if first is not None:
        out.insert(0, first)
    return out
