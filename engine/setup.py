"""Everything built before the first step: workload, precision, optimizer, scaler, compile."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ampscope.core import events as ev
from ampscope.core.config import Preset, resolve_workload
from ampscope.engine.device import DeviceInfo
from ampscope.engine.flops import FlopFigures, choose_flops, measure_train_flops
from ampscope.engine.fp8 import convert_for_fp8, require_fp8_support
from ampscope.engine.precision import (
    PrecisionPolicy,
    check_device_support,
    precision_policy,
    set_matmul_precision,
)
from ampscope.engine.workloads import Workload, build_workload


@dataclass
class Setup:
    preset: Preset
    info: DeviceInfo
    policy: PrecisionPolicy
    workload: Workload
    model: torch.nn.Module  # the workload's model, compiled when the preset asks
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    dims: dict[str, int]
    batch_size: int
    nan: torch.Tensor  # a device scalar for "not measured", made once
    flops: FlopFigures  # the formula's and FlopCounterMode's figures, and the one MFU uses
    fp8: ev.Fp8Layers | None = None  # the layers an fp8 run converted


def build(preset: Preset, info: DeviceInfo, policy: PrecisionPolicy | None = None) -> Setup:
    require_fp8_support(preset, info)  # refuse fp8 where it cannot run, before building anything
    policy = policy or precision_policy(preset)
    torch.manual_seed(preset.seed)
    set_matmul_precision(policy.tf32)
    dims, batch_size = resolve_workload(preset, on_cuda=info.is_cuda)
    workload = build_workload(preset.workload.kind, dims, batch_size, info.device, preset.seed)
    flops = count_flops(workload)  # model FLOPs of the plain model: before fp8 and compile
    fp8_layers = convert_for_fp8(workload.model, preset, info)  # None unless precision = "fp8"
    policy.cast(workload)
    optimizer = torch.optim.AdamW(
        workload.model.parameters(),
        lr=preset.lr,
        weight_decay=0.0,
        fused=True if info.is_cuda else None,
    )
    scaler = policy.grad_scaler(info.device, preset.scaler)
    model = compile_model(workload.model, preset)
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
    )


def count_flops(workload: Workload) -> FlopFigures:
    """The formula checked against FlopCounterMode (one forward and backward of the first
    batch, on the meta device). A model torch cannot count still trains: the note says why."""
    try:
        count = measure_train_flops(workload.model, workload.batch(0), workload.loss)
    except Exception as exc:  # noqa: BLE001 - the count is a check, never a reason to fail
        return choose_flops(workload.flops_per_step, None, f"{type(exc).__name__}: {exc}")
    return choose_flops(workload.flops_per_step, count, None)


def compile_model(model: torch.nn.Module, preset: Preset) -> torch.nn.Module:
    """Wrap only: torch.compile compiles on the first call, which the loop times as compile_s."""
    if preset.compile == "off":
        return model
    return torch.compile(
        model, mode=preset.compile, fullgraph=preset.fullgraph, dynamic=preset.dynamic
    )


def check_setup(preset: Preset, policy: PrecisionPolicy, info: DeviceInfo) -> list[tuple[str, str]]:
    """Refuse (ConfigError) what this device cannot run, before anything is built; return
    (code, message) warnings for what it runs slowly or differently."""
    found = check_device_support(policy, info)
    if preset.compile == "reduce-overhead" and not info.is_cuda:
        found.append(
            (
                "cudagraphs-cpu",
                "compile = 'reduce-overhead' relies on CUDA graphs; on the CPU it compiles like "
                "'default'.",
            )
        )
    return found
