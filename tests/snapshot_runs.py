"""Fixed runs for the snapshot tests: a run source frozen in time, and records with fixed names.

Every number is a function of the step, so a snapshot is the same on every machine and day.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from pathlib import Path

from ampscope.core import events as ev
from ampscope.core import records
from ampscope.tui.model.run_state import RunState
from ampscope.tui.model.source import RESTART, STOP
from tests.helpers import done, hello, split_profile, step

GIB = 1 << 30
MIB = 1 << 20
STARTED = 1_796_000_000.0  # 2026-11-30 (UTC): when the recorded runs started


class FrozenSource:
    """A run source whose state does not move: a live run at one instant, or a finished one."""

    def __init__(self, state: RunState, note: str = "", live: bool = True) -> None:
        self.state = state
        self.note = note
        self.live = live

    def label(self) -> str:
        return self.note

    def allows(self, control: str) -> bool | None:
        if control == STOP:
            return True if self.live else None
        return control == RESTART

    def why_not(self, control: str) -> str:
        return "the run has ended"

    async def feed(self) -> None:
        await asyncio.Event().wait()  # never ends: live runs end when they end

    async def stop(self) -> None:
        return

    async def restart(self) -> None:
        return


def gpu_run() -> RunState:
    """amp-fp16 on an H100, step 600 of 1000: the loss scale halved twice, two steps skipped."""
    state = RunState(label="amp-fp16")
    config = {"name": "amp-fp16", "precision": "amp-fp16", "compile": "off", "steps": 1000}
    state.ingest(ev.PhaseEvent(phase="setup", state="start"))
    state.ingest(
        hello(
            preset="amp-fp16",
            config={**config, "device": "cuda"},
            device="cuda:0",
            device_name="NVIDIA H100 80GB HBM3",
            compute_dtype="float16",
            peak_tflops=989.4,
            param_count=124_000_000,
            samples_per_step=16,
            tokens_per_step=16_384,
            started_at=STARTED,
        )
    )
    state.ingest(ev.PhaseEvent(phase="train", state="start", step=0, t=2.0))
    scale = 65536.0
    for i in range(600):
        skipped = i in (120, 400)
        if skipped:
            scale /= 2
        t = 2.0 + i * 0.045
        ms = 42.0 + 3.0 * math.sin(i / 7) + (30.0 if i == 300 else 0.0)
        state.ingest(
            step(
                i,
                ms,
                loss=3.0 + 7.0 * math.exp(-i / 150) + 0.05 * math.sin(i),
                loss_scale=scale,
                skipped=skipped,
                samples_per_s=16_000 / ms,
                tokens_per_s=16_384_000 / ms,
                tflops=395.0 + 5 * math.sin(i / 11),
                mfu=0.40 + 0.005 * math.sin(i / 11),
                mem_allocated=18 * GIB + (i % 40) * MIB,
                mem_reserved=22 * GIB,
                mem_peak=20 * GIB,
                grad_zero_frac=0.0004 if i % 10 == 0 else None,
                t=t,
            )
        )
        if skipped:
            state.ingest(
                ev.WarningEvent(
                    code="skipped-step",
                    message=f"GradScaler skipped step {i}: gradients held inf/NaN",
                    step=i,
                    t=t,
                )
            )
        if i % 22 == 0:
            state.ingest(
                ev.SysEvent(
                    t=t,
                    gpu_util=96.0 + 3 * math.sin(i),
                    cpu_util=11.0 + math.sin(i / 3),
                    proc_cpu=104.0,
                    gpu_mem_used=23 * GIB,
                    gpu_mem_total=80 * GIB,
                    power_w=655.0,
                )
            )
    return state


def underflow_run() -> RunState:
    """amp-fp16 without a scaler on a CPU, finished: grad zeros climb as gradients shrink."""
    state = RunState(label="amp-fp16-noscale")
    config = {"name": "amp-fp16-noscale", "precision": "amp-fp16", "compile": "off", "steps": 300}
    state.ingest(
        hello(
            preset="amp-fp16-noscale",
            config={**config, "device": "cpu"},
            device="cpu",
            device_name="AMD EPYC",
            compute_dtype="float16",
            param_count=1_200_000,
            started_at=STARTED,
        )
    )
    state.ingest(
        ev.WarningEvent(
            code="slow-fp16-cpu",
            message="AMD EPYC has no fp16 arithmetic units: fp16 runs are emulated and slower",
            t=1.0,
        )
    )
    for i in range(300):
        t = 1.5 + i * 0.5
        state.ingest(
            step(
                i,
                480.0 + 40 * math.sin(i / 5),
                loss=0.3 + 2.5 * math.exp(-i / 60),
                samples_per_s=260.0,
                tflops=0.0005,
                mem_allocated=int(325.5 * MIB) + (i % 3) * 8_000,  # a 0.02 MiB wobble
                mem_reserved=None,
                mem_peak=int(325.6 * MIB),
                grad_zero_frac=min(0.45, i / 600) if i % 5 == 0 else None,
                t=t,
            )
        )
        if i % 2 == 0:
            state.ingest(ev.SysEvent(t=t, cpu_util=98.0, proc_cpu=188.0))
    finished = done("ok", 300)
    finished.loss_first, finished.loss_final, finished.skipped_steps = 2.8, 0.31, 0
    finished.wall_s, finished.t = 151.5, 151.5
    state.ingest(finished)
    return state


def write_record(
    root: Path,
    name: str,
    preset: str,
    status: str,
    ms: float,
    steps: int,
    lift: float = 0.0,
    extra: Sequence[ev.Event] = (),
    zeros: float | None = None,
    skipped: int = 0,
    loss_final: float | None = None,
) -> Path:
    """A run folder with a fixed name: hello, ``steps`` steps, ``extra`` and how it ended;
    ``zeros``: the grad zeros every fifth step measures; ``skipped``: steps a GradScaler
    skipped; ``loss_final``: the final loss, when not the curve's unlifted end."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    items: list[ev.Event] = [
        hello(
            preset=preset,
            run_dir=str(run_dir),
            started_at=STARTED + len(list(root.iterdir())) * 600,
            config={"name": preset, "precision": preset, "compile": "off", "steps": 200},
        )
    ]
    for i in range(steps):
        loss = 2.0 / (1 + i / 20) + lift * (1 - i / 400)
        loss = float("nan") if status == "failed" and i == steps - 1 else loss
        measured = zeros if zeros is not None and i % 5 == 0 else None
        items.append(
            step(i, ms + (i % 5) * 0.2, loss=loss, t=1.0 + i * ms / 1000, grad_zero_frac=measured)
        )
    items += extra
    if status == "failed":
        items.append(ev.ErrorEvent(kind="nan", message=f"loss became nan at step {steps - 1}"))
    end = done(status, steps)
    end.step_ms_median, end.step_ms_p10, end.step_ms_p90 = ms + 0.4, ms, ms + 0.8
    end.samples_per_s, end.loss_final = 8000 / ms, 2.0 / (1 + (steps - 1) / 20)
    end.loss_final = end.loss_final if loss_final is None else loss_final
    end.skipped_steps = skipped
    if status == "failed":
        end.error = f"loss became nan at step {steps - 1}"
    items.append(end)
    (run_dir / records.EVENTS_FILE).write_bytes(b"".join(ev.encode(e) for e in items))
    return run_dir


