"""A run's life in the engine process, from preset to record, and every way it ends.

run.py       one run from preset to record (process-level, no torch)
session.py   set up, say hello, train, and always end with ``done``
hello.py     what was resolved before the first step
stats.py     what a run has seen so far, enough to write ``done`` at any moment
emitter.py   the event writer: record, live stream and callback
record.py    the run's folder while it runs (events, ``live.json``, summary)
faults.py    every fault turned into one error event and its exit code
exits.py     the process's exit codes, and a user error told before any run
process.py   stopping on signals and when the parent goes away
children.py  processes the user's code left running
"""
