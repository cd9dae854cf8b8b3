"""``ampscope numerics PRESET``: train N steps with every leaf module measured at every step,
then say, per module, what fp16, bf16 and fp8 would lose, and the verdicts."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable

from ampscope.cli.output import fail, output_width, stdout_for_json_only
from ampscope.core import events as ev
from ampscope.core import presets
from ampscope.core.numerics import FORMATS
from ampscope.core.numerics.event import INPUTS, OWN
from ampscope.core.numerics.names import fold_names
from ampscope.core.numerics.report import WEIGHT, NumericsSummary, magnitude, verdicts
from ampscope.core.presets.run_args import add_run_arguments, run_overrides
from ampscope.core.text import visible
from ampscope.core.units import fmt_ms


def add_numerics_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "numerics",
        help="which layer overflows or underflows in fp16, bf16, fp8: every module, every step",
        description=(
            "Train the preset with every leaf module's outputs and gradients measured at every "
            "step, then print each module's largest magnitude and what fp16, bf16, fp8 e4m3 and "
            "e5m2 would lose (overflow, underflow), and a verdict per format. --json prints one "
            "JSON object instead."
        ),
    )
    add_run_arguments(
        p,
        json_help="print one JSON object at the end (every module's figures, the first inf/NaN "
        "and the verdicts) instead of the table; progress goes to stderr as without it",
    )


LONG_S = 60.0
"""A numerics run estimated to take longer than this, after its first steps, says how to
train fewer: the preset's full step count (200) on a U-Net on a CPU is 20 minutes."""
FIRST_STEPS = 3  # steps seen before the estimate: step 0 is slower (first calls, allocation)


class LongRunHint:
    """Watches the first steps' times; when the rest of the run would take longer than
    :data:`LONG_S`, returns once the line that says so and how to train fewer steps."""

    def __init__(self) -> None:
        self.total = 0
        self.times: list[float] = []
        self.said = False

    def __call__(self, event: ev.Event) -> str | None:
        if isinstance(event, ev.HelloEvent):
            self.total = int(event.config.get("steps", 0) or 0)
            return None
        if self.said or not isinstance(event, ev.StepEvent) or event.step == 0:
            return None
        self.times.append(event.step_ms)
        if len(self.times) < FIRST_STEPS - 1:
            return None
        self.said = True  # one estimate, from the first steps
        per_step_s = statistics.median(self.times) / 1000
        left = self.total - (event.step + 1)
        if left * per_step_s <= LONG_S:
            return None
        fewer = max(FIRST_STEPS, int(LONG_S / per_step_s))
        return (
            f"{left} more steps at about {fmt_ms(per_step_s * 1000)} a step (every step measured): "
            f"about {fmt_s(left * per_step_s)} to go. --steps {fewer} trains fewer "
            f"(about {fmt_s(fewer * per_step_s)} in all)."
        )


def fmt_s(seconds: float) -> str:
    """1.5 s, 45 s, 20 min, 1.5 h: a duration to read at a glance."""
    if seconds < 10:
        return f"{seconds:.2g} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def cmd_numerics(args: argparse.Namespace, train: Callable[..., int] | None = None) -> int:
    """``ampscope numerics``: the run by ``train`` (the engine's ``run`` in this process
    unless given)."""
    from ampscope.cli.console import ConsoleReporter

    if train is None:
        from ampscope.engine.lifecycle.run import run

        train = run

    overrides = ["numerics.every=1", *run_overrides(args)]
    try:
        preset = presets.load_preset(args.preset, overrides)
        if preset.numerics.every == 0:  # off: the run would measure nothing to print
            return fail(
                "numerics.every=0 turns the measuring off, and 'ampscope numerics' prints what "
                "it measures. Accepted: a whole number of steps between measurements, 1 or "
                "more (the default here is 1: every step)."
            )
        if preset.compile != "off":
            overrides.append("compile='off'")
            print(
                "ampscope: numerics hook every layer, so this run does not compile", file=sys.stderr
            )
    except presets.ConfigError:
        pass  # run() says what is wrong, as 'ampscope run' does
    summary = NumericsSummary()
    console = ConsoleReporter(out=sys.stderr, result=sys.stderr)
    preset_name = args.preset
    steps_given = args.steps is not None or any(
        o.replace(" ", "").startswith("steps=") for o in args.overrides
    )
    long_run = LongRunHint()

    def on_event(event: ev.Event) -> None:
        nonlocal preset_name
        if isinstance(event, ev.NumericsEvent):
            summary.add(event)
            return
        if isinstance(event, ev.HelloEvent):
            preset_name = event.preset
        if not args.json or isinstance(event, (ev.ErrorEvent, ev.WarningEvent)):
            console(event)
        hint = None if steps_given else long_run(event)
        if hint:
            console.say(f"ampscope: {hint}")

    with stdout_for_json_only(args.json):
        code = train(
            args.preset,
            overrides,
            runs_dir=args.runs_dir,
            record=not args.no_record,
            on_event=on_event,
        )
    if code == 2 or not (summary.steps or args.json):  # --json: its one object, whatever ran
        return code
    if args.json:
        print(json.dumps(summary.to_json(preset_name), indent=1))
    else:
        print(report(summary, output_width()))
    return code


def _share(x: float) -> str:
    return "    0" if x == 0 else (f"{x:5.0%}" if x >= 0.01 else "  <1%")


PASS_LABELS = {"activation": "out", "gradient": "grad", WEIGHT: "grad"}
FIXED = 62  # the table's columns after the names: pass, amax, four formats


def report(summary: NumericsSummary, width: int | None = None) -> str:
    """The terminal's table: per module and pass, and per parameter's gradient, amax and each
    format's losses; names shortened from the left to fit ``width`` columns (None: whole)."""
    keys = list(FORMATS)
    rows = summary.measured()
    names = list(dict.fromkeys(visible(f.name, 2000) for f in rows))
    longest = max((len(n) for n in names), default=6)
    column = longest if width is None else min(longest, max(12, width - FIXED))
    shown = dict(zip(names, fold_names(names, column), strict=True))
    column = max([6, *(len(n) for n in shown.values())])
    head = f"{'module':<{column}} {'pass':<4} {'amax':>8} " + " ".join(f"{k:>11}" for k in keys)
    idle = summary.not_measured_line()
    lines = [
        f"{len(summary.steps)} steps sampled; {summary.layers()} of "
        f"{summary.modules_total} leaf modules measured"
        + (f"; {visible(idle, 2000)}" if idle else "")
        + (f"; gradients carry loss scale {summary.loss_scale:g}" if summary.loss_scale else ""),
        "shares: over/under (over: beyond the largest finite value, and inf/NaN computed in",
        "the format or a narrower one; under: non-zero values rounding to zero); grad under a",
        "module: the gradient at its outputs; under a parameter (out.bias): that gradient",
        head,
    ]
    for f in rows:
        t = f.totals
        cells = " ".join(f"{_share(t.share(k, 0))}/{_share(t.share(k, 1))}" for k in keys)
        name = shown[visible(f.name, 2000)]
        lines.append(f"{name:<{column}} {PASS_LABELS[f.side]:<4} {magnitude(t.amax):>8} {cells}")
    first = summary.first_nonfinite
    if first:
        said = "" if first.source in (OWN, INPUTS) else f" ({first.pass_})"  # in the words
        lines.append(f"first inf/NaN: step {first.step}, {visible(first.place(), 400)}{said}")
    lines.append("")
    lines.extend(verdicts(summary))
    return "\n".join(lines)
