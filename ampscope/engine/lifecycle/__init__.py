"""A run's life in the engine process, from preset to record, and every way it ends.

run.py       one run from preset to record (process-level, no torch)
training.py  set up, say hello, train, and always end with ``done``
loop.py      the training step and the loop around it
hello.py     what was resolved before the first step
replicas.py  what the ranks tell each other besides their steps: devices, telemetry, weights
record.py    the run's folder while it runs (events, ``live.json``, summary)
faults.py    every fault turned into one error event and its exit code
exits.py     the process's exit codes, and a user error told before any run
stopping.py  stopping on signals and when the parent goes away
children.py  processes the user's code left running
"""
