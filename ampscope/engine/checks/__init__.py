"""What is checked before and around a run: the device, whether a preset can run, memory.

device.py      which device a run uses and what it can do (the only module asking CUDA)
validation.py  can this preset run here: every check, in one order
preflight.py   will the run fit in memory
doctor.py      ``ampscope doctor``: what this machine offers
machine_bench.py  ``doctor --bench``: each format's matmul and the memory bandwidth, measured
machine_state.py  NVML's power limit, throttling and PCIe link beside the measurement
saved_memory.py   what autograd saves for a user's model, per regime, for the memory plan
"""
