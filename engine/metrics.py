"""Per-step metrics: gathered on the device inside the step, turned into events once they land.

The step returns its figures as one small device tensor (``StepMetrics`` order); nothing in it
waits for the GPU. The probe reads the tensor back a step late, and ``StepReporter`` turns it
into a step event, warnings, and the run's statistics.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import psutil
import torch

from ampscope.core import events as ev
from ampscope.engine.emitter import EventWriter
from ampscope.engine.probe import FinishedStep
from ampscope.engine.setup import Setup
from ampscope.engine.stats import RunStats

RSS_EVERY = 10  # CPU runs: process RSS is re-read every this many steps (~30 us a read)
ZERO_COUNT_CHUNK = 1 << 22  # grad_zero_frac counts this many elements at a time (4 MiB of bools)
MAX_NONFINITE_WITH_SCALER = 20  # consecutive non-finite losses a scaler may skip before we give up


class StepMetrics(NamedTuple):
    """One step's figures, in the order the step stacks them on the device."""

    loss: float
    grad_norm: float
    scale_before: float  # NaN when no scaler
    scale_after: float
    grad_zero_frac: float  # NaN on steps that do not measure it


METRICS_WIDTH = len(StepMetrics._fields)


class NonFiniteLoss(Exception):
    def __init__(self, step: int, loss: float) -> None:
        super().__init__(f"loss became {loss} at step {step}")
        self.step = step
        self.loss = loss


class ZeroGradCounter:
    """Fraction of exactly-zero values in the gradient reaching the model's output.

    That gradient is where underflow strikes first: under fp16 autocast it is cast to fp16
    before flowing back through the network, and anything below 2**-25 becomes 0. A loss scale
    lifts it back into range; without one, the zeros are gradient signal lost for good.
    """

    def __init__(self, output: torch.Tensor, nan: torch.Tensor) -> None:
        self.fraction = nan
        output.register_hook(self._count)

    def _count(self, grad: torch.Tensor) -> None:
        self.fraction = zero_fraction(grad)


