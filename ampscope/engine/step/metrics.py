"""Per-step metrics: gathered on the device inside the step, turned into events once they land.

The step returns its figures as one small device tensor (``StepMetrics`` order); nothing in it
waits for the GPU. The step timer reads the tensor back a step late, and ``StepReporter`` turns it
into a step event (``core.records.step_event``), warnings, and the run's tally
(``core.records.tally``), as a watched loop does.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Iterable
from typing import NamedTuple

import torch

from ampscope.core import events as ev
from ampscope.core.memory.host import HostPeak
from ampscope.core.records.step_event import step_event
from ampscope.core.records.tally import StepTally
from ampscope.engine.device import CudaMemory
from ampscope.engine.emitter import EventWriter
from ampscope.engine.private_apis import initial_scale, live_scale
from ampscope.engine.ranks.link import RankFigures
from ampscope.engine.step.setup import Setup
from ampscope.engine.step.timer import FinishedStep

ZERO_COUNT_CHUNK = 1 << 26  # grad_zero_frac counts this many elements at a time (64 MiB of bools)
INPUT_BOUND_SHARE = 0.25  # waiting for batches above this share of step time: input-bound
INPUT_BOUND_AFTER = 10  # timed steps (after warm-up) seen before the share is judged
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
    def __init__(
        self,
        step: int,
        loss: float,
        ranks: list[int] | None = None,
        first: ev.FirstNonfinite | None = None,
    ) -> None:
        super().__init__(f"loss became {loss} at step {step}")
        self.step = step
        self.loss = loss
        self.ranks = ranks  # on several processes, the ranks whose own loss was not finite
        self.first = first  # where the inf/NaN first appeared, when numerics found it


class EveryStepSkipped(Exception):
    """The GradScaler skipped every step of a run that finished: the weights never changed."""

    def __init__(
        self, steps: int, scale_first: float, scale_last: float, first: ev.FirstNonfinite | None
    ) -> None:
        super().__init__(f"every step of {steps} skipped")
        self.steps = steps
        self.scale_first, self.scale_last = scale_first, scale_last
        self.first = first  # where the inf/NaN first appeared, when numerics found it


class ReplicasDiverged(Exception):
    """Ranks disagree on something every replica must share: one skipped a step another took."""

    def __init__(self, step: int, message: str) -> None:
        super().__init__(message)
        self.step = step


class ZeroGradCounter:
    """Fraction of exactly-zero values in the gradient reaching the model's output.

    That gradient is where underflow strikes first: under fp16 autocast it is cast to fp16
    before flowing back through the network, and anything below 2**-25 becomes 0. A loss scale
    lifts it back into range; without one, the zeros are gradient signal lost for good.

    Under torch.compile a model that computes its own loss (a Hugging Face model given
    labels) returns its logits beside the loss from one compiled graph: their gradient stays
    inside the graph, and the hook is called with None. The fraction then stays NaN (not
    measured), and the reporter says once why (``StepReporter``).
    """

    def __init__(self, output: torch.Tensor, nan: torch.Tensor) -> None:
        self.fraction = nan
        output.register_hook(self._count)

    def _count(self, grad: torch.Tensor | None) -> None:
        if grad is not None:
            self.fraction = zero_fraction(grad)


def zero_fraction(grad: torch.Tensor, chunk: int = ZERO_COUNT_CHUNK) -> torch.Tensor:
    """The exact fraction of zeros, as a device scalar, without a temporary the size of ``grad``.

    ``(grad == 0).float().mean()`` allocates 5 bytes an element: 2.7 GB for the large GPT's
    16 x 1024 x 32768 logits. Counted ``chunk`` elements at a time, the temporaries are sized
    by the chunk, not by the gradient (on CUDA ``count_nonzero`` makes a bool copy of its
    input, so 64 MiB of them; on the CPU it allocates nothing). The chunk is large because
    each costs three kernels: at 4 MiB the large GPT's logits took some 400 a measured step.
    (The L0 norm counts in one kernel, but in the gradient's own format, which holds whole
    numbers exactly only to 256 in bf16, and given an fp32 ``dtype`` it copies the input.)
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
    """The current loss scale as a device tensor (``get_scale()`` would sync). Before its first
    ``scale()`` a GradScaler holds no scale tensor yet: its initial scale is the one step 0
    runs with. ``nan`` (a device scalar) without a GradScaler."""
    if not scaler.is_enabled():
        return nan
    scale = live_scale(scaler)
    if scale is None:
        return torch.full((), initial_scale(scaler), dtype=torch.float32, device=nan.device)
    return scale.detach().clone().float().reshape(())


