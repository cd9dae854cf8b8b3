"""A drop-down that builds its list of choices only when first opened.

Textual's ``Select`` composes the value shown and, hidden until opened, a pop-up list holding
every choice: the Presets form's five drop-downs made five lists (with their options) before
the first screen was drawn, none of them seen there. ``DropDown`` is a ``Select`` (same look,
keys, mouse and messages: ``Select.Changed``, ``Select.NULL``) whose list is mounted on the
first open (a key or a click) and kept from then on, as ``Select`` keeps its own. The first
paint it saves is measured in benchmarks/first_paint.py. Until then the value and its arrow are
drawn by one widget (``ValueShown``), not three, the same cells. The parts it builds one at a
time are Textual's own, read through ``ampscope.tui.private_apis``.
"""

from __future__ import annotations

from rich.console import RenderableType
from textual import on
from textual.app import ComposeResult
from textual.css.query import NoMatches
from textual.geometry import Size
from textual.strip import Strip
from textual.style import Style as TextualStyle
from textual.visual import Visual, VisualType, visualize
from textual.widgets import Select
from textual.widgets.select import NoSelection

from ampscope.tui.private_apis import (
    NonSelectableStatic,
    SelectCurrent,
    SelectOverlay,
    styled_as_child,
)


class ValueShown(SelectCurrent):
    """``Select``'s value and down arrow, drawn by this one widget until the list is made.

    ``SelectCurrent`` composes them as two ``Static`` widgets (and the up arrow, hidden while
    the list is closed): each composed, styled, laid out and drawn for every drop-down of the
    first screen. Until the list is first made this widget draws the same cells itself, from
    the same two ``Static`` parts, styled by Textual's CSS as its children (the value's colour
    with or without a value, the arrow's, the focused field's bold) but never mounted; then
    ``DropDown._make_list`` mounts Textual's own parts (``make_parts``) and ``SelectCurrent``
    draws them from then on."""

    ARROW_CELLS = 2
    """The down arrow's width: one cell after one of padding (``SelectCurrent``'s ``.arrow``)."""

    def __init__(self, placeholder: str) -> None:
        super().__init__(placeholder)
        self._parts_making = False
        self._parts_mounted = False
        self._shown: VisualType = placeholder
        self._visual: Visual | None = None
        self._parts: tuple[NonSelectableStatic, NonSelectableStatic] | None = None
        self._parts_styled = False

    def compose(self) -> ComposeResult:
        yield from ()  # drawn by render_line until make_parts

    async def make_parts(self) -> None:
        """Mount Textual's own parts, as ``SelectCurrent`` composes them: the value shown, the
        down arrow and the up arrow. This widget draws the value until they are mounted (over
        its own cells), then they do."""
        if self._parts_making:
            return
        self._parts_making = True
        await self.mount_all(
            [
                NonSelectableStatic(self._shown, id="label"),
                NonSelectableStatic("\u25bc", classes="arrow down-arrow"),
                NonSelectableStatic("\u25b2", classes="arrow up-arrow"),
            ]
        )
        self._parts_mounted = True
        self._parts = None
        super().update(self.label)  # a value shown meanwhile
        self.refresh()

    def update(self, label: RenderableType | NoSelection) -> None:
        """Show ``label`` (the placeholder for ``Select.NULL``), as ``SelectCurrent`` does."""
        if self._parts_mounted:
            super().update(label)
            return
        self.label = label
        self.has_value = label is not Select.NULL
        self._shown = self.placeholder if isinstance(label, NoSelection) else label
        self._visual = None
        self.refresh(layout=True)

    def _watch_has_value(self, has_value: bool) -> None:
        super()._watch_has_value(has_value)
        self._parts_styled = False  # the value's colour says whether there is one
        self.refresh()

    def notify_style_update(self) -> None:
        """Style the parts anew when next drawn. Only ``-has-value`` (above) changes their
        own rules; what they take from above (the focused field's bold) repaints this widget
        as it would them."""
        super().notify_style_update()
        self._parts_styled = False

    def _styled_parts(self) -> tuple[NonSelectableStatic, NonSelectableStatic]:
        """The value and the down arrow, styled as this widget's children, not mounted."""
        if self._parts is None:
            self._parts = (
                NonSelectableStatic(id="label"),
                NonSelectableStatic("\u25bc", classes="arrow down-arrow"),
            )
            self._parts_styled = False
        if not self._parts_styled:
            for part in self._parts:
                styled_as_child(part, self)
            self._parts_styled = True
        return self._parts

    def _value_visual(self, label: NonSelectableStatic) -> Visual:
        """The value shown, as its ``Static`` makes it (markup read, as by default)."""
        if self._visual is None:
            self._visual = visualize(label, self._shown, markup=True)
        return self._visual

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        """As tall as the value, wrapped beside the arrow (one line but for a long value in a
        narrow terminal)."""
        if self._parts_mounted or not width:
            return super().get_content_height(container, viewport, width)
        label, _arrow = self._styled_parts()
        value_width = max(width - self.ARROW_CELLS, 0)
        visual = self._value_visual(label)
        # a widget's styles are the rules Textual's own Widget.get_content_height passes
        return max(visual.get_height(label.styles, value_width), 1)  # type: ignore[arg-type]

    def render_line(self, y: int) -> Strip:
        """A line of the value, the down arrow beside its first, as the parts draw them."""
        if self._parts_mounted:
            return super().render_line(y)
        label, arrow = self._styled_parts()
        width, height = self.size
        value_width = max(width - self.ARROW_CELLS, 0)
        blank = TextualStyle(background=label.background_colors[1]).rich_style
        lines = Visual.to_strips(
            label, self._value_visual(label), value_width, height, label.visual_style
        )
        line = lines[y] if y < len(lines) else Strip.blank(value_width, blank)
        line = line.adjust_cell_length(value_width, blank)
        if y:
            return Strip.join([line, Strip.blank(self.ARROW_CELLS, blank)])
        (down,) = Visual.to_strips(arrow, arrow.visual, 1, 1, arrow.visual_style)
        return Strip.join(
            [line, Strip.blank(self.ARROW_CELLS - 1, blank), down.adjust_cell_length(1, blank)]
        )


