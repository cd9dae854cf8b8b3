"""The machine a run trains on: what its datasheet promises and what it really delivers.

hardware.py  the GPUs ampscope knows: names, dense peaks per format, memory
check.py     a ``doctor --bench`` result: kept per machine, read back, stale or not
verdicts.py  what a measured figure means beside the datasheet, in words a person acts on
"""
