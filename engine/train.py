"""The training loop: one preset, one device, every step reported.

Read top to bottom: build the workload, pick the precision policy, wrap the model in
torch.compile if asked, then loop over ``train_step``. Metrics travel as one small device
tensor per step and are read back by the probe without blocking the GPU.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from dataclasses import dataclass, field

import psutil
import torch
from torch.nn.utils import clip_grad_norm_

from ampscope.core import events as ev
from ampscope.core.config import Preset, resolve_workload
from ampscope.engine.compile_stats import CompileWatch
from ampscope.engine.device import DeviceInfo
from ampscope.engine.emitter import EventWriter
from ampscope.engine.fp8 import convert_for_fp8, require_fp8_support
from ampscope.engine.precision import PrecisionPolicy, precision_policy, set_matmul_precision
from ampscope.engine.probe import FinishedStep, make_probe
from ampscope.engine.workloads import Workload, build_workload

# The per-step metric vector, read back from the device together.
LOSS, GRAD_NORM, SCALE_BEFORE, SCALE_AFTER, GRAD_ZEROS = range(5)
NAN = float("nan")
RSS_EVERY = 10  # CPU runs: process RSS is re-read every this many steps
MAX_NONFINITE_WITH_SCALER = 20  # consecutive non-finite losses a scaler may skip before we give up


class NonFiniteLoss(Exception):
    def __init__(self, step: int, loss: float) -> None:
        super().__init__(f"loss became {loss} at step {step}")
        self.step = step
        self.loss = loss


@dataclass
class RunStats:
    """What the run has seen so far; enough to write ``done`` at any moment, also after a fault."""

    warmup_steps: int
    step_ms: list[float] = field(default_factory=list)
    steps_done: int = 0
    loss_first: float | None = None
    loss_final: float | None = None
    skipped: int = 0
    nonfinite_run: int = 0
    compile_s: float | None = None
    mem_peak: int | None = None
    started: float = field(default_factory=time.monotonic)

    def timed(self) -> list[float]:
        return self.step_ms[self.warmup_steps :] or self.step_ms[1:] or self.step_ms

    def done(
        self,
        status: str,
        samples: int,
        tokens: int | None,
        flops: float,
        peak: float | None,
        error: str | None = None,
    ) -> ev.DoneEvent:
        times = sorted(self.timed())
        median = statistics.median(times) if times else None
        per_s = 1000.0 / median if median else None
        return ev.DoneEvent(
            status=status,
            steps_done=self.steps_done,
            step_ms_median=median,
            step_ms_p10=_quantile(times, 0.1),
            step_ms_p90=_quantile(times, 0.9),
            samples_per_s=samples * per_s if per_s else None,
            tokens_per_s=tokens * per_s if per_s and tokens else None,
            tflops=flops * per_s / 1e12 if per_s else None,
            mfu=flops * per_s / 1e12 / peak if per_s and peak else None,
            mem_peak=self.mem_peak,
            loss_first=self.loss_first,
            loss_final=self.loss_final,
            skipped_steps=self.skipped,
            compile_s=self.compile_s,
            wall_s=round(time.monotonic() - self.started, 3),
            error=error,
        )


def _quantile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


@dataclass
class Setup:
    """Everything built before the first step."""

    preset: Preset
    info: DeviceInfo
    policy: PrecisionPolicy
    workload: Workload
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    dims: dict[str, int]
    batch_size: int
    nan: torch.Tensor  # a device scalar for "not measured", made once
    fp8: ev.Fp8Layers | None = None  # the layers an fp8 run converted


def build(preset: Preset, info: DeviceInfo) -> Setup:
    require_fp8_support(preset, info)  # refuse fp8 where it cannot run, before building anything
    torch.manual_seed(preset.seed)
    policy = precision_policy(preset)
    set_matmul_precision(policy.tf32)
    dims, batch_size = resolve_workload(preset, on_cuda=info.is_cuda)
    workload = build_workload(preset.workload.kind, dims, batch_size, info.device, preset.seed)
    model = workload.model
    fp8_layers = convert_for_fp8(model, preset, info)  # None unless precision = "fp8"
    if (
        policy.param_dtype != torch.float32
    ):  # pure casts: weights, grads and AdamW state in one dtype
        model.to(policy.param_dtype)
        pool = workload.pool  # type: ignore[attr-defined]
        if pool.inputs.is_floating_point():
            pool.inputs = pool.inputs.to(policy.param_dtype)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=preset.lr, weight_decay=0.0, fused=True if info.is_cuda else None
    )
    s = preset.scaler
    scaler = torch.amp.GradScaler(
        info.device.type,
        enabled=policy.use_scaler,
        init_scale=s.init_scale,
        growth_factor=s.growth_factor,
        backoff_factor=s.backoff_factor,
        growth_interval=s.growth_interval,
    )
    if preset.compile != "off":
        model = torch.compile(
            model, mode=preset.compile, fullgraph=preset.fullgraph, dynamic=preset.dynamic
        )
    nan = torch.full((), NAN, device=info.device)
    return Setup(
        preset, info, policy, workload, model, optimizer, scaler, dims, batch_size, nan, fp8_layers
    )


def train_step(s: Setup, step: int, measure_zeros: bool) -> torch.Tensor:
    """One optimizer step. Returns the metric vector, still on the device."""
    x, y = s.workload.batch(step)
    with s.policy.autocast(s.info.device.type):
        output = s.model(x)
        loss = s.workload.loss(output, y)
    zeros = ZeroGradCounter(output, s.nan) if measure_zeros else None
    if step == s.preset.debug.inf_loss_at_step > 0:
        loss = loss * math.inf
    if step == s.preset.debug.raise_at_step > 0:
        raise RuntimeError(f"failure injected at step {step} (debug.raise_at_step)")
    s.scaler.scale(loss).backward()
    s.scaler.unscale_(s.optimizer)  # clip true gradients, not scaled ones
    grad_norm = clip_grad_norm_(s.model.parameters(), s.preset.grad_clip or math.inf)
    scale_before = scaler_scale(s.scaler, s.nan)
    s.scaler.step(s.optimizer)  # skipped inside when the gradients hold inf/NaN
    s.scaler.update()  # halves the scale after a skip, grows it after growth_interval good steps
    s.optimizer.zero_grad(set_to_none=True)
    return torch.stack(
        [
            loss.detach().float(),
            grad_norm.float(),
            scale_before,
            scaler_scale(s.scaler, s.nan),
            zeros.fraction if zeros else s.nan,
        ]
    )


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
        self.fraction = (grad == 0).float().mean()


def scaler_scale(scaler: torch.amp.GradScaler, nan: torch.Tensor) -> torch.Tensor:
    """The current loss scale as a device tensor (``get_scale()`` would sync)."""
    scale = getattr(scaler, "_scale", None) if scaler.is_enabled() else None
    return scale.detach().clone().float().reshape(()) if scale is not None else nan


class StepReporter:
    """Turns finished steps into step events and keeps the run's statistics."""

    def __init__(self, s: Setup, writer: EventWriter, stats: RunStats, peak: float | None) -> None:
        self.s, self.writer, self.stats, self.peak = s, writer, stats, peak
        self.process = psutil.Process()
        self.warned_skip = False
        self.rss: int | None = None

    def report(self, item: FinishedStep) -> None:
        s, stats = self.s, self.stats
        loss, grad_norm, before, after, zeros = item.values
        scaled = s.policy.use_scaler
        skipped = scaled and after < before
        stats.steps_done = item.step + 1
        stats.step_ms.append(item.step_ms)
        stats.skipped += skipped
        if math.isfinite(loss):
            stats.nonfinite_run = 0
            stats.loss_final = loss
            if stats.loss_first is None:
                stats.loss_first = loss
        else:
            stats.nonfinite_run += 1
        allocated, reserved, peak_mem = self.memory()
        stats.mem_peak = max(stats.mem_peak or 0, peak_mem or allocated or 0) or None
        seconds = item.step_ms / 1000.0
        tflops = s.workload.flops_per_step / seconds / 1e12
        self.writer.emit(
            ev.StepEvent(
                step=item.step,
                step_ms=round(item.step_ms, 4),
                loss=loss if math.isfinite(loss) else None,
                loss_scale=after if scaled else None,
                skipped=skipped,
                grad_norm=grad_norm if math.isfinite(grad_norm) else None,
                samples_per_s=s.workload.samples_per_step / seconds,
                tokens_per_s=s.workload.tokens_per_step / seconds
                if s.workload.tokens_per_step
                else None,
                tflops=tflops,
                mfu=tflops / self.peak if self.peak else None,
                mem_allocated=allocated,
                mem_reserved=reserved,
                mem_peak=peak_mem,
                grad_zero_frac=None if math.isnan(zeros) else zeros,
                lr=s.preset.lr,
            )
        )
        if skipped and not self.warned_skip:
            self.warned_skip = True
            self.writer.emit(
                ev.WarningEvent(
                    code="skipped-step",
                    step=item.step,
                    message=(
                        f"GradScaler skipped step {item.step}: gradients held inf/NaN; loss scale "
                        f"{before:g} -> {after:g}. A few early skips are normal while the scale settles."
                    ),
                ),
                urgent=True,
            )
        if scaled and after < 1.0 and before >= 1.0:
            self.writer.emit(
                ev.WarningEvent(
                    code="scale-collapse",
                    step=item.step,
                    message=(
                        f"Loss scale fell below 1 ({after:g}) at step {item.step}: gradients overflow even "
                        "unscaled. Look for inf/NaN in the forward pass or lower the learning rate."
                    ),
                ),
                urgent=True,
            )
        if not math.isfinite(loss) and (
            not scaled or stats.nonfinite_run >= MAX_NONFINITE_WITH_SCALER
        ):
            raise NonFiniteLoss(item.step, loss)

    def memory(self) -> tuple[int | None, int | None, int | None]:
        if self.s.info.is_cuda:
            d = self.s.info.device
            return (
                torch.cuda.memory_allocated(d),
                torch.cuda.memory_reserved(d),
                torch.cuda.max_memory_allocated(d),
            )
        if self.stats.steps_done % RSS_EVERY == 1 or self.rss is None:  # ~30 us a read
            self.rss = self.process.memory_info().rss
        return self.rss, None, None


