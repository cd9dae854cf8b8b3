"""The plan screen's model: what ``ampscope plan --json`` answered, checked, in rows and words.

Textual-free. The plan is the command's (its JSON is described in docs/plan.md); this module
reads it and says it. Every figure is checked before it is shown: a share outside 0..1, a
count below zero or a speed-up that is not a positive finite number refuses the whole plan,
naming where, rather than showing a figure that cannot be. Names, casts, recipes, reasons and
paths are the plan's own strings and are shown as written (``ampscope.core.text.visible``).

A row is one layer: its name (shortened from the left, never into another's), its GEMM's
M,K,N, the predicted speed-up, the cast that decided and the decision. The cast that decided
is the chosen recipe's worst cast (the most flushed to zero, any inf/NaN first); for a layer
kept in high precision, the best recipe's worst cast: within the band where speed kept it,
beyond it where no recipe holds the layer.
"""

from __future__ import annotations

import json
import math
import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from ampscope.core.text import visible

Target = Literal["fp8", "fp16"]
TARGETS: tuple[Target, ...] = ("fp8", "fp16")
Decision = Literal["fp8", "bf16", "fp16", "fp32"]


def as_target(text: str) -> Target:
    """The plan's target named by ``text``: fp16, else fp8 (the plan ampscope is for)."""
    return "fp16" if text == "fp16" else "fp8"


Share = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
Count = Annotated[int, msgspec.Meta(ge=0)]
Dimension = Annotated[int, msgspec.Meta(ge=1)]
Ratio = Annotated[float, msgspec.Meta(gt=0.0)]

BANDS = ((0.005, "fine"), (0.02, "warn"), (0.04, "critical"))
"""A cast's share flushed to zero, in BioNeMo's FP8 analyzer's bands: under 0.5 % fine,
0.5-2 % warn, 2-4 % critical, over 4 % severe. ``ampscope plan`` fits a recipe to a layer
when no cast flushes more than 2 % and none is inf/NaN."""
SORTS = ("model order", "speed-up", "worst cast")
"""The orders the rows can be shown in: as the model holds the layers, fastest first,
the most flushed first."""
STDOUT_LIMIT = 64 << 20
"""A plan's JSON is a few hundred bytes a layer; more than this is no plan."""
FAULT_LINES = 12
"""The last lines of its stderr a failed plan shows."""


class CastFigures(msgspec.Struct, kw_only=True):
    """One cast to fp8 (or fp16) of one tensor for one GEMM: the share of its non-zero values
    flushed to zero after scaling, the relative error, and the values made inf or NaN."""

    underflow: Share
    rel_error: float  # NaN where there is nothing to compare: shown as n/a
    nonfinite: Count


class RecipeFigures(msgspec.Struct, kw_only=True):
    casts: dict[str, CastFigures]
    fits: bool


class Gemm(msgspec.Struct):
    """The layer's forward GEMM: M rows of input (per call, per rank), K in, N out."""

    M: Dimension
    K: Dimension
    N: Dimension


class PlannedLayer(msgspec.Struct, kw_only=True):
    name: str
    kind: str = ""
    gemm: Gemm | None = None  # None: it never ran
    predicted_speedup: Ratio | None = None
    numerics: dict[str, RecipeFigures] | None = None
    decision: Decision
    recipe: str | None = None
    reason: str = ""


class PlanFiles(msgspec.Struct, kw_only=True):
    preset: str | None = None  # what enter trains
    torchao: str | None = None
    torchtitan: str | None = None
    json: str | None = None


class Plan(msgspec.Struct, kw_only=True):
    target: Target
    gpu: str | dict[str, Any] | None = None
    speed_source: Literal["measured", "model"] | None = None  # None: an fp16 plan (no speed)
    layers: list[PlannedLayer]
    files: PlanFiles = msgspec.field(default_factory=PlanFiles)
    verify: list[Any] = msgspec.field(default_factory=list)


