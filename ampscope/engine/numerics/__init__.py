"""Per-layer numerics: what fp16, bf16 and fp8 would lose in each leaf module (docs/events.md)."""

from __future__ import annotations

from ampscope.core import events as ev
from ampscope.engine.emitter import EventWriter
from ampscope.engine.metrics import scaler_scale
from ampscope.engine.numerics.probe import NumericsProbe
from ampscope.engine.setup import Setup
from ampscope.engine.stats import RunStats


class LoopNumerics:
    """The loop's side: which steps are sampled, the hooks around them, the events out.

    A step the GradScaler skipped, or one with a non-finite loss, makes the next step sampled
    too: the inf usually comes back at once, and that step then names the first module where
    it appears (``first_nonfinite``)."""

    def __init__(self, s: Setup, writer: EventWriter, stats: RunStats) -> None:
        self.s, self.stats = s, stats
        self.probe = NumericsProbe(
            s.workload.model, s.info.device, lambda e: writer.emit(e), s.preset.numerics.every
        )
        self.seen_bad = 0
        self.sampled = False

    def before(self, step: int) -> None:
        self.probe.poll()
        bad = self.stats.skipped + self.stats.nonfinite_run
        if bad > self.seen_bad:
            self.probe.sample_next(step)
        self.seen_bad = bad
        self.sampled = self.probe.wants(step)
        if self.sampled:
            self.probe.begin(step, scaler_scale(self.s.scaler, self.s.nan))

    def after(self, step: int) -> None:
        if self.sampled:
            self.probe.end(step)

    def finish(self) -> None:
        self.probe.remove()
        self.probe.poll(wait=True)


def loop_numerics(s: Setup, writer: EventWriter, stats: RunStats) -> LoopNumerics | None:
    """None when numerics are off, or the model is compiled (hooks would recompile it)."""
    if s.preset.numerics.every <= 0 or s.preset.compile != "off":
        return None
    try:
        return LoopNumerics(s, writer, stats)
    except (RuntimeError, ValueError, TypeError) as exc:
        writer.emit(ev.WarningEvent(code="numerics-failed", message=f"numerics are off: {exc}"))
        return None


__all__ = ["LoopNumerics", "NumericsProbe", "loop_numerics"]