class DropDown(Select[str]):
    """A ``Select`` of text choices whose pop-up list is made when first opened."""

    def compose(self) -> ComposeResult:
        yield ValueShown(self.prompt)

    def _list(self) -> SelectOverlay | None:
        """The pop-up list, once made."""
        try:
            return self.query_one(SelectOverlay)
        except NoMatches:
            return None

    async def _make_list(self) -> None:
        """Mount the pop-up list with every choice, and the up arrow, as ``Select`` composes
        them."""
        if self._list() is not None:
            return
        await self.query_one(ValueShown).make_parts()
        await self.mount(
            SelectOverlay(type_to_search=self._type_to_search).data_bind(compact=Select.compact)
        )
        super()._setup_options_renderables()

    def _setup_options_renderables(self) -> None:
        """The choices go into the list once it is made (``_make_list`` puts them there)."""
        if self._list() is not None:
            super()._setup_options_renderables()

    def _watch_value(self, value: str | NoSelection) -> None:
        """Show the value picked, as ``Select`` does; without the list, nothing to highlight
        in it yet (opening it highlights the value)."""
        if self._list() is not None:
            super()._watch_value(value)
            return
        self._value = value
        try:
            current = self.query_one(SelectCurrent)
        except NoMatches:  # not composed yet: mounting shows the value
            return
        if isinstance(value, NoSelection):
            current.update(self.NULL)
        else:
            current.update(next(shown for shown, choice in self._options if choice == value))
        self.post_message(self.Changed(self, value))

    def action_show_overlay(self) -> None:
        """Enter, space, up or down open the list, made first (mounting it is awaited)."""
        if self._list() is None:
            self.call_next(self._open_first)
        else:
            super().action_show_overlay()

    async def _open_first(self) -> None:
        await self._make_list()
        super().action_show_overlay()

    @on(SelectCurrent.Toggle)
    async def _clicked(self, event: SelectCurrent.Toggle) -> None:
        """A click on the value opens the list (made first) or closes it, as in ``Select``."""
        event.stop()
        event.prevent_default()  # Select's own handler would toggle it a second time
        await self._make_list()
        self.expanded = not self.expanded
