"""Engine processes: how one is started, proven to be a record's, signalled and ended.

launch.py     one command builder and child environment for every front-end
ownership.py  proof that a process runs a record, before anything signals it
stopping.py   signalling a run's process, only as allowed
tree.py       a launched job's whole tree of processes, for the kill that ends it
"""