class MemoryReader:
    """This rank's memory after a step: the CUDA allocator's figures, or on the CPU the
    process RSS and its true peak since the loop began (``core.memory.host``). A watched loop
    reads the host at most every ``host_every_s`` (a read costs ~20 us; its steps may be
    far shorter than the engine's)."""

    def __init__(
        self, device: torch.device, host_every_s: float = 0.0, cuda: CudaMemory | None = None
    ) -> None:
        self.device = device
        self.cuda: CudaMemory = cuda or torch.cuda
        self.host = HostPeak()
        if device.type != "cuda":
            self.host.reset()  # setup's own peak (imports, the FLOP count) does not count
        self.host_every_s = host_every_s
        self._host_last: tuple[int | None, int | None, int | None] = (None, None, None)
        self._host_read_at = -math.inf

    def read(self) -> tuple[int | None, int | None, int | None]:
        """(allocated, reserved, peak allocated) bytes; on the CPU (RSS, None, peak RSS).

        On CUDA one read of the allocator's statistics a step: ``memory_allocated`` and its
        siblings each rebuild (and flatten) the whole statistics dict to return one number.
        """
        if self.device.type == "cuda":
            stats = self.cuda.memory_stats_as_nested_dict(self.device)
            allocated = stats.get("allocated_bytes", {}).get("all", {})
            reserved = stats.get("reserved_bytes", {}).get("all", {})
            return allocated.get("current"), reserved.get("current"), allocated.get("peak")
        now = time.monotonic()
        if now - self._host_read_at >= self.host_every_s:
            self._host_read_at = now
            rss, peak = self.host.read()  # one read of /proc/self/status (~20 us)
            self._host_last = (rss, None, peak)
        return self._host_last

    def reset_peak(self) -> int | None:
        """The CUDA allocator's peak so far, then the peak restarted from what is held now:
        after setup and after the compile step, so that ``mem_peak`` is the training peak.
        Host-side statistics: no sync. None on the CPU (RSS has no peak to restart)."""
        if self.device.type != "cuda":
            return None
        peak = self.cuda.max_memory_allocated(self.device)
        self.cuda.reset_peak_memory_stats(self.device)
        return peak

    def figures(self, rank: int, item: FinishedStep) -> RankFigures:
        return RankFigures(rank, item.step, item.step_ms, item.values, *self.read(), item.cpu_ms)


