"""Sampled steps' numerics summed per module, and the verdicts a lecturer can read out.

The CLI (``ampscope numerics``), the record reader and the Numerics view share this: the
same shares, the same sentences. No torch here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ampscope.core import events as ev
from ampscope.core.numerics import FP8_KEYS, LIMITS, FirstNonfinite, PassTotals
from ampscope.core.text import visible

PASS_WORDS = {"activation": "outputs", "gradient": "gradients"}
NOTABLE = 0.01  # a share below this is not worth a sentence
KEEP_EVENTS = 240  # sampled steps a view keeps for its heatmap (the summary keeps them all)


@dataclass
class ModuleTotals:
    name: str
    kind: str
    activation: PassTotals = field(default_factory=PassTotals)
    gradient: PassTotals = field(default_factory=PassTotals)

    def side(self, which: str) -> PassTotals:
        return self.activation if which == "activation" else self.gradient


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
        for m in event.modules:
            totals = self.modules.setdefault(m.name, ModuleTotals(m.name, m.kind))
            if m.activation is not None:
                totals.activation.add(m.activation)
            if m.gradient is not None:
                totals.gradient.add(m.gradient)

    def never_ran(self) -> dict[str, str]:
        """The measured modules whose forward never ran in a sampled step, with why."""
        return {n: why for n, why in self.idle.items() if n not in self.modules}

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
            "modules_measured": len(self.modules),
            "modules_never_ran": self.never_ran(),
            "modules": [
                {
                    "name": m.name,
                    "kind": m.kind,
                    "activation": m.activation.to_json() if m.activation.steps else None,
                    "gradient": m.gradient.to_json() if m.gradient.steps else None,
                }
                for m in self.modules.values()
            ],
            "first_nonfinite": (
                {"step": first.step, "module": first.module, "pass": first.pass_} if first else None
            ),
            "verdicts": verdicts(self),
        }


def _worst(summary: NumericsSummary, key: str, which: int) -> tuple[ModuleTotals, str, float]:
    """The module and pass losing the largest share to ``key`` (0 overflow, 1 underflow, 2
    underflow after amax scaling)."""
    best: tuple[ModuleTotals, str, float] | None = None
    for m in summary.modules.values():
        for side in ("activation", "gradient"):
            share = m.side(side).share(key, which)
            if best is None or share > best[2]:
                best = (m, side, share)
    assert best is not None
    return best


def _holds(summary: NumericsSummary, key: str, m: ModuleTotals, side: str) -> bool:
    return m.side(side).share(key, 0) == 0 and m.side(side).share(key, 1) < NOTABLE


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
    beyond fp16's 65504; amp-fp16 will skip every step. bf16 holds it."."""
    if not summary.modules:
        return f"{key}: nothing measured."
    said = [s for s in (_overflow(summary, key), _underflow(summary, key)) if s]
    if said:
        return f"{key}: " + " ".join(said)
    lim = LIMITS[key]
    amax = max((m.side(s).amax or 0.0) for m in summary.modules.values() for s in PASS_WORDS)
    return (
        f"{key}: every layer fits (largest magnitude {magnitude(amax)}, "
        f"limit {limit(lim.largest)})."
    )


def _overflow(summary: NumericsSummary, key: str) -> str | None:
    m, side, share = _worst(summary, key, 0)
    if share == 0:
        return None
    totals = m.side(side)
    out = (
        f"{visible(m.name, 120)}'s {PASS_WORDS[side]} reach {magnitude(totals.amax)}, "
        f"beyond {key}'s {limit(LIMITS[key].largest)}"
    )
    if key == "fp16":
        every = totals.overflow_steps.get(key, 0) >= totals.steps
        out += "; amp-fp16 will skip every step" if every else "; amp-fp16 will skip steps"
        if _holds(summary, "bf16", m, side):
            out += ". bf16 holds it"
    elif key in FP8_KEYS:
        scaled = _pct(totals.share(key, 2))
        out += f"; scaled by their amax (tensorwise fp8) they fit, and {scaled} round to 0"
    return out + "."


def _underflow(summary: NumericsSummary, key: str) -> str | None:
    m, side, share = _worst(summary, key, 1)
    if share < NOTABLE:
        return None
    totals = m.side(side)
    out = (
        f"{_pct(share)} of {visible(m.name, 120)}'s {PASS_WORDS[side]} round to zero "
        f"(at or below half of {key}'s smallest, {magnitude(LIMITS[key].smallest)})"
    )
    if key == "fp16" and side == "gradient":
        out += (
            "; a larger loss scale lifts them"
            if summary.loss_scale
            else "; a loss scale lifts them"
        )
    if key == "fp16" and _holds(summary, "bf16", m, side):
        out += ". bf16 holds them"
    if key in FP8_KEYS:
        out += f"; scaled by their amax (tensorwise fp8), {_pct(totals.share(key, 2))} do"
    return out + "."


def verdicts(summary: NumericsSummary) -> list[str]:
    out = [verdict(summary, key) for key in LIMITS]
    first = summary.first_nonfinite
    if first is not None:
        words = "outputs" if first.pass_ == "forward" else "gradients"
        out.insert(
            0,
            f"inf/NaN first appears in {visible(first.module, 120)}'s {words} at step "
            f"{first.step}, in the format the run computes in: the shares below count the "
            "finite values only.",
        )
    return out
