"""The training step and what is built for it: what a reader of the loop needs, in one place.

setup.py          workload, precision, optimizer, scaler and compile, built before the first step
precision.py      every dtype decision of a preset (PrecisionPolicy)
loop.py           the training step and the loop around it
timer.py          step timing and metric read-back without stalling the GPU
metrics.py        per-step figures on the device, and the step events they become
flops.py          FLOPs per step as torch counts them
fp8.py            fp8 training through torchao: which layers, converted how
compile_stats.py  torch.compile's counters as events
module_calls.py   which modules a forward really calls (fp8 and numerics count those)
"""