class StepReporter:
    """Turns finished steps (each as every rank's figures) into step events and the tally."""

    def __init__(
        self,
        s: Setup,
        writer: EventWriter,
        tally: StepTally,
        peak: float | None,
        profiled: Collection[int] = (),
    ) -> None:
        self.s, self.writer, self.tally, self.peak = s, writer, tally, peak
        self.scaled = s.policy.use_scaler
        self.warned_skip = False
        self.data_ms: dict[int, float] = {}  # this rank's wait for each step's batch
        self.profiled = profiled  # the steps that ran under torch.profiler (the profiler's)
        self.input_wait = InputWait(tally.warmup_steps)
        # Told of each skipped step, or one with a non-finite loss or gradient norm (step, its
        # loss scale, whether the run ends on it); answers where the inf first appeared, if it
        # can tell (numerics).
        self.on_bad: Callable[[int, float, bool], ev.FirstNonfinite | None] | None = None
        self.first: ev.FirstNonfinite | None = None  # the run's first inf/NaN, when found
        self.scale_first: float | None = None  # the loss scale the first step ran with
        self.scale_last = math.nan  # the loss scale after the last step
        # True once a step that was to count the output gradient's zeros got no gradient to
        # count: the loop stops asking, and a note has said why.
        self.zeros_unreached = False

    def report(self, ranks: list[RankFigures]) -> None:
        """One step, ``ranks`` by rank (one entry on one process)."""
        step = ranks[0].step
        each = [StepMetrics(*f.values) for f in ranks]
        m = each[0]
        skips = [self.scaled and x.scale_after < x.scale_before for x in each]
        if any(skips) and not all(skips):
            self._diverged(step, skips)
        skipped = skips[0]
        loss = sum(x.loss for x in each) / len(each)  # the global batch's: equal batches a rank
        job_ms = ranks[0].step_ms if len(ranks) == 1 else max(f.step_ms for f in ranks)
        cpu_ms = _job_cpu_ms(ranks)  # the slowest rank sets the pace
        data_ms = self.data_ms.pop(step, None)
        sizes = self.s.workload.step_sizes(step)  # this rank's batch
        event = self._step_event(step, job_ms, cpu_ms, loss, m, skipped, ranks, data_ms, sizes)
        samples, tokens, share = sizes
        self.tally.add(
            step,
            job_ms,
            loss,
            skipped,
            memory=ev.peak_memory(event),
            cpu_ms=cpu_ms,
            samples=samples,
            tokens=tokens,
            flops=self.s.flops.per_step * share,
            instrumented=event.grad_zero_frac is not None,
            profiled=event.profiled,
            ranks=[(f.step_ms, f.mem_peak or f.mem_allocated) for f in ranks]
            if len(ranks) > 1
            else None,
        )
        self.writer.emit(event)
        self._warn(step, m, skipped)
        self._zeros_reached(step, m)
        if data_ms is not None and self.input_wait.add(step, job_ms, data_ms):
            self.writer.emit(self.input_wait.warning(), urgent=True)
        ends = not math.isfinite(loss) and (
            not self.scaled or self.tally.nonfinite_run >= MAX_NONFINITE_WITH_SCALER
        )
        first = None
        # A finite loss with non-finite gradients is where an overflow born in the backward
        # pass shows first (without a GradScaler its update spoils the weights, and only the
        # next step's loss shows it).
        went_wrong = skipped or not math.isfinite(loss) or not math.isfinite(m.grad_norm)
        if went_wrong and self.on_bad is not None:
            first = self.on_bad(step, m.scale_before if self.scaled else math.nan, ends)
            self.first = self.first or first
        if self.scale_first is None:
            self.scale_first = m.scale_before
        self.scale_last = m.scale_after
        if ends:
            bad = [f.rank for f, x in zip(ranks, each, strict=True) if not math.isfinite(x.loss)]
            raise NonFiniteLoss(step, loss, bad if len(ranks) > 1 else None, first)

    def finished(self, status: ev.DoneStatus) -> ev.DoneStatus:
        """``status``, unless a run that finished had every step skipped: then it raises
        ``EveryStepSkipped``, for the run never trained (a skip is no failure of its own)."""
        done = self.tally.steps_done
        if status == "ok" and self.scaled and done and self.tally.skipped >= done:
            first_scale = math.nan if self.scale_first is None else self.scale_first
            raise EveryStepSkipped(done, first_scale, self.scale_last, self.first)
        return status

    def _diverged(self, step: int, skips: list[bool]) -> None:
        took = [r for r, s in enumerate(skips) if not s]
        skipped = [r for r, s in enumerate(skips) if s]
        raise ReplicasDiverged(
            step,
            f"Replicas diverged at step {step}: GradScaler skipped it on rank(s) "
            f"{_ranks(skipped)} but not on rank(s) {_ranks(took)}. Every rank must see the same "
            "inf/NaN verdict (all-reduced gradients, or a ShardedGradScaler under FSDP); from "
            "here the ranks would train different models.",
        )

    def warn_from(self, found: list[ev.WarningEvent | ev.NoteEvent]) -> None:
        """Emit (and clear) what the workload found while serving batches (a new epoch)."""
        for event in found:
            self.writer.emit(event, urgent=True)
        found.clear()

    def _step_event(
        self,
        step: int,
        job_ms: float,
        cpu_ms: float | None,
        loss: float,
        m: StepMetrics,
        skipped: bool,
        ranks: list[RankFigures],
        data_ms: float | None,
        sizes: tuple[int, int | None, float],
    ) -> ev.StepEvent:
        """The job's step: the global batch over the slowest rank's time, memory of the fullest.
        ``sizes``: this rank's batch (``step_sizes``), taken as every rank's."""
        world = len(ranks)
        samples, tokens, share = sizes
        return step_event(
            step,
            job_ms,
            loss,
            skipped,
            loss_scale=m.scale_after if self.scaled else None,
            grad_norm=m.grad_norm,
            samples=world * samples,
            tokens=world * tokens if tokens else None,
            flops=world * self.s.flops.per_step * share,
            peak_tflops=world * self.peak if self.peak else None,
            memory=_job_memory(ranks),
            zeros=m.grad_zero_frac,
            lr=self.s.preset.lr,
            cpu_ms=cpu_ms,
            data_ms=data_ms,
            ranks=[_rank_step(f, self.scaled) for f in ranks] if world > 1 else None,
            profiled=step in self.profiled,
        )

    def _zeros_reached(self, step: int, m: StepMetrics) -> None:
        """A step that was to count the zeros in the output's gradient and counted nothing:
        that gradient never reached the hook. Said once, as a note (the run is fine)."""
        every = self.s.preset.grad_zero_every
        measuring = every > 0 and step % every == 0
        if self.zeros_unreached or not measuring or not math.isnan(m.grad_zero_frac):
            return
        self.zeros_unreached = True
        if self.s.preset.compile != "off":
            why = (
                "the model computes its loss inside the compiled graph (torch.compile), so the "
                "gradient of its output stays inside the graph. Give the factory a 'loss', "
                "(output, targets) -> loss, or run without compile to measure it"
            )
        else:
            why = (
                "the model returns no output the loss is computed from (a loss alone), so no "
                "gradient reaches its output. Give the factory a 'loss', (output, targets) -> "
                "loss, to measure it"
            )
        message = f"grad_zero_frac (the zeros in the output's gradient) is not measured: {why}."
        self.writer.emit(ev.WarningEvent(code=ev.GRAD_ZEROS_OFF, message=message, step=step))

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


