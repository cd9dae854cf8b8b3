"""Names the app installs screens under: an installed screen survives going back (Textual
removes a popped screen that is not installed, and a removed screen cannot be shown again).

Kept apart from the screens themselves, so that the first screen can ask whether one is
installed without loading it (tests/test_first_paint.py)."""

from __future__ import annotations

LIVE_RUN_SCREEN = "live-run"
"""The name the Run view of the dashboard's own runs is installed under (one, reused)."""
