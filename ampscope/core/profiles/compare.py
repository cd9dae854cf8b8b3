"""Two runs' profiles side by side: what Compare shows under its plots and what
``ampscope profile --compare`` prints.

A record may hold several profiles (``ampscope profile`` writes one, every ``p`` in the Run
view another): the last one in the record is the run's. The change of a class is the change
of the milliseconds a step spends in it, where both profiles know their step time; otherwise
it is the change of its share of the step, and the line says which.

Torch-free and Textual-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ampscope.core import events as ev
from ampscope.core import profiles, records
from ampscope.core.comparison.table import setup_of
from ampscope.core.profiles.rules import CLASSES
from ampscope.core.units import fmt_ms

ARROW = "\u2192"
ELLIPSIS = "\u2026"
HOW_TO = "'ampscope profile {preset}' or p in a live Run view"
"""How a run gets a profile, said wherever one is missing."""


def last_profile(events: Sequence[object]) -> ev.ProfileEvent | None:
    """The run's profile: the last one its record holds (a later ``p`` replaces an earlier)."""
    found = profiles.profiles_in(events)
    return found[-1] if found else None


def last_profile_of(runs: Sequence[records.RunRecord]) -> ev.ProfileEvent | None:
    """The last profile any of ``runs`` took (a row of repeats has one profile at most)."""
    found = [p for r in runs if (p := last_profile(r.events)) is not None]
    return found[-1] if found else None


def in_ms(before: ev.ProfileEvent, after: ev.ProfileEvent) -> bool:
    """Whether both step times are known, so that classes compare in ms (else in shares)."""
    return before.step_ms > 0 and after.step_ms > 0


def whose(profile: ev.ProfileEvent) -> str:
    return "GPU kernel time" if profile.timing == "device" else "CPU op time"


def change_parts(before: ev.ProfileEvent, after: ev.ProfileEvent) -> list[str]:
    """The classes that moved, most first: 'matmul \u221268 %' (the ms a step spends in it),
    or 'matmul 61 % \u2192 20 %' (its share of the step) where a step time is unknown."""
    if in_ms(before, after):
        return [profiles.change_text(row, before, after) for row in profiles.diff(before, after)]
    rows = [
        (cls, before.classes.get(cls, 0.0), after.classes.get(cls, 0.0))
        for cls in CLASSES
        if max(before.classes.get(cls, 0.0), after.classes.get(cls, 0.0)) >= 0.01
    ]
    rows.sort(key=lambda r: -abs(r[2] - r[1]))
    return [f"{CLASSES[cls]} {b:.0%} {ARROW} {a:.0%}".replace("%", " %") for cls, b, a in rows]


def measure(before: ev.ProfileEvent, after: ev.ProfileEvent) -> str:
    """What the changes are of, and whose time, in a few words for the head of a line."""
    what = (
        f"{fmt_ms(before.step_ms).removesuffix(' ms')} {ARROW} {fmt_ms(after.step_ms)}/step"
        if in_ms(before, after)
        else "share of step"
    )
    if before.timing != after.timing:
        what += f" ({whose(before)} vs {whose(after)}: not like for like)"
    return what


def shares(profile: ev.ProfileEvent) -> list[str]:
    """'matmul 34 %', 'elementwise 23 %', ...: a profile's classes, largest first."""
    return [
        f"{CLASSES.get(cls, cls)} {share:.0%}".replace("%", " %")
        for cls, share in profiles.shown_classes(profile)
    ]


def fit(head: str, parts: Sequence[str], width: int) -> str:
    """``head: part, part, ...`` with as many parts as fit in ``width`` (at least one)."""
    line = head
    for i, part in enumerate(parts):
        more = f"{': ' if i == 0 else ', '}{part}"
        if i > 0 and len(line) + len(more) > width:
            break
        line += more
    return crop(line, width)