class InputWait:
    """Whether the run waits on its input pipeline: the host's wait for batches against step
    time, summed over the timed steps (after warm-up), judged once enough are in. Warns once."""

    def __init__(self, warmup_steps: int) -> None:
        self.warmup_steps = warmup_steps
        self.steps = 0
        self.first_step: int | None = None
        self.last_step = 0
        self.step_ms = 0.0
        self.data_ms = 0.0
        self.warned = False

    def add(self, step: int, step_ms: float, data_ms: float) -> bool:
        """Count a step; True exactly once, when the wait first passes its share."""
        if self.warned or step < self.warmup_steps:
            return False
        if self.first_step is None:
            self.first_step = step
        self.steps += 1
        self.last_step = step
        self.step_ms += step_ms
        self.data_ms += data_ms
        busy = self.data_ms > INPUT_BOUND_SHARE * self.step_ms
        self.warned = self.steps >= INPUT_BOUND_AFTER and busy
        return self.warned

    def warning(self) -> ev.WarningEvent:
        share = self.data_ms / self.step_ms if self.step_ms else 0.0
        message = (
            f"Input-bound: waiting for the next batch took {share:.0%} of step time "
            f"({self.data_ms / self.steps:.3g} ms of {self.step_ms / self.steps:.3g} ms a step, "
            f"steps {self.first_step}-{self.last_step}). The model waits on its data: more "
            "DataLoader workers (num_workers), pinned memory (pin_memory=True) or prefetching "
            "(prefetch_factor) would feed it faster."
        )
        return ev.WarningEvent(code="input-bound", message=message, step=self.last_step)


def _rank_step(f: RankFigures, scaled: bool) -> ev.RankStep:
    m = StepMetrics(*f.values)
    return ev.RankStep(
        rank=f.rank,
        step_ms=round(f.step_ms, 4),
        loss=m.loss if math.isfinite(m.loss) else None,
        skipped=scaled and m.scale_after < m.scale_before,
        mem_allocated=f.mem_allocated,
        mem_reserved=f.mem_reserved,
        mem_peak=f.mem_peak,
    )


def _job_memory(ranks: list[RankFigures]) -> tuple[int | None, int | None, int | None]:
    """The fullest rank's allocated, reserved and peak bytes (each the largest of the ranks')."""
    if len(ranks) == 1:
        only = ranks[0]
        return only.mem_allocated, only.mem_reserved, only.mem_peak
    return (
        _largest(f.mem_allocated for f in ranks),
        _largest(f.mem_reserved for f in ranks),
        _largest(f.mem_peak for f in ranks),
    )


def _largest(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def _job_cpu_ms(ranks: list[RankFigures]) -> float | None:
    """The step's CPU time as the job's step time is taken: the slowest rank's (None where a
    rank has none: a GPU's step is not the host's CPU time)."""
    if len(ranks) == 1:
        return ranks[0].cpu_ms
    times = [f.cpu_ms for f in ranks]
    return None if any(t is None for t in times) else max(t for t in times if t is not None)
