"""The dashboard's screens: presets, the run view, history."""

from pathlib import Path

SCREENS_CSS = Path(__file__).resolve().parent.parent / "screens.tcss"
"""The rules of every screen but the first (app.tcss has the Presets screen's): each names it
as its ``CSS_PATH``, so Textual reads it when one is first shown, not before the first screen
is drawn (benchmarks/first_paint.py). Absolute: a subclass elsewhere finds it too."""
