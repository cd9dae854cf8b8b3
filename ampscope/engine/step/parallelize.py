"""The model on several ranks: DDP or FSDP2 around it, the scaler that fits, and a checksum.

DDP keeps a full replica on every rank and all-reduces gradients in the parameter dtype (fp32
under AMP), or cast to bf16/fp16 by its communication hook (``parallel.grad_compression``).
FSDP2 (``fully_shard``) keeps a shard of every parameter on each rank, all-gathers them in
``param_dtype`` for compute and reduce-scatters gradients in ``reduce_dtype``; under fp16 it
needs a ShardedGradScaler, whose inf/NaN verdict is all-reduced, or ranks would skip different
steps.
"""

from __future__ import annotations

import torch
from torch import nn

from ampscope.core.presets import Preset
from ampscope.core.presets.parallel import fsdp_dtypes
from ampscope.engine.device import DeviceInfo
from ampscope.engine.step.precision import DTYPES, PrecisionPolicy

CHECKSUM_MODULUS = 1_000_003  # position weights, so that swapped values change the sum


def parallelize(
    model: nn.Module, preset: Preset, policy: PrecisionPolicy, info: DeviceInfo, grouped: bool
) -> nn.Module:
    """The model each rank trains: itself outside a process group, else wrapped by the
    strategy."""
    if not grouped:
        return model
    if preset.parallel.strategy == "fsdp2":
        return shard(model, preset, policy)
    return replicate(model, preset, info)


def replicate(model: nn.Module, preset: Preset, info: DeviceInfo) -> nn.Module:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(model, device_ids=[info.device.index] if info.is_cuda else None)
    compression = preset.parallel.grad_compression
    if compression == "bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif compression == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    return ddp


def shard(model: nn.Module, preset: Preset, policy: PrecisionPolicy) -> nn.Module:
    """fully_shard every block of the model (each child of a ModuleList or Sequential that
    holds parameters), then the root: one all-gather a block, overlapped with compute."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    param_name, reduce_name = fsdp_dtypes(preset.precision, preset.parallel)
    param, reduce = DTYPES[param_name], DTYPES[reduce_name]
    mp = MixedPrecisionPolicy(  # None: no cast (compute as stored, reduce as computed)
        param_dtype=None if param == policy.param_dtype else param,
        reduce_dtype=None if reduce == param else reduce,
    )
    for block in shard_units(model):
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The outermost blocks (a block inside a chosen one is sharded with it)."""
    units: list[nn.Module] = []
    taken: set[int] = set()
    for container in model.modules():
        if not isinstance(container, (nn.ModuleList, nn.Sequential)):
            continue
        for block in container:
            params = {id(p) for p in block.parameters()}
            if params and not params & taken:
                units.append(block)
                taken |= params
    return units


def plain(t: torch.Tensor) -> torch.Tensor:
    """A DTensor (FSDP2's gradient norm) as the whole tensor it stands for."""
    full = getattr(t, "full_tensor", None)
    return full() if callable(full) else t


def param_checksum(model: nn.Module) -> str:
    """An exact fingerprint of the weights: their bits, weighted by position, summed in int64.

    Integer sums wrap identically in any order, so equal weights give equal checksums on any
    rank and device; it runs on the device and copies one number a parameter. Under FSDP2
    each parameter is all-gathered first (a collective: every rank must call this).
    """
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    total = 0
    with torch.no_grad():
        for p in model.parameters():
            whole = plain(p.detach()).contiguous().reshape(-1)
            bits = whole.view(ints[whole.element_size()]).to(torch.int64)
            weights = torch.arange(1, bits.numel() + 1, device=bits.device) % CHECKSUM_MODULUS
            total = (total * 1_000_033 + int((bits * weights).sum())) % (1 << 61)
    return f"{total:016x}"
