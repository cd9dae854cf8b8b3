"""Everything built before the first step: workload, precision, optimizer, scaler, compile."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import psutil
import torch

from ampscope.core import events as ev
from ampscope.core.memory.host import current_rss
from ampscope.core.presets import Preset, WorkloadSizes, resolve_workload
from ampscope.core.presets.optimizer import adamw_flags
from ampscope.core.workload import ModelContext
from ampscope.engine.device import DeviceInfo
from ampscope.engine.ranks.link import Link, SoloLink
from ampscope.engine.step.flops import FlopFigures, choose_flops, measure_train_flops
from ampscope.engine.step.fp8 import convert_for_fp8
from ampscope.engine.step.fp32_modules import keep_in_fp32
from ampscope.engine.step.module_calls import called_modules
from ampscope.engine.step.parallelize import parallelize
from ampscope.engine.step.precision import PrecisionPolicy, precision_policy, set_matmul_precision
from ampscope.engine.step.validation import RunWarning, training_state_warning
from ampscope.engine.workloads import TrainingWorkload, build_workload
from ampscope.engine.workloads.user import build_user_workload
from ampscope.engine.workloads.user_code import exception_text


@dataclass
class Setup:
    preset: Preset
    info: DeviceInfo
    policy: PrecisionPolicy
    workload: TrainingWorkload
    model: torch.nn.Module  # the workload's model, wrapped (DDP, FSDP2) and compiled as asked
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    dims: dict[str, int]  # a built-in workload's dimensions; empty for a user's model
    batch_size: int  # per rank
    nan: torch.Tensor  # a device scalar for "not measured", made once
    flops: FlopFigures  # the formula's and FlopCounterMode's figures, and the one MFU uses
    fp8: ev.Fp8Layers | None = None  # the layers an fp8 run converted
    link: Link = field(default_factory=SoloLink)  # the other ranks, if any
    rss_before_model: int | None = None  # process RSS before the model was built (CPU runs)


def build(
    preset: Preset,
    info: DeviceInfo,
    link: Link | None = None,
    sizes: WorkloadSizes | None = None,
    workload_of: Callable[..., tuple[TrainingWorkload, dict[str, int]]] | None = None,
    compile: Callable[[torch.nn.Module, Preset], torch.nn.Module] | None = None,
) -> Setup:
    """The run as it will train. ``lifecycle.training.train_preset`` calls this after ``validation.require_runnable``
    has said that the run can go ahead here, with the sizes that check resolved (None: resolved
    here, as a test or a benchmark builds a run directly). ``workload_of`` and ``compile`` are
    ``make_workload`` and ``compile_model`` unless given."""
    link = link or SoloLink()
    workload_of = workload_of or make_workload
    compile = compile or compile_model
    policy = precision_policy(preset, info.is_cuda, link.grouped)
    torch.manual_seed(preset.seed)
    set_matmul_precision(policy.tf32)
    rss_before = None if info.is_cuda else current_rss()
    workload, dims = workload_of(preset, info, link, sizes)
    workload.prepare()  # a user's model: its first batch read (batch size, tokens)
    flops = count_flops(workload)  # model FLOPs of the plain model: before fp8 and compile
    called = fp8_probe(workload) if preset.precision == "fp8" else None
    fp8_layers = convert_for_fp8(workload.model, preset, info, called)  # None unless fp8
    keep_in_fp32(workload.model, preset.fp32_modules, info.device.type)  # AMP: fp32_modules
    policy.cast(workload)
    batch_size = workload.samples_per_step
    workload.pool.shard(link.rank, link.world_size)
    model = parallelize(workload.model, preset, policy, info, link.grouped)
    optimizer = make_optimizer(model, preset, policy)  # after sharding: FSDP2 replaces them
    scaler = policy.grad_scaler(info.device, preset.scaler)
    model = compile(model, preset)
    nan = torch.full((), float("nan"), device=info.device)
    return Setup(
        preset,
        info,
        policy,
        workload,
        model,
        optimizer,
        scaler,
        dims,
        batch_size,
        nan,
        flops,
        fp8_layers,
        link,
        rss_before,
    )


def make_optimizer(
    model: torch.nn.Module, preset: Preset, policy: PrecisionPolicy
) -> torch.optim.Optimizer:
    """AdamW with the preset's ``[optimizer]`` flags; ``auto`` is the fused kernel where the
    precision policy allows it (CUDA without a sharded scaler), torch's default elsewhere."""
    fused, foreach = adamw_flags(preset.optimizer, policy.fused_adamw)
    return torch.optim.AdamW(
        model.parameters(), lr=preset.lr, weight_decay=0.0, fused=fused, foreach=foreach
    )


def make_workload(
    preset: Preset, info: DeviceInfo, link: Link | None = None, sizes: WorkloadSizes | None = None
) -> tuple[TrainingWorkload, dict[str, int]]:
    """The user's model when ``workload.model`` names one, else the built-in kind."""
    if preset.workload.model is not None:
        batch = None if preset.batch_size == "auto" else preset.batch_size
        link = link or SoloLink()
        where = (link.rank, link.world_size, getattr(link, "local_rank", 0))
        ctx = ModelContext(info.device, batch, preset.seed, preset.precision, *where)
        return build_user_workload(preset.workload.model, ctx), {}
    dims, batch_size = sizes or resolve_workload(preset, on_cuda=info.is_cuda)
    return build_workload(preset.workload.kind, dims, batch_size, info.device, preset.seed), dims


def memory_estimate(s: Setup) -> RunWarning | None:
    """A warning when the planner already puts the built model's training state above the
    device's memory (the host's, for a CPU run)."""
    params = sum(p.numel() for p in s.model.parameters())
    total = s.info.total_memory if s.info.is_cuda else psutil.virtual_memory().total
    return training_state_warning(s.preset, s.info, params, total)


def fp8_probe(workload: TrainingWorkload) -> list[str] | None:
    """The modules the first batch's forward calls, in order: the last linear one is the head."""
    return called_modules(workload.model, workload.first_batch(), workload.forward)


def count_flops(workload: TrainingWorkload) -> FlopFigures:
    """The formula checked against FlopCounterMode (one forward and backward of the first
    batch, on the meta device). A model torch cannot count still trains: the note says why."""
    try:
        count = measure_train_flops(
            workload.model, workload.first_batch(), workload.loss, forward=workload.forward
        )
    except Exception as exc:  # noqa: BLE001 - the count is a check, never a reason to fail
        exc.__traceback__ = None  # raised again by the model (one instance it keeps), it would
        # carry the count's frames into the step's failure, which then read as ampscope's
        return choose_flops(
            workload.flops_per_step, None, f"{type(exc).__name__}: {exception_text(exc)}"
        )
    return choose_flops(workload.flops_per_step, count, None)


def compile_model(model: torch.nn.Module, preset: Preset) -> torch.nn.Module:
    """Wrap only: torch.compile compiles on the first call, which the loop times as compile_s."""
    if preset.compile == "off":
        return model
    compiled = torch.compile(
        model, mode=preset.compile, fullgraph=preset.fullgraph, dynamic=preset.dynamic
    )
    assert isinstance(compiled, torch.nn.Module)  # a module compiles to an OptimizedModule
    return compiled
