"""Which device a run uses and what it can do. The only module that asks CUDA about hardware."""

from __future__ import annotations

import os
import platform
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from ampscope.core.machine.hardware import CPU_UNITS
from ampscope.core.presets import ConfigError
from ampscope.engine.ranks import RankEnv


@dataclass(frozen=True)
class DeviceInfo:
    device: torch.device
    name: str
    capability: tuple[int, int] | None
    total_memory: int | None
    power_limit_w: float | None
    uuid: str | None
    multiprocessors: int | None = None  # SMs this device has: a MIG slice has a share

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"


class Cuda(Protocol):
    """The few questions a run asks CUDA about its devices: ``torch.cuda`` answers them, and
    a test hands in a fake GPU instead."""

    def is_available(self) -> bool: ...
    def device_count(self) -> int: ...
    def current_device(self) -> int: ...
    def set_device(self, device: Any) -> None: ...
    def get_device_properties(self, device: Any) -> Any: ...


class CudaMemory(Protocol):
    """The CUDA allocator's figures a step reads: ``torch.cuda`` answers, or a test's fake."""

    def memory_stats_as_nested_dict(self, device: Any = None) -> dict[str, Any]: ...
    def max_memory_allocated(self, device: Any = None) -> int: ...
    def reset_peak_memory_stats(self, device: Any = None) -> None: ...


PowerLimit = Callable[[str | None], float | None]
"""A GPU's enforced board power limit by its UUID, in watts: None when NVML cannot say."""


def resolve_device(
    spec: str,
    ranks: RankEnv | None = None,
    cuda: Cuda | None = None,
    power_limit_w: PowerLimit | None = None,
) -> DeviceInfo:
    ranks = ranks or RankEnv()
    cuda = cuda or torch.cuda
    spec = ranks.device_spec(spec)
    if spec == "auto":
        spec = "cuda" if cuda.is_available() else "cpu"
    if spec == "cpu":
        return DeviceInfo(torch.device("cpu"), cpu_name(), None, None, None, None)
    if not cuda.is_available():
        build = torch.__version__ + ("" if torch.version.cuda else " (a CPU-only build)")
        raise ConfigError(
            f"device = '{spec}', but torch {build} sees no CUDA GPU. Accepted here: device = 'cpu' "
            "or 'auto'. On a GPU machine, check nvidia-smi and install a CUDA build of torch."
        )
    if ranks.distributed:
        spec = f"cuda:{rank_gpu(ranks, cuda)}"
    device = torch.device(spec)
    index = device.index if device.index is not None else cuda.current_device()
    if index >= cuda.device_count():
        raise ConfigError(
            f"device = '{spec}', but only {cuda.device_count()} CUDA device(s) are visible. "
            f"Accepted: cuda:0 to cuda:{cuda.device_count() - 1}."
        )
    device = torch.device("cuda", index)
    # CUDA events, synchronize() and the current stream follow the current device: without
    # this, on cuda:N the step would be timed (and its metrics read) on device 0.
    cuda.set_device(index)
    props = cuda.get_device_properties(index)
    uuid = str(getattr(props, "uuid", "")) or None
    return DeviceInfo(
        device,
        props.name,
        (props.major, props.minor),
        props.total_memory,
        (power_limit_w or nvml_power_limit_w)(uuid),
        uuid,
        getattr(props, "multi_processor_count", None),
    )


def rank_gpu(ranks: RankEnv, cuda: Cuda | None = None) -> int:
    """This rank's GPU: its local rank, once every rank on the machine is sure to have one."""
    count = (cuda or torch.cuda).device_count()
    if ranks.local_world_size > count:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
        raise ConfigError(
            f"--nproc-per-node {ranks.local_world_size} starts {ranks.local_world_size} "
            f"processes on this machine, but torch sees {count} CUDA GPU(s){where}. Accepted: "
            f"--nproc-per-node 1 to {count} (one process a GPU), or device = 'cpu' to run the "
            "ranks on the CPU (gloo)."
        )
    return ranks.local_rank


def nvml_power_limit_w(uuid: str | None) -> float | None:
    """The enforced board power limit, which tells SXM from PCIe parts. None when NVML cannot say."""
    from ampscope.engine.telemetry.nvml import find_gpu_handle, load_nvml, nvml_call, nvml_init

    nvml, _ = load_nvml()
    if nvml is None or nvml_init(nvml) is not None:
        return None
    try:
        handle, _ = find_gpu_handle(nvml, uuid)
        milliwatts, _ = (
            nvml_call(nvml, "nvmlDeviceGetEnforcedPowerLimit", handle) if handle else (None, None)
        )
        return milliwatts / 1000.0 if milliwatts else None
    finally:
        nvml_call(nvml, "nvmlShutdown")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_has_fast_bf16() -> bool:
    return cpu_has_units("bf16", cpu_flags())


def cpu_has_fast_fp16() -> bool:
    return cpu_has_units("fp16", cpu_flags())


def cpu_has_units(fmt: str, flags: set[str]) -> bool:
    """Whether ``flags`` (/proc/cpuinfo's) name a matmul unit for ``fmt``, by the one table
    of them the machine check's verdicts read too (``core.machine.hardware.CPU_UNITS``)."""
    return any(flag in flags for flag, _name in CPU_UNITS[fmt])


def host_fields(info: DeviceInfo) -> dict[str, Any]:
    """The hello fields that say which process, host, versions and device run the job: the
    same for an engine run and a watched loop."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started_at": time.time(),
        "python_version": sys.version.split()[0],
        "torch_version": str(torch.__version__),
        "cuda_version": torch.version.cuda,
        "device": str(info.device),
        "device_name": info.name,
        "compute_capability": list(info.capability) if info.capability else None,
    }
