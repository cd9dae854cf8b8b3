"""Per-layer numerics: what fp16, bf16 and fp8 would lose in each leaf module (docs/events.md)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from ampscope.core import events as ev
from ampscope.core.text import exception_text
from ampscope.engine.emitter import EventWriter
from ampscope.engine.numerics.hooks import NumericsProbe, leaf_modules
from ampscope.engine.numerics.replay import StepKeeper, rerun
from ampscope.engine.step.metrics import StepReporter, scaler_scale
from ampscope.engine.step.setup import Setup

RERUN_GAP = 10  # steps at least between two reruns of skipped steps (a run that ends: always)

LossOf = Callable[[int, Any, Any], torch.Tensor]  # (step, inputs, targets) -> the step's loss


class LoopNumerics:
    """The loop's side: which steps are sampled, the hooks around them, the events out.

    A step the GradScaler skipped, or one with a non-finite loss, is run again with the hooks
    on once its figures land (``replay``), which names the first module where the inf appears
    (``first_nonfinite``) at no cost until it happens. The first skipped step of a run of them
    is rerun, at most one in ``RERUN_GAP`` steps, and always the step a run ends on. On several
    processes, or when the batch is no longer kept, the next step is sampled instead.

    Without a GradScaler nothing skips the update of a step whose loss is not finite, and the
    run ends on it. On a CPU, where reading the loss costs no wait, that update is held
    (``holds_update``), so the step is rerun on the weights it ran with; on a GPU reading it
    would wait for every step, so such a step is not rerun (its update is in the weights by
    the time its loss lands). A step whose loss is finite but whose gradients are not (an
    overflow born in the backward pass) puts inf/NaN into the weights, and the next step's
    loss shows it: on a CPU that step is rerun before its update, so the run names the step
    and pass the inf was born in, not the forward pass of the step after it."""

    def __init__(
        self,
        s: Setup,
        writer: EventWriter,
        loss_of: LossOf,
        restart: Callable[[], None],
        leave_out: Callable[[float], None] | None = None,
    ) -> None:
        self.s, self.loss_of, self.restart = s, loss_of, restart
        self.leave_out = leave_out  # the step timer leaves out this many ms (a CPU's timer)
        self.probe = NumericsProbe(
            s.workload.model, s.info.device, lambda e: writer.emit(e), s.preset.numerics.every
        )
        # Reruns are collectives on several processes: every rank would have to rerun alike.
        self.keeper = StepKeeper(s.info.device) if s.link.world_size == 1 else None
        self.scaled = s.policy.use_scaler
        self.guard = self.keeper is not None and not self.scaled and s.info.device.type == "cpu"
        self.sample_now = False
        self.sampled = False
        self.rerun_at = -RERUN_GAP  # the step last rerun
        self.bad_since = -1  # the first step of the latest run of bad steps
        self.last_bad = -2

    def before(self, step: int) -> None:
        self.probe.poll()
        if self.sample_now:
            self.probe.sample_next(step)
            self.sample_now = False
        self.sampled = self.probe.wants(step)
        if self.sampled:
            self.probe.begin(step, scaler_scale(self.s.scaler, self.s.nan))

    def keep(self, step: int, inputs: Any, targets: Any) -> None:
        """The step's batch, as the forward gets it (a reference), and the RNG state."""
        if self.keeper is not None:
            self.keeper.keep(step, inputs, targets)

    def holds_update(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> bool:
        """Whether to leave the weights as they are: a CPU run without a GradScaler whose loss
        is not finite (it ends on this step, which can then be run again as it was). When
        only the gradients are not finite, the step is rerun now, before its update puts
        the inf/NaN into the weights, and the update goes ahead as without numerics."""
        if not self.guard:
            return False
        if not bool(torch.isfinite(loss.detach()).all()):
            return True
        if not bool(torch.isfinite(grad_norm.detach()).all()) and self._note_bad(step):
            started = time.perf_counter()
            self.replay(step, math.nan, restart=False)
            if self.leave_out is not None:  # the rerun is no step's work
                self.leave_out((time.perf_counter() - started) * 1000.0)
        return False

    def after(self, step: int) -> None:
        if self.sampled:
            self.probe.end(step)

    def _note_bad(self, step: int, ends: bool = False) -> bool:
        """Count ``step`` in the current run of bad steps (once, however often it is told);
        whether it is one to run again: the first of the run, at most one in ``RERUN_GAP``
        steps, or the one the run ends on, unless measured already or the first inf/NaN of
        the run is known."""
        if step != self.last_bad:
            if step != self.last_bad + 1:
                self.bad_since = step
            self.last_bad = step
        probe = self.probe
        wanted = ends or (step == self.bad_since and step - self.rerun_at >= RERUN_GAP)
        known = self._first_found(step) is not None
        return wanted and not known and step not in probe.measured and not probe.failed

    def _first_found(self, step: int) -> ev.FirstNonfinite | None:
        """The earliest inf/NaN found in the current run of bad steps, up to ``step``. Without
        a GradScaler, only the first bad step's own: a later step ran on weights the first
        one's update had already spoiled."""
        last = step if self.scaled else self.bad_since
        steps = [k for k in self.probe.found if self.bad_since <= k <= last]
        return self.probe.found[min(steps)] if steps else None

    def bad_step(self, step: int, scale: float, ends: bool) -> ev.FirstNonfinite | None:
        """A step skipped or with a non-finite loss or gradient, as its figures land
        (``scale``: the loss scale it ran with, NaN without a GradScaler; ``ends``: the run
        ends on it). Returns the first inf/NaN found in this run of bad steps, if any."""
        exact = self.scaled or self.guard  # the weights are those the step ran with
        if self._note_bad(step, ends) and exact:
            self.replay(step, scale)
        if ends:
            self.probe.poll(wait=True)
        return self._first_found(step)

    def replay(self, step: int, scale: float, restart: bool = True) -> None:
        """Run ``step`` again with the hooks on; ``restart``: time the next step from here."""
        kept = self.keeper.find(step) if self.keeper is not None else None
        if kept is None:
            self.sample_now = True  # its batch is gone: the next step may show the inf again
            return
        self.rerun_at = step
        device = self.s.info.device
        probe = self.probe
        probe.begin(step, torch.full((), scale, dtype=torch.float32, device=device))
        try:
            rerun(self.s.model, device, kept, scale, self.loss_of)
        except Exception as exc:  # never the user's run: one warning, numerics off
            probe.fail(exc, f"running step {step} again to find its first inf/NaN failed")
        probe.end(step, replayed=True)
        probe.poll(wait=True)  # a rare step: its answer now, not a step later
        if restart:
            self.restart()  # the next step is timed from here: the rerun is no step's work

    def finish(self) -> None:
        self.probe.close()
        self.probe.poll(wait=True)


def loop_numerics(
    s: Setup,
    writer: EventWriter,
    loss_of: LossOf,
    reporter: StepReporter,
    restart: Callable[[], None],
    leave_out: Callable[[float], None] | None = None,
) -> LoopNumerics | None:
    """None when numerics are off, or the model is compiled (hooks would recompile it: a note
    says so). The reporter tells it of each step that went wrong; ``restart`` restarts the
    step timer after a rerun, ``leave_out`` takes a rerun's time out of the step it ran in.
    """
    if s.preset.numerics.every <= 0:
        return None
    if s.preset.compile != "off":
        message = (
            f"per-layer numerics are off: this run compiles its model (compile = "
            f"'{s.preset.compile}'), and hooks on its layers would make torch.compile compile "
            "it again. 'ampscope numerics' measures the layers without compiling."
        )
        writer.emit(ev.WarningEvent(code=ev.NUMERICS_OFF, message=message), urgent=True)
        return None
    if not leaf_modules(s.model):  # the model is its only module: no layer to sample
        message = (
            f"per-layer numerics measure no step: the model is one {type(s.model).__name__} "
            "with no submodules, and they measure a model's layers (only a step whose loss "
            "goes inf/NaN is looked into). Return it inside a container "
            "(torch.nn.Sequential(model)) to measure it."
        )
        writer.emit(ev.WarningEvent(code=ev.NUMERICS_OFF, message=message), urgent=True)
    try:
        numerics = LoopNumerics(s, writer, loss_of, restart, leave_out)
    except (RuntimeError, ValueError, TypeError) as exc:
        writer.emit(
            ev.WarningEvent(
                code="numerics-failed", message=f"numerics are off: {exception_text(exc)}"
            )
        )
        return None
    reporter.on_bad = numerics.bad_step
    return numerics


__all__ = ["LoopNumerics", "NumericsProbe", "loop_numerics"]
