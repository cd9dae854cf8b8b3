"""The training step's pieces, and what is built for it before the first step.

validation.py     can this preset run here: every check before anything is built, in one order
preflight.py      will the run fit in memory
setup.py          workload, precision, optimizer, scaler and compile, built before the first step
precision.py      every dtype decision of a preset (PrecisionPolicy)
parallelize.py    DDP or FSDP2 around the model, the scaler that fits, a weight checksum
timer.py          step timing and metric read-back without stalling the GPU
metrics.py        per-step figures on the device, and the step events they become
flops.py          FLOPs per step as torch counts them
fp8.py            fp8 training through torchao: which layers, converted how
fp32_modules.py   the modules an AMP run keeps in fp32
compile_stats.py  torch.compile's counters as events
module_calls.py   which modules a forward really calls (fp8 and numerics count those)

The loop that runs these is ``lifecycle/loop.py``.
"""