def write_history(root: Path) -> list[Path]:
    """Four runs of a sweep: two finished, one stopped by the user, one failed."""
    return [
        write_record(root, "20261130T090000Z-fp32", "fp32", "ok", 12.0, 200),
        write_record(root, "20261130T091000Z-amp-bf16", "amp-bf16", "ok", 7.0, 200, 0.3),
        write_record(root, "20261130T092000Z-amp-fp16", "amp-fp16", "stopped", 6.5, 120, 0.6),
        write_record(root, "20261130T093000Z-fp16", "fp16", "failed", 5.0, 40, 1.0),
    ]


def write_underflow_pair(root: Path) -> list[Path]:
    """The underflow demonstration's sweep: amp-fp16 (a GradScaler: six skipped steps while its
    scale settles, few zeros) against amp-fp16-noscale (most gradient values lost to zero,
    its loss left high). The same speed: only the demonstration's columns differ."""
    return [
        write_record(
            root, "20261130T090000Z-amp-fp16", "amp-fp16", "ok", 6.5, 200, zeros=0.004, skipped=6
        ),
        write_record(
            root, "20261130T091000Z-amp-fp16-noscale", "amp-fp16-noscale", "ok", 6.5, 200,
            lift=1.2, zeros=0.85, loss_final=0.76,
        ),
    ]  # fmt: skip


