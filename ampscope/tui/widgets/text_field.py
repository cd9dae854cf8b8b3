"""A one-line text field whose cursor holds still when animations are off."""

from __future__ import annotations

from textual.widgets import Input


class TextField(Input):
    """Textual's ``Input``, its cursor steady under ``TEXTUAL_ANIMATIONS=none``.

    Whoever turned motion off gets no blinking cursor either; and a screen captured with
    animations off shows the cursor as focus drew it, not as whichever half-second of the
    blink a busy machine reached.
    """

    def on_mount(self) -> None:
        if self.app.animation_level == "none":
            self.cursor_blink = False
