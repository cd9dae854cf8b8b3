"""How much memory training takes: the planner, and the planner beside what a run measured.

plan.py      the plan per precision regime: weights, gradients, optimizer state, activations
measured.py  a finished run's measured peak against what was planned for it
host.py      a CPU process's memory peak, from the kernel's high-water mark
"""