def train(
    s: Setup, writer: EventWriter, stats: RunStats, peak: float | None, stop: threading.Event
) -> str:
    """Run the steps. Returns 'ok' or 'stopped'; faults propagate as exceptions."""
    preset = s.preset
    reporter = StepReporter(s, writer, stats, peak)
    probe = make_probe(s.info.device, width=5)
    compiled = preset.compile != "off"
    compile_watch = CompileWatch(writer) if compiled else None
    writer.emit(
        ev.PhaseEvent(phase="compile" if compiled else "train", state="start", step=0), urgent=True
    )
    status = "ok"
    for step in range(preset.steps):
        if stop.is_set() or writer.broken:
            status = "stopped"
            break
        measure_zeros = preset.grad_zero_every > 0 and step % preset.grad_zero_every == 0
        t0 = time.perf_counter()
        probe.begin()
        metrics = train_step(s, step, measure_zeros)
        probe.end(step, metrics)
        if compiled and step == 0:
            stats.compile_s = round(time.perf_counter() - t0, 3)
            writer.emit(
                ev.PhaseEvent(phase="compile", state="end", seconds=stats.compile_s, step=0),
                urgent=True,
            )
            writer.emit(ev.PhaseEvent(phase="train", state="start", step=1), urgent=True)
        if compile_watch is not None:
            compile_watch.after_step(step, stats.compile_s)
        for item in probe.poll():
            reporter.report(item)
    for item in probe.drain():
        reporter.report(item)
    last_step = stats.steps_done - 1 if stats.steps_done else None
    writer.emit(ev.PhaseEvent(phase="train", state="end", step=last_step), urgent=True)
    return status
