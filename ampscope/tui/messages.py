"""What screens ask of the dashboard. Posted by a screen, they bubble up to the app.

Screens never call the app: they post one of these, and the app (which owns the run manager
and the screen stack) decides. A screen is then testable by the messages it posts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from textual.message import Message

from ampscope.core.presets import Preset


@dataclass
class RunRequested(Message):
    """Run a preset by name (or .toml path); ``detach``: it outlives the dashboard."""

    preset: str
    detach: bool = False


@dataclass
class EditedRunRequested(Message):
    """Run a preset edited on the Presets screen, as ``NAME-edited``."""

    preset: Preset
    detach: bool = False


@dataclass
class SweepRequested(Message):
    """Run these presets one after another, ``repeats`` rounds interleaved, then compare them."""

    presets: list[str | Preset]  # a name, or a preset edited on the Presets screen
    repeats: int = 1
    declined: Callable[[], None] = lambda: None  # the user kept a running run: marks come back


@dataclass
class PlanRequested(Message):
    """Plan which layers of the user's model (``FILE:FN``) to train in ``target`` (fp8 or fp16)."""

    target: str
    model: str


@dataclass
class RecordOpened(Message):
    """Show a run record: followed while its engine runs (``live``), else shown whole."""

    run_dir: Path
    live: bool