@dataclass(frozen=True)
class PlanFault:
    """Why there is no plan to show: ``title`` in a few words, ``message`` as the command
    wrote it (one paragraph for a user error, the last lines of a crash)."""

    title: str
    message: str


class PlanUnreadable(ValueError):
    """The command's output is no plan this screen can show; ``str()`` says where."""


def read_plan(stdout: bytes) -> Plan:
    """The plan in ``stdout``, checked; PlanUnreadable says what is wrong and where.

    Read with Python's json (a NaN relative error is a figure the plan may give), then
    converted and checked by msgspec (every share, count and speed-up in its range).
    """
    if len(stdout) > STDOUT_LIMIT:
        raise PlanUnreadable(f"it printed {len(stdout):,} bytes, more than a plan holds")
    try:
        data = json.loads(stdout)
    except (ValueError, RecursionError) as exc:
        start = visible(stdout.decode(errors="replace").strip(), 120)
        said = f"it begins: {start}" if start else "it printed nothing"
        raise PlanUnreadable(f"its output is not JSON ({exc}); {said}") from None
    try:
        plan = msgspec.convert(data, Plan, strict=True)
    except msgspec.ValidationError as exc:
        raise PlanUnreadable(located(data, str(exc))) from None
    for i, layer in enumerate(plan.layers):
        if layer.predicted_speedup is not None and not math.isfinite(layer.predicted_speedup):
            message = f"Expected a finite speed-up - at `$.layers[{i}].predicted_speedup`"
            raise PlanUnreadable(located(data, message))
    return plan


def located(data: Any, message: str) -> str:
    """msgspec's message, with the layer it points at named, and the recipe and cast where
    it writes a mapping's key as ``[...]``."""
    found = re.search(r"\$\.layers\[(\d+)\]", message)
    layers = data.get("layers") if isinstance(data, dict) else None
    if found is None or not isinstance(layers, list) or int(found[1]) >= len(layers):
        return message
    entry = layers[int(found[1])]
    if not isinstance(entry, dict):
        return message
    where = [f"layer {visible(entry.get('name'), 200)}"]
    numerics = entry.get("numerics")
    recipe = faulty_key(numerics, RecipeFigures) if isinstance(numerics, dict) else None
    if recipe is not None and "numerics[...]" in message:
        where.append(f"recipe {visible(recipe, 60)}")
        figures = numerics[recipe] if isinstance(numerics, dict) else None
        casts = figures.get("casts") if isinstance(figures, dict) else None
        cast = faulty_key(casts, CastFigures) if isinstance(casts, dict) else None
        if cast is not None:
            where.append(f"cast {visible(cast, 60)}")
    return f"{message} ({', '.join(where)})"


def faulty_key(mapping: dict[Any, Any], kind: type) -> Any:
    """The first key whose value is no ``kind``; None if every value is one."""
    for key, value in mapping.items():
        try:
            msgspec.convert(value, kind, strict=True)
        except msgspec.ValidationError:
            return key
    return None


def read_outcome(code: int, stdout: bytes, stderr: Sequence[str]) -> Plan | PlanFault:
    """What a finished ``ampscope plan --json`` gave: its plan, or why there is none."""
    tail = "\n".join(stderr[-FAULT_LINES:])
    if code == 0:
        try:
            return read_plan(stdout)
        except PlanUnreadable as exc:
            return PlanFault("No plan to show", f"ampscope plan ended well but {exc}.")
    if code == 2:  # a user error: one paragraph, after any progress lines
        starts = [i for i, line in enumerate(stderr) if line.startswith("ampscope:")]
        message = "\n".join(stderr[starts[-1] :]) if starts else tail
        return PlanFault("ampscope plan refused", message or "it exited with code 2, silently")
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        why = " (out of memory? the kernel's OOM killer sends SIGKILL)" if name == "SIGKILL" else ""
        head = f"ampscope plan was ended by {name}{why}."
    else:
        head = f"ampscope plan failed (exit code {code})."
    return PlanFault("ampscope plan failed", head + (f" Its last lines:\n{tail}" if tail else ""))


