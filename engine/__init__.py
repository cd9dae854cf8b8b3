"""The training engine: runs one preset and reports every step as an event.

Run it as ``python -m engine PRESET`` or ``ampscope run PRESET``. This package imports torch
(lazily, so that ``engine.doctor``'s callers and tests stay quick) and never textual.
"""
