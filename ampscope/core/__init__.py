"""The shared core: what the engine, the dashboard and every front-end need. It imports
neither torch nor textual, and nothing above it.

events.py     the event stream between the engine and everything that watches it
presets/      presets, overrides, run arguments, a user's ``--model`` spec
records/      run folders on disk: reading them (bounded), summaries, labels
comparison/   bench rows, speed verdicts and their statistics
numerics/     the formats' limits, per-layer numerics and their verdicts
memory/       the training-memory plan, and the plan beside a measured run
profiles/     a profile's split of the step, its rules, two profiles compared
processes/    engine processes: launched, proven, signalled, ended
machine/      the hardware table, ``doctor --bench`` results and their verdicts
formats/      number formats: the catalogue, conversions and the lecture's demos
text.py       text from users and records, made safe to show
units.py      human-readable numbers
"""