# ---------------------------------------------------------------------------- the words


def share(x: float) -> str:
    """A share flushed to zero: 61%, 3.1%, 0.14%, 0%."""
    if x == 0:
        return "0%"
    if x < 1e-4:
        return "<0.01%"
    if x < 0.01:
        return f"{x:.2%}"
    return f"{x:.1%}" if x < 0.1 else f"{x:.0%}"


def band(figures: CastFigures) -> str:
    """The cast's band: fine, warn, critical, severe (BANDS), or nonfinite."""
    if figures.nonfinite:
        return "nonfinite"
    for below, name in BANDS:
        if figures.underflow < below:
            return name
    return "severe"


@dataclass(frozen=True)
class CastPick:
    """One recipe's worst cast for one layer."""

    recipe: str
    cast: str
    figures: CastFigures
    fits: bool

    @property
    def badness(self) -> tuple[bool, float]:
        return self.figures.nonfinite > 0, self.figures.underflow

    def share_words(self) -> str:
        """``3.1%``, ``inf/NaN``."""
        return "inf/NaN" if self.figures.nonfinite else share(self.figures.underflow)

    def words(self) -> str:
        """``grad_gw 3.1%``, ``output inf/NaN``."""
        return f"{visible(self.cast, 60)} {self.share_words()}"


def worst_cast(recipe: str, figures: RecipeFigures) -> CastPick | None:
    if not figures.casts:
        return None
    cast, worst = max(figures.casts.items(), key=lambda kv: (kv[1].nonfinite > 0, kv[1].underflow))
    return CastPick(recipe, cast, worst, figures.fits)


def recipe_picks(layer: PlannedLayer) -> list[CastPick]:
    """Each recipe's worst cast, in the plan's order of recipes."""
    picks = [worst_cast(r, f) for r, f in (layer.numerics or {}).items()]
    return [p for p in picks if p is not None]


def deciding_cast(layer: PlannedLayer) -> CastPick | None:
    """The cast that decided: the chosen recipe's worst; for a layer kept in high precision,
    the best recipe's worst (a fitting one first: then speed kept the layer). None: the plan
    measured no numerics for it (it never ran, or cannot be converted)."""
    picks = recipe_picks(layer)
    chosen = [p for p in picks if layer.recipe is not None and p.recipe == layer.recipe]
    if chosen:
        return chosen[0]
    if not picks:
        return None
    return min(picks, key=lambda p: (not p.fits, p.badness))


