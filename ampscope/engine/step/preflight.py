"""Before anything is built: will the run fit in memory? Refuse what cannot, warn what may not.

``batch_size = 400000`` on a CPU asks for 13 GB just for the MLP's pool of batches; found by
the allocator, that is a host swapping for minutes or an out-of-memory kill. The estimate is
the memory planner's (``ampscope.core.memory.plan``: weights, gradients, optimizer state,
transformer activations) plus what this engine's workloads hold: the pool of batches (built
on the host first, then moved to the device) and the activations of the MLP and CNN.
A rough figure is enough: the check is for runs far beyond the machine, not near its limit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import psutil

from ampscope.core.memory import plan as memory_plan
from ampscope.core.presets import ConfigError, Preset, WorkloadSizes, resolve_workload
from ampscope.core.units import fmt_bytes
from ampscope.engine.device import DeviceInfo
from ampscope.engine.workloads import cnn, gpt, mlp

HOST_SHARE = 0.5
"""Most of the host a run may take: it is shared (the OS, the dashboard, other users), and a
host that runs out swaps for minutes before anything fails. Above a quarter, a warning."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a run needs at its peak: on the host while the batches are built, on its device."""

    data: int  # the pool of batches, at its peak while built
    model: int  # weights, gradients, optimizer state
    casts: int  # the 16-bit weight copies autocast makes each step
    activations: int  # what one step keeps for its backward pass

    @property
    def device_total(self) -> int:
        return self.data + self.model + self.casts + self.activations

    def parts(self) -> str:
        return (
            f"batches {fmt_bytes(self.data)}, weights and optimizer state "
            f"{fmt_bytes(self.model + self.casts)}, activations {fmt_bytes(self.activations)}"
        )


def pool_bytes(kind: str, dims: dict[str, int], batch: int) -> int:
    """The pool of batches a workload builds, at its peak (temporaries included)."""
    if kind == "mlp":
        n = mlp.POOL_BATCHES * batch
        return n * (dims["width"] * 4 + dims["classes"] * 4 + 8)  # x, x @ teacher, labels
    if kind == "cnn":
        n = cnn.POOL_BATCHES * batch
        image = 3 * dims["image_size"] ** 2 * 4
        return n * (3 * image + 8)  # templates[y], the noise, their sum; labels
    n, length = gpt.POOL_BATCHES * batch, dims["seq_len"] + 1
    return n * length * (8 + 8 + 4 + 1 + 2 * 8)  # seqs, noise, rand, follow; inputs, targets


def builtin_activation_bytes(kind: str, dims: dict[str, int], batch: int, value_bytes: int) -> int:
    """One step's saved activations (and the fp32 logits the loss makes)."""
    if kind == "mlp":
        hidden = batch * dims["width"] * (dims["layers"] - 1) * 2  # each Linear's and GELU's input
        return (hidden + batch * dims["width"]) * value_bytes + batch * dims["classes"] * 12
    if kind == "cnn":
        total, channels, size = 0, 3, dims["image_size"]
        for i in range(dims["layers"]):
            out = dims["width"] * 2 ** min(i, 3)
            total += batch * (channels + 2 * out) * size * size  # conv input, conv and relu out
            channels, size = out, max(size // 2, 1)
        return total * value_bytes
    shape = memory_plan.Shape(
        dims["layers"], dims["width"], dims["heads"], dims["seq_len"], batch, dims["vocab"]
    )
    return memory_plan.saved_activation_bytes(shape, value_bytes) + (
        memory_plan.logits_bytes(shape, value_bytes) or 0
    )


def estimate(preset: Preset, on_cuda: bool, sizes: WorkloadSizes | None = None) -> MemoryEstimate:
    """``sizes``: the workload's, already resolved (else resolved here)."""
    dims, batch = sizes or resolve_workload(preset, on_cuda=on_cuda)
    kind = preset.workload.kind
    workload = memory_plan.workload_from(kind, dims, batch, preset.precision)
    plan = memory_plan.plan_regime(workload.params, workload.regime)
    return MemoryEstimate(
        data=pool_bytes(kind, dims, batch),
        model=plan.static,
        casts=plan.cast_copies,
        activations=builtin_activation_bytes(
            kind, dims, batch, memory_plan.REGIMES[workload.regime].activation_bytes
        ),
    )


def host_memory() -> tuple[int, int]:
    """(available now, total) bytes of this machine's memory."""
    vm = psutil.virtual_memory()
    return vm.available, vm.total


def check_memory(
    preset: Preset,
    device_name: str,
    on_cuda: bool,
    device_memory: Callable[[], tuple[int, int]] | None = None,
    host: Callable[[], tuple[int, int]] | None = None,
    sizes: WorkloadSizes | None = None,
) -> list[tuple[str, str]]:
    """ConfigError for a run that cannot fit; (code, message) warnings for one that may not.

    ``device_memory`` gives a GPU's (free, total) bytes; a CPU run's device is the host.
    ``sizes``: the workload's, already resolved (else resolved here).
    """
    sizes = sizes or resolve_workload(preset, on_cuda=on_cuda)
    need = estimate(preset, on_cuda, sizes)
    batch = sizes[1]
    run = f"batch_size = {batch} with the {preset.workload.kind} workload ({preset.precision})"
    host_need = need.data if on_cuda else need.device_total
    checks = [("host", host_need, host or host_memory, HOST_SHARE)]
    if on_cuda and device_memory is not None:
        checks.append((device_name, need.device_total, device_memory, memory_plan.FIT_FRACTION))
    warnings = []
    for where, bytes_needed, memory, share in checks:
        try:
            available, total = memory()
        except Exception:  # noqa: BLE001 - a device that cannot say is not refused
            continue
        needs = f"{run} needs about {fmt_bytes(bytes_needed)} of {where} memory ({need.parts()})"
        limit = min(available, share * total)
        if bytes_needed > limit:
            raise ConfigError(
                f"{needs}, more than a run may take here: {fmt_bytes(limit)} ({share:.0%} of "
                f"the {where}'s {fmt_bytes(total)}, {fmt_bytes(available)} available now). "
                "Lower batch_size or the workload's size (workload.size, workload.width, "
                "workload.layers).",
                key="batch_size",
            )
        if bytes_needed > share / 2 * total:
            warnings.append(
                (
                    "memory-estimate",
                    f"{needs}, of {fmt_bytes(available)} available: it may swap or run out "
                    "of memory.",
                )
            )
    return warnings


def gpu_memory(info: DeviceInfo) -> Callable[[], tuple[int, int]] | None:
    """A CUDA device's (free, total) bytes, asked when called; None for a CPU run."""
    if not info.is_cuda:
        return None
    import torch

    return lambda: torch.cuda.mem_get_info(info.device)
