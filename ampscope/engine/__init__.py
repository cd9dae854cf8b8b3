"""The training engine: runs one preset and reports every step as an event.

Run it as ``python -m ampscope.engine PRESET`` or ``ampscope run PRESET``. It imports torch
(lazily, so that a refused preset answers at once and ``doctor``'s callers stay quick) and
never textual.

Where things are, in floors: each imports only the floors below it (pyproject.toml's
import-linter contract "Inside the engine" holds them so). On top, what puts a run together:

plan/            the precision plan: it runs the engine's own steps to choose each layer's format
lifecycle/       a run from preset to record: the loop, the training, every way a run ends
numerics/        per-layer numerics hooks on sampled steps, and the replay of a bad step
profiling/       torch.profiler over a few steps, on request
memory/          what a user's model saves for backward, measured, for ``ampscope memory``
machine/         ``ampscope doctor`` and its ``--bench``: what this machine offers, measured

Below, the parts a run is made of:

step/            the step's pieces: the checks before a run, setup, precision, timing, metrics
device.py        which device a run uses and what it can do (the only module asking CUDA)
ranks/           several processes: which rank, every step's figures exchanged, stalls
workloads/       synthetic workloads on a shared base, and the user's own model
telemetry/       the ``sys`` sampler thread: GPU (NVML) and host figures
emitter.py       a run's output: events to the record, the live stream and a callback
private_apis.py  the private torch APIs ampscope reads, in one place
"""