def speedup_words(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def shape_words(gemm: Gemm | None, compact: bool = False) -> str:
    """``8192,4096,11008``; ``compact``: multiples of 1024 as ``8k``."""
    if gemm is None:
        return "-"

    def one(n: int) -> str:
        return f"{n // 1024}k" if compact and n >= 1024 and n % 1024 == 0 else str(n)

    return ",".join(one(n) for n in (gemm.M, gemm.K, gemm.N))


def decision_words(layer: PlannedLayer) -> str:
    """``fp8 rowwise``, ``bf16``, ``fp32``."""
    if layer.decision == "fp8" and layer.recipe:
        return f"fp8 {visible(layer.recipe, 60)}"
    return layer.decision


def gpu_words(gpu: str | dict[str, Any] | None) -> str:
    if isinstance(gpu, dict):
        named = gpu.get("name") or gpu.get("label")
        gpu = str(named) if named else json.dumps(gpu, sort_keys=True)
    return visible(gpu, 80) if gpu else "no GPU named"


def speed_words(plan: Plan) -> str:
    """Where the speed-ups come from: this GPU's timings, or the roofline model; an fp16 plan
    predicts none (it keeps modules out of fp16 for their range, not for speed)."""
    if plan.target == "fp16":
        return "modules kept in fp32 for fp16's range, no speed-ups predicted"
    if plan.speed_source == "measured":
        return "speed-ups measured on it"
    return "speed-ups from the roofline model"


def legend_words(cast_head: str) -> str:
    """The line under the table: what the cast column's figure is, and its bands."""
    return f"{cast_head}: share flushed to zero · <0.5 % fine · >2 % the recipe does not fit"


def count_words(plan: Plan) -> str:
    """``7 of 19 layers in fp8 (rowwise 5, tensorwise 2) · bf16: 12``."""
    total = len(plan.layers)
    if not total:
        return "no linear layers in this model: nothing to plan"
    counts: dict[str, int] = {}
    for layer in plan.layers:
        counts[layer.decision] = counts.get(layer.decision, 0) + 1
    low = plan.target
    converted = counts.pop(low, 0)
    said = f"{converted} of {total} layers in {low}"
    if low == "fp8" and converted:
        recipes: dict[str, int] = {}
        for layer in plan.layers:
            if layer.decision == "fp8":
                name = visible(layer.recipe or "recipe unnamed", 40)
                recipes[name] = recipes.get(name, 0) + 1
        said += " (" + ", ".join(f"{r} {n}" for r, n in sorted(recipes.items())) + ")"
    kept = " · ".join(f"{d}: {n}" for d, n in sorted(counts.items()))
    return f"{said} · {kept}" if kept else said


FILE_ROLES = (
    ("preset", "the preset enter trains"),
    ("torchao", "torchao"),
    ("torchtitan", "torchtitan"),
    ("json", "figures"),
)


def files_words(files: PlanFiles) -> str:
    """Where the plan wrote its files: their folder once, then each name and what it is."""
    written = [(getattr(files, key), role) for key, role in FILE_ROLES if getattr(files, key)]
    if not written:
        return "no files written"
    folders = {str(Path(path).parent) for path, _ in written}
    if len(folders) == 1:
        names = [f"{visible(Path(path).name, 120)} ({role})" for path, role in written]
        return f"files in {visible(folders.pop(), 400)}: " + ", ".join(names)
    return "files: " + ", ".join(f"{visible(path, 400)} ({role})" for path, role in written)


def detail_lines(plan: Plan, layer: PlannedLayer) -> list[str]:
    """The highlighted layer in full: name, kind, shape, speed-up and decision, the plan's
    reason, then each recipe's worst cast."""
    head = visible(layer.name, 400) + (f" ({visible(layer.kind, 60)})" if layer.kind else "")
    if layer.gemm is not None:
        g = layer.gemm
        head += f" · M {g.M}, K {g.K}, N {g.N}"
    if layer.predicted_speedup is not None:
        source = "measured" if plan.speed_source == "measured" else "modelled"
        head += f" · {speedup_words(layer.predicted_speedup)} over bf16 ({source})"
    lines = [f"{head} · {decision_words(layer)}"]
    if layer.reason:
        lines.append(visible(layer.reason, 1000))
    picks = recipe_picks(layer)
    if picks:
        lines.append(
            "worst cast per recipe: "
            + " · ".join(
                f"{visible(p.recipe, 60)} {p.words()}{'' if p.fits else ' (does not fit)'}"
                for p in picks
            )
        )
    return lines


# ---------------------------------------------------------------------------- the rows


def sort_order(plan: Plan, sort: str) -> list[int]:
    """The layers' indexes in ``sort`` (one of SORTS); ties keep the model's order."""
    indexes = list(range(len(plan.layers)))
    if sort == "speed-up":
        speed = [layer.predicted_speedup for layer in plan.layers]
        return sorted(indexes, key=lambda i: (speed[i] is None, -(speed[i] or 0.0)))
    if sort == "worst cast":
        picks = [deciding_cast(layer) for layer in plan.layers]

        def flushed(i: int) -> tuple[bool, bool, float]:
            pick = picks[i]
            if pick is None:
                return True, False, 0.0
            nonfinite, underflow = pick.badness
            return False, not nonfinite, -underflow

        return sorted(indexes, key=flushed)
    return indexes


def name_forms(names: Sequence[str]) -> list[list[str]]:
    """Each name's forms, longest first, that still name it alone: the whole name, then with
    its leading dotted parts dropped one by one (``…attention.wq``) while no other name ends
    in the same parts."""
    parts = [name.split(".") for name in names]
    forms: list[list[str]] = []
    for i, mine in enumerate(parts):
        own = [names[i]]
        for k in range(1, len(mine)):
            tail = mine[k:]
            clash = any(j != i and other[-len(tail) :] == tail for j, other in enumerate(parts))
            if clash:
                break
            own.append("\u2026" + ".".join(tail))
        forms.append(own)
    return forms


def short_names(names: Sequence[str], width: int) -> list[str]:
    """Each name whole where it fits in ``width`` columns, else as short as it can be while
    it still names that layer alone (``…0.mlp.up_proj``, so every block's rows read alike):
    a name that cannot be that short is longer than ``width`` (never ambiguous)."""
    return [
        names[i] if len(names[i]) <= width else own[-1] for i, own in enumerate(name_forms(names))
    ]


def narrowest_names(names: Sequence[str]) -> int:
    """The fewest columns in which every name is still told apart from the others."""
    return max((len(own[-1]) for own in name_forms(names)), default=0)


HEADS = ("layer", "M,K,N", "speed", "worst cast", "plan")
SHARE_HEAD = "flushed"
"""The cast column's head where it holds the share alone (the detail line names the cast)."""
NAME_MIN = 12
"""A name column narrower than this reads as noise; the table then scrolls sideways."""


@dataclass(frozen=True)
class PlanTable:
    """The table as it fits ``width``: its heads and rows (the plan's layer index first)."""

    heads: tuple[str, ...]
    rows: list[tuple[int, list[str]]]
    bands: dict[int, str]  # the layer's deciding cast's band, for its colour


def plan_table(plan: Plan, sort: str, width: int, padding: int = 2) -> PlanTable:
    """The rows, fitted to ``width`` columns (the table's inside; each column pads by
    ``padding``). Where the names would otherwise get fewer than NAME_MIN columns or be cut
    into ambiguity, the shapes are compacted (``8k``), then the cast column keeps the share
    alone; names are never cut into ambiguity (the table then scrolls sideways)."""
    layers = plan.layers
    names = [visible(layer.name, 400) for layer in layers]
    picks = [deciding_cast(layer) for layer in layers]
    speeds = [speedup_words(layer.predicted_speedup) for layer in layers]
    decisions = [decision_words(layer) for layer in layers]
    need = max(min(NAME_MIN, max((len(n) for n in names), default=0)), narrowest_names(names))
    full = [p.words() if p is not None else "-" for p in picks]
    alone = [p.share_words() if p is not None else "-" for p in picks]
    variants = [
        (HEADS, [shape_words(layer.gemm) for layer in layers], full),
        (HEADS, [shape_words(layer.gemm, compact=True) for layer in layers], full),
        (
            (*HEADS[:3], SHARE_HEAD, HEADS[4]),
            [shape_words(layer.gemm, compact=True) for layer in layers],
            alone,
        ),
    ]
    for heads, shapes, casts in variants:
        columns = (shapes, speeds, casts, decisions)
        used = sum(
            max([len(head), *(len(c) for c in cells)]) + padding
            for head, cells in zip(heads[1:], columns, strict=True)
        )
        room = width - used - padding
        if room >= need:
            break
    shown = short_names(names, max(need, room))
    rows = [
        (i, [shown[i], shapes[i], speeds[i], casts[i], decisions[i]])
        for i in sort_order(plan, sort)
    ]
    bands = {i: band(p.figures) for i, p in enumerate(picks) if p is not None}
    return PlanTable(heads, rows, bands)
