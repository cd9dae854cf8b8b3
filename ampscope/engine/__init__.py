"""The training engine: runs one preset and reports every step as an event.

Run it as ``python -m ampscope.engine PRESET`` or ``ampscope run PRESET``. It imports torch
(lazily, so that a refused preset answers at once and ``doctor``'s callers stay quick) and
never textual.

Where things are:
    run.py       one run from preset to record (process-level, no torch)
    session.py   setup, hello, the loop, done: every way a run ends
    setup.py     device checks, workload, precision, optimizer, scaler, compile
    loop.py      the training step and the loop around it
    metrics.py   per-step figures on the device, and the step events they become
    precision.py every dtype decision (PrecisionPolicy)
    workloads/   synthetic workloads on a shared base (batch pool, loss)
    probe.py     step timing and metric read-back without stalling the GPU
    emitter.py   the event writer; telemetry/ the ``sys`` sampler thread
    ranks.py     which rank this process is (torchrun's environment)
    link.py      the ranks' exchange: every step's figures, one stop, the failed rank named
    parallelize.py  DDP or FSDP2 around the model, the scaler that fits, a weight checksum
    replicas.py  devices, telemetry and weights compared across ranks
"""
