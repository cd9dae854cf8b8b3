"""The shared core: what the engine, the dashboard and every front-end need.

Presets, the event schema, run records, the hardware table, the number-format and memory
analyses, run comparison and how an engine is launched. It imports neither torch nor
textual, and nothing above it.
"""