def zero_fraction(grad: torch.Tensor, chunk: int = ZERO_COUNT_CHUNK) -> torch.Tensor:
    """The exact fraction of zeros, as a device scalar, without a temporary the size of ``grad``.

    ``(grad == 0).float().mean()`` allocates 5 bytes an element: 2.7 GB for the large GPT's
    16 x 1024 x 32768 logits. Counted ``chunk`` elements at a time, the temporaries are sized
    by the chunk, not by the gradient (on CUDA ``count_nonzero`` makes a bool copy of its
    input, so 4 MiB of them; on the CPU it allocates nothing).
    """
    grad = grad.detach()
    if grad.is_contiguous():
        pieces = grad.view(-1).split(chunk)
    else:  # views along the first dimension, as many rows as fit in a chunk
        rows = max(1, chunk * grad.shape[0] // max(grad.numel(), 1))
        pieces = grad.split(rows)
    nonzero = sum(torch.count_nonzero(piece) for piece in pieces)
    return 1.0 - torch.as_tensor(nonzero, device=grad.device) / max(grad.numel(), 1)


def scaler_scale(scaler: torch.amp.GradScaler, nan: torch.Tensor) -> torch.Tensor:
    """The current loss scale as a device tensor (``get_scale()`` would sync)."""
    scale = getattr(scaler, "_scale", None) if scaler.is_enabled() else None
    return scale.detach().clone().float().reshape(()) if scale is not None else nan


class StepReporter:
    """Turns finished steps into step events and keeps the run's statistics."""

    def __init__(self, s: Setup, writer: EventWriter, stats: RunStats, peak: float | None) -> None:
        self.s, self.writer, self.stats, self.peak = s, writer, stats, peak
        self.scaled = s.policy.use_scaler
        self.process = psutil.Process()
        self.warned_skip = False
        self.rss: int | None = None

    def report(self, item: FinishedStep) -> None:
        m = StepMetrics(*item.values)
        skipped = self.scaled and m.scale_after < m.scale_before
        self._count(item, m, skipped)
        self.writer.emit(self._step_event(item, m, skipped))
        self._warn(item.step, m, skipped)
        if not math.isfinite(m.loss) and (
            not self.scaled or self.stats.nonfinite_run >= MAX_NONFINITE_WITH_SCALER
        ):
            raise NonFiniteLoss(item.step, m.loss)

    def _count(self, item: FinishedStep, m: StepMetrics, skipped: bool) -> None:
        stats, loss = self.stats, m.loss
        stats.steps_done = item.step + 1
        stats.step_ms.append(item.step_ms)
        if not math.isnan(m.grad_zero_frac):
            stats.instrumented.add(item.step)
        stats.skipped += skipped
        stats.loss_final, stats.loss_final_step = loss, item.step  # what happened, finite or not
        if math.isfinite(loss):
            stats.nonfinite_run = 0
            if stats.loss_first is None:
                stats.loss_first = loss
        else:
            stats.nonfinite_run += 1

    def _step_event(self, item: FinishedStep, m: StepMetrics, skipped: bool) -> ev.StepEvent:
        workload = self.s.workload
        allocated, reserved, peak_mem = self.memory()
        seconds = item.step_ms / 1000.0
        tflops = self.s.flops.per_step / seconds / 1e12
        tokens = workload.tokens_per_step
        event = ev.StepEvent(
            step=item.step,
            step_ms=round(item.step_ms, 4),
            loss=m.loss if math.isfinite(m.loss) else None,
            loss_scale=m.scale_after if self.scaled else None,
            skipped=skipped,
            grad_norm=m.grad_norm if math.isfinite(m.grad_norm) else None,
            samples_per_s=workload.samples_per_step / seconds,
            tokens_per_s=tokens / seconds if tokens else None,
            tflops=tflops,
            mfu=tflops / self.peak if self.peak else None,
            mem_allocated=allocated,
            mem_reserved=reserved,
            mem_peak=peak_mem,
            grad_zero_frac=None if math.isnan(m.grad_zero_frac) else m.grad_zero_frac,
            lr=self.s.preset.lr,
        )
        peak = ev.peak_memory(event)
        if peak is not None and (self.stats.mem_peak is None or peak > self.stats.mem_peak):
            self.stats.mem_peak = peak
        return event

    def _warn(self, step: int, m: StepMetrics, skipped: bool) -> None:
        before, after = m.scale_before, m.scale_after
        if skipped and not self.warned_skip:
            self.warned_skip = True
            message = (
                f"GradScaler skipped step {step}: gradients held inf/NaN; loss scale "
                f"{before:g} -> {after:g}. A few early skips are normal while the scale settles."
            )
            self.writer.emit(
                ev.WarningEvent(code="skipped-step", step=step, message=message), urgent=True
            )
        if self.scaled and after < 1.0 and before >= 1.0:
            message = (
                f"Loss scale fell below 1 ({after:g}) at step {step}: gradients overflow even "
                "unscaled. Look for inf/NaN in the forward pass or lower the learning rate."
            )
            self.writer.emit(
                ev.WarningEvent(code="scale-collapse", step=step, message=message), urgent=True
            )

    def memory(self) -> tuple[int | None, int | None, int | None]:
        """(allocated, reserved, peak allocated) bytes; on the CPU only the process RSS is known.

        On CUDA one read of the allocator's statistics a step: ``memory_allocated`` and its
        siblings each rebuild (and flatten) the whole statistics dict to return one number.
        """
        if self.s.info.is_cuda:
            stats = torch.cuda.memory_stats_as_nested_dict(self.s.info.device)
            allocated = stats.get("allocated_bytes", {}).get("all", {})
            reserved = stats.get("reserved_bytes", {}).get("all", {})
            return allocated.get("current"), reserved.get("current"), allocated.get("peak")
        if self.stats.steps_done % RSS_EVERY == 1 or self.rss is None:
            self.rss = self.process.memory_info().rss
        return self.rss, None, None
