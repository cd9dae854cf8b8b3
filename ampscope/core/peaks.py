"""Dense peak TFLOP/s per GPU and compute dtype, for MFU: see ``ampscope.core.hardware``.

The table moved to ``hardware`` (one table for peaks and memory); the engine's callers
import ``identify`` and ``peak_tflops`` from here.
"""

from __future__ import annotations

from ampscope.core.hardware import identify, peak_tflops

__all__ = ["identify", "peak_tflops"]
