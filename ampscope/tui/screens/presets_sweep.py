"""The Presets screen's sweep queue: presets marked with m, how many rounds, and w to run it.

A speed verdict needs repeated runs (``ampscope.core.significance``: three at least), so a
marked sweep runs 3 interleaved rounds unless the user picks another count with x, as
``ampscope bench --repeats`` does.
"""

from __future__ import annotations

from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import OptionList

from ampscope.core import config as cfg
from ampscope.core import significance
from ampscope.tui.messages import SweepRequested

REPEAT_CHOICES = (significance.MIN_REPEATS, 5, 1)
"""What x cycles through, the default first: 3 gives a verdict, 1 is quickest."""

SWEEP_BINDINGS = [
    Binding("m", "mark", "Mark for sweep", id="presets.mark"),
    Binding("w", "sweep", "Run sweep", id="presets.sweep"),
    # one shows (check_action): it names the current count, pressing it moves to the next
    *(Binding("x", f"repeats({n})", f"Repeats: {n}", id="presets.repeats") for n in REPEAT_CHOICES),
]


def next_repeats(repeats: int) -> int:
    i = REPEAT_CHOICES.index(repeats) if repeats in REPEAT_CHOICES else -1
    return REPEAT_CHOICES[(i + 1) % len(REPEAT_CHOICES)]


def queue_status(marked: dict[str, cfg.Preset | None], repeats: int) -> str:
    """The line under the form: what w will run."""
    queue = ", ".join(f"{n} (edited)" if edit else n for n, edit in marked.items())
    rounds = f"{repeats} runs each, interleaved" if repeats > 1 else "1 run each, no verdict"
    return f"sweep queue: {queue} · {rounds}  (w runs it, x repeats)"


class SweepScreen(Screen):
    """The Presets screen's sweep queue; the screen itself holds the list and the form."""

    def __init__(self) -> None:
        super().__init__()
        # the sweep queue, in order: preset name -> the form's edits when it was marked edited
        self.marked: dict[str, cfg.Preset | None] = {}
        self.repeats = REPEAT_CHOICES[0]
        self.current: cfg.PresetInfo | None = None
        self.preset: cfg.Preset | None = None

    # the screen's own: the list, the form and the line under it
    @property
    def is_edited(self) -> bool:
        raise NotImplementedError

    def runnable(self, title: str) -> bool:
        raise NotImplementedError

    def reload(self, select: str | None = None) -> None:
        raise NotImplementedError

    def show_status(self) -> None:
        raise NotImplementedError

    def action_mark(self) -> None:
        """Add the highlighted preset, as the form shows it, to the sweep queue, or take it out."""
        if self.current is None:
            return
        name = self.current.name
        if name in self.marked:
            del self.marked[name]
        elif not self.is_edited:
            self.marked[name] = None
        elif self.runnable("Not marked"):
            self.marked[name] = self.preset
        else:
            return
        options = self.query_one("#preset-list", OptionList)
        index = options.highlighted
        self.reload(select=name)
        if index is not None and index + 1 < options.option_count:
            options.highlighted = index + 1
        self.show_status()
        self.refresh_bindings()

    def action_repeats(self, shown: int) -> None:
        """x: the next number of interleaved rounds the marked presets run."""
        self.repeats = next_repeats(shown)
        self.show_status()
        self.refresh_bindings()

    def repeats_shown(self, shown: int) -> bool:
        """The x binding that names the current count shows, and only with presets marked."""
        return bool(self.marked) and shown == self.repeats

    async def action_sweep(self) -> None:
        if len(self.marked) < 2:
            return
        queue: list[str | cfg.Preset] = [edit or name for name, edit in self.marked.items()]
        self.marked = {}
        self.reload(select=self.current.name if self.current else None)
        self.post_message(SweepRequested(queue, repeats=self.repeats))
