"""The dashboard's screens: presets, the run view, history."""
