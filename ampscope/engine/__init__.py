"""The training engine: runs one preset and reports every step as an event.

Run it as ``python -m ampscope.engine PRESET`` or ``ampscope run PRESET``. It imports torch
(lazily, so that a refused preset answers at once and ``doctor``'s callers stay quick) and
never textual.

Where things are:

lifecycle/       a run from preset to record: the session, the record, every way it ends
step/            the training step: setup, the precision policy, the loop, timing, metrics
checks/          what is checked before and around a run: device, preset, memory, doctor
ranks/           several processes: which rank, their exchange, DDP and FSDP2, stalls
workloads/       synthetic workloads on a shared base, and the user's own model
numerics/        per-layer numerics hooks on sampled steps, and the replay of a bad step
profiling/       torch.profiler over a few steps, on request
telemetry/       the ``sys`` sampler thread: GPU (NVML) and host figures
private_apis.py  the private torch APIs ampscope reads, in one place
"""
