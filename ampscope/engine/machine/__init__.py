"""What this machine offers, for ``ampscope doctor`` and ``ampscope doctor --bench``: the
measuring half of the machine check, whose verdicts and stored figures are ``core/machine``.

doctor.py     ``ampscope doctor``: what this machine offers
bench.py      ``doctor --bench``: each format's matmul and the memory bandwidth, measured
state.py      NVML's power limit, throttling and PCIe link beside the measurement
allreduce.py  an all-reduce's bus bandwidth across this machine's GPUs
"""
