"""What can be told about a run from the objects the user hands over, for its ``hello``.

The device is where the model's parameters live; the number format comes from the parameters'
dtype and the scaler, or from ``precision=``, since autocast is invisible from outside the
loop. MFU is measured against the same datasheet peaks as engine runs (``core.machine.hardware``).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ampscope.core import events as ev
from ampscope.core.machine import check
from ampscope.core.machine.hardware import peak_tflops
from ampscope.core.memory.host import current_rss
from ampscope.engine.device import DeviceInfo, cpu_name, host_fields, resolve_device
from ampscope.watching.options import Options
from ampscope.watching.readout import host_lr

COMPUTE_DTYPE = {"amp-bf16": "bf16", "amp-fp16": "fp16"}
PARAM_PRECISION = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}


@dataclass
class RunFacts:
    info: DeviceInfo
    precision: str
    precision_inferred: bool
    compiled: bool
    param_count: int
    peak: float | None
    peak_note: str
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def compute_dtype(self) -> str:
        return COMPUTE_DTYPE.get(self.precision, self.precision)


def watched_facts(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scaler: Any,
    options: Options,
    name: str,
) -> RunFacts:
    params = list(model.parameters())
    device = params[0].device if params else torch.device("cpu")
    info = device_info(device)
    precision = options.precision or infer_precision(params, scaler, info)
    facts = RunFacts(
        info=info,
        precision=precision,
        precision_inferred=options.precision is None,
        compiled=looks_compiled(model),
        param_count=sum(p.numel() for p in params),
        peak=None,
        peak_note="",
    )
    facts.peak, facts.peak_note = _peak(facts, options)
    facts.config = {
        "name": name,
        "source": "watch",
        "precision": precision,
        "compile": "on" if facts.compiled else "off",
        "device": str(info.device),
        "steps": options.steps,
        "warmup_steps": options.warmup_steps,
        "lr": first_lr(optimizer),
        "workload": {"kind": "custom", "model": type(model).__name__},
        "optimizer": type(optimizer).__name__ if optimizer is not None else None,
        "grad_scaler": "on" if scaler_enabled(scaler) else "off",
        "scaler": scaler_settings(scaler),
        "allow_stop": options.allow_stop,
        "grad_zero_every": options.grad_zero_every,  # 0: never measured (the card says off)
    }
    return facts


def device_info(device: torch.device) -> DeviceInfo:
    if device.type == "cuda":
        try:
            return resolve_device(str(device))
        except Exception:  # noqa: BLE001 - a driver hiccup: fall back to the name torch gives
            return DeviceInfo(device, torch.cuda.get_device_name(device), None, None, None, None)
    name = cpu_name() if device.type == "cpu" else device.type
    return DeviceInfo(device, name, None, None, None, None)


def infer_precision(params: Sequence[torch.Tensor], scaler: Any, info: DeviceInfo) -> str:
    dtype = next((p.dtype for p in params if p.is_floating_point()), torch.float32)
    if dtype in PARAM_PRECISION:
        return PARAM_PRECISION[dtype]
    if scaler_enabled(scaler):
        return "amp-fp16"
    if info.is_cuda and getattr(torch.backends.cuda.matmul, "fp32_precision", "") == "tf32":
        return "tf32"
    return "fp32"


def looks_compiled(model: torch.nn.Module) -> bool:
    """torch.compile(model), model.compile(), or a compiled submodule."""
    return any(
        hasattr(m, "_orig_mod") or getattr(m, "_compiled_call_impl", None) is not None
        for m in model.modules()
    )


def scaler_enabled(scaler: Any) -> bool:
    return scaler is not None and bool(getattr(scaler, "is_enabled", lambda: False)())


def scaler_settings(scaler: Any) -> dict[str, float] | None:
    if not scaler_enabled(scaler):
        return None
    names = ("init_scale", "growth_factor", "backoff_factor", "growth_interval")
    return {n: getattr(scaler, f"_{n}") for n in names if hasattr(scaler, f"_{n}")}


def first_lr(optimizer: torch.optim.Optimizer | None) -> float:
    """The first parameter group's learning rate, read without a device sync (0 if unknown)."""
    if optimizer is None or not optimizer.param_groups:
        return 0.0
    return host_lr(optimizer.param_groups[0].get("lr", 0.0))


def _peak(facts: RunFacts, options: Options) -> tuple[float | None, str]:
    if options.peak_tflops is not None:
        return float(options.peak_tflops), "peak_tflops given to ampscope.watch()"
    if facts.info.is_cuda:
        return peak_tflops(facts.info.name, facts.compute_dtype, facts.info.power_limit_w)
    return None, "no peak TFLOP/s for CPUs; pass peak_tflops= to ampscope.watch() to get MFU"


def measured_peak(device_name: str, compute_dtype: str, cuda: bool) -> float | None:
    """This machine's measured peak for the loop's format (``ampscope doctor --bench``), read
    once; a CPU has no TF32, so tf32 reads fp32's. None without a kept check."""
    fmt = "fp32" if not cuda and compute_dtype == "tf32" else compute_dtype
    try:
        return check.measured_tflops(device_name, fmt)
    except OSError:
        return None


def rss_without_model(model: torch.nn.Module) -> int:
    """The process RSS less the model's parameters and buffers: as near as a loop that built
    its model before watching allows to the engine's reading from before the model was built
    (``ampscope memory --run`` compares the peak's growth from it with the planner)."""
    tensors = itertools.chain(model.parameters(), model.buffers())
    held = sum(t.numel() * t.element_size() for t in tensors if t.device.type == "cpu")
    return max(0, current_rss() - held)


def hello_event(
    facts: RunFacts,
    run_id: str,
    run_dir: str | None,
    flops: float | None,
    allow_stop: bool,
    rss_before_model: int | None = None,
) -> ev.HelloEvent:
    info = facts.info
    return ev.HelloEvent(
        run_id=run_id,
        run_dir=run_dir,
        preset=str(facts.config["name"]),
        config=facts.config,
        **host_fields(info),
        compute_dtype=facts.compute_dtype,
        peak_tflops=facts.peak,
        peak_tflops_note=facts.peak_note,
        measured_tflops=measured_peak(info.name, facts.compute_dtype, info.is_cuda),
        param_count=facts.param_count,
        flops_per_step=flops or 0.0,
        samples_per_step=0,
        tokens_per_step=None,
        source="watch",
        allow_stop=allow_stop,
        rss_before_model=rss_before_model,
    )
