"""Widgets of the Run view."""