def crop(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + ELLIPSIS


def pair_line(
    base: str, label: str, before: ev.ProfileEvent, after: ev.ProfileEvent, width: int = 78
) -> str:
    """'fp32 \u2192 amp-bf16, 12.4 \u2192 7.40 ms/step: matmul \u221268 %, ...' in ``width``."""
    head = f"{base} {ARROW} {label}, {measure(before, after)}"
    return fit(head, change_parts(before, after) or ["no class moved"], width)


@dataclass
class ProfiledRun:
    label: str  # as the screen names the run
    preset: str  # for the command that would profile it
    profile: ev.ProfileEvent | None


def compare_lines(
    runs: Sequence[ProfiledRun], baseline: str, width: int = 78, most: int = 4
) -> list[str]:
    """Compare's profile lines: each profiled run against the baseline's profile (or, if the
    baseline has none, the first run that has one), then one line naming the runs without
    a profile and how to get one. At most ``most`` lines, each at most ``width`` long."""
    have = [r for r in runs if r.profile is not None]
    missing = [r for r in runs if r.profile is None]
    if not have:
        preset = runs[0].preset if len(runs) == 1 else "PRESET"
        return [crop(f"No profiles to compare: {HOW_TO.format(preset=preset)}.", width)]
    ref = next((r for r in have if r.label == baseline), have[0])
    assert ref.profile is not None
    lines, tail = [], []
    if len(have) == 1:
        lines.append(
            fit(f"Profile of {ref.label} alone, {whose(ref.profile)}", shares(ref.profile), width)
        )
    for run in have:
        if run is not ref and run.profile is not None:
            lines.append(pair_line(ref.label, run.label, ref.profile, run.profile, width))
    if missing:
        preset = missing[0].preset if len(missing) == 1 else "PRESET"
        names = ", ".join(r.label for r in missing)
        tail.append(crop(f"No profile: {names} ({HOW_TO.format(preset=preset)})", width))
    if len(lines) + len(tail) > most:
        keep = max(0, most - 1 - len(tail))
        hidden = len(lines) - keep
        more = f"{ELLIPSIS} {hidden} more profiled runs: 'ampscope profile --compare RUN_A RUN_B'"
        lines = [*lines[:keep], crop(more, width)]
    return lines + tail


def side_by_side(
    a: tuple[str, ev.ProfileEvent], b: tuple[str, ev.ProfileEvent], width: int = 80
) -> str:
    """Both splits, class by class (share, ms per step, format), and the line of changes."""
    (name_a, pa), (name_b, pb) = a, b
    shown = [
        cls for cls in CLASSES if max(pa.classes.get(cls, 0.0), pb.classes.get(cls, 0.0)) >= 0.005
    ]
    shown.sort(key=lambda cls: -max(pa.classes.get(cls, 0.0), pb.classes.get(cls, 0.0)))
    col = min(30, max(16, (width - 24) // 2))

    def cell(p: ev.ProfileEvent, cls: str) -> str:
        share = p.classes.get(cls, 0.0)
        text = f"{share:>4.0%}".replace("%", " %")
        if p.step_ms > 0:
            text += f" {fmt_ms(share * p.step_ms):>9}"
        kinds = p.dtypes.get(cls)
        if kinds:
            text += " " + "/".join(sorted(kinds, key=lambda d: -kinds[d])[:2])
        return crop(text, col)

    def head(name: str, p: ev.ProfileEvent) -> str:
        return crop(f"{name}, {fmt_ms(p.step_ms)}/step", col)

    lines = [
        f"A: {name_a}: {pa.steps} steps from step {pa.step}, {whose(pa)}",
        f"B: {name_b}: {pb.steps} steps from step {pb.step}, {whose(pb)}",
        "",
        f"  {'':<20} {head('A', pa):<{col}} {head('B', pb)}",
    ]
    for cls in shown:
        lines.append(f"  {CLASSES[cls][:20]:<20} {cell(pa, cls):<{col}} {cell(pb, cls)}")
    lines += ["", pair_line("A", "B", pa, pb, width)]
    if in_ms(pa, pb):
        lines.append("(each change is of the ms a step spends in the class)")
    return "\n".join(line.rstrip() for line in lines)


PROFILE_SETUP = ("workload", "sizes", "batch", "device", "processes")
"""What two profiles must share for their difference to be the formats' (a step's count may
differ: a profile is of a step)."""


def setup_differs(a: records.RunRecord, b: records.RunRecord) -> dict[str, list[str]]:
    """The setup fields in which two runs differ, each with both values, in order."""
    sa, sb = setup_of(a), setup_of(b)
    return {f: [sa.get(f, "?"), sb.get(f, "?")] for f in PROFILE_SETUP if sa.get(f) != sb.get(f)}


def differs_line(differs: dict[str, list[str]]) -> str | None:
    """A note that A and B are not the same step in two formats, or None when they are."""
    if not differs:
        return None
    parts = [f"{field} ({a}, {b})" for field, (a, b) in differs.items()]
    named = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"A and B differ in {named}: what moved is not the format's change alone."


def to_json(
    a: tuple[str, str, ev.ProfileEvent],
    b: tuple[str, str, ev.ProfileEvent],
    differs: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """The object ``ampscope profile --compare --json`` prints: each run's profile (with its
    run folder and preset) and, per class, before and after in ms per step (shares of the step
    where a step time is unknown: ``unit`` says which) and the relative change; ``differs``:
    the setup fields in which the runs differ (``setup_differs``), empty when none."""
    (run_a, preset_a, pa), (run_b, preset_b, pb) = a, b
    ms = in_ms(pa, pb)
    changes = []
    if ms:
        for row in profiles.diff(pa, pb):
            change = row.change
            changes.append(
                {
                    "class": row.cls,
                    "before": round(row.before_ms, 4),
                    "after": round(row.after_ms, 4),
                    "change": None if change is None else round(change, 4),
                }
            )
    else:
        for cls in CLASSES:
            before, after = pa.classes.get(cls, 0.0), pb.classes.get(cls, 0.0)
            if max(before, after) >= 0.01:
                change = None if before <= 0 else round(after / before - 1.0, 4)
                changes.append({"class": cls, "before": before, "after": after, "change": change})
    return {
        "before": {"run": run_a, **profiles.to_json(pa, preset_a)},
        "after": {"run": run_b, **profiles.to_json(pb, preset_b)},
        "unit": "ms per step" if ms else "share of step",
        "changes": changes,
        "differs": differs or {},
    }
