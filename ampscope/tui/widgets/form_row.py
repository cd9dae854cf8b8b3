"""A form's row that draws its field's name itself.

Each row of the Presets form was a ``Horizontal.form-row`` holding a ``Label.form-label`` and
the field: nine labels, each composed, styled, laid out and drawn before the first screen.
``FormRow`` is that ``Horizontal`` and draws the name in the cells the label took, which the
field's left margin leaves free (``FormRow > .form-input`` in ``ampscope/tui/app.tcss``, as
wide as ``.form-label``), from a ``Label.form-label`` styled by Textual's CSS as the row's
child but never mounted: the same cells (its colour, the focused field's row lit in reverse),
one widget fewer a field. A mouse selects the name's text as it did the label's.
"""

from __future__ import annotations

from textual.containers import Horizontal
from textual.selection import Selection
from textual.strip import Strip
from textual.style import Style
from textual.visual import Visual
from textual.widget import Widget
from textual.widgets import Label

from ampscope.tui.private_apis import styled_as_child


class _Name(Label):
    """The row's name: styled as the row's child, drawn by the row."""

    @property
    def text_selection(self) -> Selection | None:
        """What a mouse selected of the name: the row's selection (the row is the widget at
        the name's cells)."""
        return self.parent.text_selection if isinstance(self.parent, Widget) else None


class FormRow(Horizontal):
    """A ``Horizontal.form-row``: the field's name, then the field (``children``)."""

    def __init__(self, field_name: str, *children: Widget, id: str | None = None) -> None:
        super().__init__(*children, classes="form-row", id=id)
        self._field_name = _Name(field_name, classes="form-label")
        self._name_styled = False

    def notify_style_update(self) -> None:
        """Style the name anew once drawn (the row lit or no longer, say): Textual repaints a
        widget whose own styles change, not the row for its name's."""
        super().notify_style_update()
        if self._name_styled:
            drawn = self._field_name.visual_style
            styled_as_child(self._field_name, self)
            if self._field_name.visual_style != drawn:
                self.refresh()

    def _styled_name(self) -> Label:
        """The name, styled as the row's child (when first drawn)."""
        if not self._name_styled:
            styled_as_child(self._field_name, self)
            self._name_styled = True
        return self._field_name

    def render_line(self, y: int) -> Strip:
        """The row's line, with the name's line in the cells the field leaves at the left."""
        line = super().render_line(y)
        if not self.children:
            return line
        width = self.children[0].styles.margin.left
        name = self._styled_name()
        lines = Visual.to_strips(name, name.visual, width, None, name.visual_style)
        if not width or y >= len(lines):
            return line
        blank = Style(background=name.background_colors[1]).rich_style  # the label's padding
        return Strip.join([lines[y].adjust_cell_length(width, blank), line.crop(width)])

    def get_selection(self, selection: Selection) -> tuple[str, str] | None:
        """The name's text a mouse selected, as the label gave it."""
        return selection.extract(str(self._styled_name().visual)), "\n"
