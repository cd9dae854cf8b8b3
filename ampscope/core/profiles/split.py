"""A profile's split of the step into classes of work (``summarize`` turns the engine's op times
into a ``ProfileEvent``), the rows and the headline shown for it, and the difference between
two profiles.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ampscope.core import events as ev
from ampscope.core.profiles.advice import RunFacts, advice
from ampscope.core.profiles.rules import CLASSES, OpTime, label
from ampscope.core.text import wrap
from ampscope.core.units import fmt_ms

TOP_OPS = 10


def summarize(
    ops: Iterable[OpTime],
    measured_us: float,
    *,
    step: int,
    steps: int,
    timing: str,
    idle_us: float = 0.0,
) -> ev.ProfileEvent:
    """The split of ``measured_us`` (the profiled steps' time) among the classes.

    Whatever the ops do not cover is ``idle`` on a GPU (``idle_us``, no kernel running) and
    ``other`` (Python between ops) on a CPU, so the shares sum to 1. Ops that overlap (kernels
    on several streams) can cover more than was measured: then they are scaled down together.
    """
    ops = list(ops)
    total = max(measured_us, 1e-9)
    by_class: dict[str, float] = defaultdict(float)
    by_dtype: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    by_op: dict[tuple[str, str, str | None], list[float]] = {}
    casts = 0.0
    for op in ops:
        by_class[op.cls] += op.self_us
        if op.cls in ("matmul", "conv") and op.dtype:
            by_dtype[op.cls][op.dtype] += op.self_us
        if op.cls == "elementwise" and op.cast:
            casts += op.self_us
        row = by_op.setdefault((op.name, op.cls, op.dtype), [0.0, 0])
        row[0] += op.self_us
        row[1] += op.calls
    busy, room = sum(by_class.values()), total - idle_us
    scale = room / busy if busy > room > 0 else 1.0  # overlapping kernels: scaled to fit
    shares = {cls: by_class.get(cls, 0.0) * scale / total for cls in CLASSES}
    rest = max(0.0, 1.0 - sum(shares.values()))  # no kernel running, or Python between ops
    shares["idle" if timing == "device" else "other"] += rest
    top = sorted(by_op.items(), key=lambda item: -item[1][0])[:TOP_OPS]
    return ev.ProfileEvent(
        step=step,
        steps=steps,
        step_ms=round(measured_us / 1000.0 / max(steps, 1), 4),
        timing=timing,  # type: ignore[arg-type]
        classes={cls: round(share, 5) for cls, share in shares.items()},
        dtypes={
            cls: {d: round(us * scale / total, 5) for d, us in kinds.items()}
            for cls, kinds in by_dtype.items()
        },
        casts=round(casts * scale / total, 5),
        top_ops=[
            ev.ProfileOp(
                name=name, kind=cls, share=round(us * scale / total, 5), calls=int(n), dtype=dt
            )
            for (name, cls, dt), (us, n) in top
        ],
    )


def casts_share(cls: str, profile: ev.ProfileEvent) -> float | None:
    """The step's share in casts between formats, for the elementwise class they count in
    (None where no format narrower than fp32 ran: copies there are plain copies)."""
    if cls == "elementwise" and profile.casts >= 0.01 and narrow_formats(profile):
        return profile.casts
    return None


CASTS_ROW = "  of which casts"
"""The casts' own row, under elementwise: a share of the step like every row, and part of
the elementwise row above it (``elementwise, casts 30%   49%`` read as two rival figures)."""


def split_rows(profile: ev.ProfileEvent) -> list[tuple[str, float, str]]:
    """The split as shown: (label, share of the step, class), casts under elementwise."""
    rows = []
    for cls, share in shown_classes(profile):
        rows.append((label(cls, profile), share, cls))
        casts = casts_share(cls, profile)
        if casts is not None:
            rows.append((CASTS_ROW, casts, cls))
    return rows


def narrow_formats(profile: ev.ProfileEvent) -> bool:
    """Whether a dense op ran in a format narrower than fp32 (bf16, fp16, fp8): only then are
    the copies among the elementwise ops casts between formats, not plain copies."""
    dense = [d for cls in ("matmul", "conv", "attention") for d in profile.dtypes.get(cls, {})]
    return any(d not in ("fp32", "tf32", "fp64") for d in dense)


def shown_classes(profile: ev.ProfileEvent, least: float = 0.005) -> list[tuple[str, float]]:
    """The classes worth a line, largest first (a class under half a percent is left out)."""
    rows = [(cls, share) for cls, share in profile.classes.items() if share >= least]
    return sorted(rows, key=lambda row: -row[1])


def headline(profile: ev.ProfileEvent, most: int = 3) -> str:
    """'matmul (bf16) 41 %, elementwise 22 %, idle (no kernel) 15 %': the largest classes."""
    top = shown_classes(profile)[:most]
    parts = []
    for cls, share in top:
        casts = casts_share(cls, profile)
        of_it = f" (casts {casts:.0%} of the step)" if casts is not None else ""
        parts.append(f"{label(cls, profile)} {share:.0%}{of_it}")
    return ", ".join(parts)


@dataclass
class ClassChange:
    cls: str
    before_ms: float
    after_ms: float

    @property
    def change(self) -> float | None:
        """The relative change of the time spent, None when nothing was spent before."""
        return None if self.before_ms <= 0 else self.after_ms / self.before_ms - 1.0


def diff(before: ev.ProfileEvent, after: ev.ProfileEvent) -> list[ClassChange]:
    """Per class, the milliseconds a step spends in it before and after, largest move first."""
    rows = [
        ClassChange(
            cls,
            before.classes.get(cls, 0.0) * before.step_ms,
            after.classes.get(cls, 0.0) * after.step_ms,
        )
        for cls in CLASSES
    ]
    moved = [r for r in rows if max(r.before_ms, r.after_ms) >= 0.01 * before.step_ms]
    return sorted(moved, key=lambda r: -abs(r.after_ms - r.before_ms))


def change_text(row: ClassChange, before: ev.ProfileEvent, after: ev.ProfileEvent) -> str:
    """'matmul \u221268 %' or 'elementwise +12 % (casts)': one class's move, as a line shows it."""
    change = row.change
    amount = "new" if change is None else f"{change:+.0%}".replace("%", " %")
    why = " (casts)" if row.cls == "elementwise" and after.casts > before.casts + 0.01 else ""
    return f"{CLASSES[row.cls]} {amount}{why}".replace("-", "\u2212")


def to_json(
    profile: ev.ProfileEvent,
    preset: str,
    facts: RunFacts | None = None,
    under_load: str | None = None,
) -> dict[str, Any]:
    """The object ``ampscope profile --json`` prints."""
    out: dict[str, Any] = {"preset": preset}
    out.update(ev.to_dict(profile))
    out.pop("type", None)
    out["advice"] = advice(profile, facts)
    out["under_load"] = under_load
    return out


def render(
    profile: ev.ProfileEvent,
    title: str,
    width: int = 80,
    facts: RunFacts | None = None,
    under_load: str | None = None,
) -> str:
    """The split, the top ops and the advice as plain text (``ampscope profile``), and
    ``under_load``'s line where other processes' work moved it."""
    whose = "kernel time on the GPU" if profile.timing == "device" else "CPU op time"
    lines = [
        f"{title}: {profile.steps} steps from step {profile.step}, "
        f"{fmt_ms(profile.step_ms)}/step ({whose})",
        "",
    ]
    bar_width = max(10, min(40, width - 40))
    for name, share, _cls in split_rows(profile):
        bar = "\u2588" * max(1, round(share * bar_width))
        lines.append(f"  {name[:28]:<28} {share:>5.0%}  {bar}")
    lines += ["", f"  top ops by self time ({whose}):"]
    for op in profile.top_ops:
        room = width - 34
        name = op.name if len(op.name) <= room else op.name[: room - 1] + "\u2026"
        lines.append(f"  {op.share:>5.1%} {op.calls:>6}x  {op.kind[:11]:<11} {name}")
    lines += ["", *wrap(advice(profile, facts), width)]
    if under_load:
        lines += wrap(under_load, width)
    if profile.trace:
        lines.append(f"Chrome trace (opens in https://ui.perfetto.dev): {profile.trace}")
    if profile.note:
        lines.append(profile.note)
    return "\n".join(lines)


def profiles_in(events: Sequence[object]) -> list[ev.ProfileEvent]:
    """The profiles a record holds whose figures hold (``sound``)."""
    return [e for e in events if isinstance(e, ev.ProfileEvent) and sound(e)]


def sound(profile: ev.ProfileEvent) -> bool:
    """Whether a profile's figures hold: a step time that is a number and not negative, every
    share of the step from 0 to 1, and the classes' shares adding up to the whole step. A
    damaged or hand-made record's profile that does not is no profile (it showed 'matmul
    -40 %' and a change of +300 %)."""
    shares = [
        *profile.classes.values(),
        *(share for kinds in profile.dtypes.values() for share in kinds.values()),
        profile.casts,
        *(op.share for op in profile.top_ops),
    ]
    return (
        math.isfinite(profile.step_ms)
        and profile.step_ms >= 0
        and all(math.isfinite(x) and 0.0 <= x <= 1.0 for x in shares)
        and abs(sum(profile.classes.values()) - 1.0) <= 0.01
    )