FP32_SPLIT = dict(matmul_fp32=7.6, elementwise=1.4, norm=0.8, optimizer=1.0, idle=1.2)
BF16_SPLIT = dict(matmul_bf16=2.4, elementwise=1.1, casts=0.5, norm=0.7, optimizer=1.0, idle=1.3)


def write_profiled_runs(root: Path) -> list[Path]:
    """fp32 profiled twice (the later profile is its own), amp-bf16 once, amp-fp16 never."""
    early = split_profile(15.0, step=20, matmul_fp32=12.0, idle=3.0)
    return [
        write_record(
            root, "20261130T090000Z-fp32", "fp32", "ok", 12.0, 200,
            extra=[early, split_profile(12.0, step=150, **FP32_SPLIT)],
        ),
        write_record(
            root, "20261130T091000Z-amp-bf16", "amp-bf16", "ok", 7.0, 200, 0.3,
            extra=[split_profile(7.0, step=150, **BF16_SPLIT)],
        ),
        write_record(root, "20261130T092000Z-amp-fp16", "amp-fp16", "ok", 6.5, 200, 0.6),
    ]  # fmt: skip


def gpu_profile(step: int = 600) -> ev.ProfileEvent:
    """amp-fp16 on an H100, five steps profiled: matmuls in fp16, casts, some idle time."""
    ops = [
        ("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64", "matmul", 0.412, 240, "fp16"),
        ("void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add>", "elementwise", 0.081, 610, None),
        ("void at::native::unrolled_elementwise_kernel<direct_copy_kernel_cuda>", "elementwise", 0.064, 480, None),
        ("flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4>>", "attention", 0.058, 60, None),
        ("void at::native::vectorized_layer_norm_kernel<c10::Half, float>", "norm_act", 0.049, 130, None),
        ("void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor>", "optimizer", 0.045, 10, None),
        ("void at::native::_amp_foreach_non_finite_check_and_unscale_cuda", "loss_scaling", 0.018, 5, None),
        ("Memcpy HtoD (Pageable -> Device)", "memcpy", 0.011, 10, None),
    ]  # fmt: skip
    return ev.ProfileEvent(
        step=step,
        steps=5,
        step_ms=38.4,
        timing="device",
        classes={
            "matmul": 0.431,
            "attention": 0.062,
            "elementwise": 0.171,
            "norm_act": 0.083,
            "optimizer": 0.051,
            "loss_scaling": 0.021,
            "memcpy": 0.012,
            "idle": 0.162,
            "other": 0.007,
        },  # fmt: skip
        dtypes={"matmul": {"fp16": 0.431}},
        casts=0.064,
        top_ops=[ev.ProfileOp(name=n, kind=c, share=s, calls=k, dtype=d) for n, c, s, k, d in ops],
        trace=f"runs/20260301T101500Z-amp-fp16/profile-step{step}.trace.json.gz",
        trace_bytes=812_000,
    )
