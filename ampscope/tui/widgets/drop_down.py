"""A drop-down that builds its list of choices only when first opened.

Textual's ``Select`` composes the value shown and, hidden until opened, a pop-up list holding
every choice: the Presets form's five drop-downs made five lists (with their options) before
the first screen was drawn, none of them seen there. ``DropDown`` is a ``Select`` (same look,
keys, mouse and messages: ``Select.Changed``, ``Select.NULL``) whose list is mounted on the
first open (a key or a click) and kept from then on, as ``Select`` keeps its own. The first
paint it saves is measured in benchmarks/first_paint.py. Until then the ``DropDown`` draws the
value and its arrow itself, the same cells as the four widgets of a ``Select`` (itself, its
value row, the value and the arrow). The parts it builds one at a time are Textual's own,
read through ``ampscope.tui.private_apis``.
"""

from __future__ import annotations

from rich.console import RenderableType
from textual import events, on
from textual.app import ComposeResult
from textual.css.query import NoMatches
from textual.geometry import Size
from textual.strip import Strip
from textual.style import Style
from textual.visual import Visual, VisualType, visualize
from textual.widgets import Select
from textual.widgets.select import NoSelection

from ampscope.tui.private_apis import (
    NonSelectableStatic,
    SelectCurrent,
    SelectOverlay,
    styled_as_child,
    with_default_css,
)


class DropDown(Select[str]):
    """A ``Select`` of text choices whose pop-up list is made when first opened.

    Until then it has no children: it draws ``Select``'s value row (``SelectCurrent``: the
    value, then the down arrow) itself, from the same widgets, styled by Textual's CSS as
    they would be in it (the value's colour with or without a value, the arrow's, the
    focused field's tint and bold) but never mounted. Opening it mounts ``Select``'s own
    value row and list, and ``Select``'s code draws them from then on, the same cells
    (``tests/test_drop_down.py``). A drop-down with borders (not ``compact``) has its value
    row from the start."""

    DEFAULT_CSS = """
    DropDown {
        pointer: pointer;  /* as over Select's value row, which covers it once made */
    }
    """

    ARROW_CELLS = 2
    """The down arrow's width: one cell after one of padding (``SelectCurrent``'s ``.arrow``)."""

    _composed = False
    _drawn = False
    """Whether it draws its value row itself (until its list is made)."""
    _label: RenderableType | NoSelection = Select.NULL
    """What is shown, as ``SelectCurrent.update`` is given it."""
    _shown: VisualType = ""
    _visual: Visual | None = None
    _parts: tuple[SelectCurrent, NonSelectableStatic, NonSelectableStatic] | None = None
    _parts_styled = False

    def compose(self) -> ComposeResult:
        self._composed = True
        self._shown = self.prompt
        self._drawn = self.compact
        if self._drawn:
            current, _value, _arrow = self._unstyled_parts()
            with_default_css(current, self.app)  # its rules, as if one were mounted
        else:
            yield SelectCurrent(self.prompt)

    def _list(self) -> SelectOverlay | None:
        """The pop-up list, once made."""
        try:
            return self.query_one(SelectOverlay)
        except NoMatches:
            return None

    async def _make_list(self) -> None:
        """Mount the value row and the pop-up list with every choice, as ``Select`` composes
        them."""
        if self._list() is not None:
            return
        if self._drawn:
            current = SelectCurrent(self.prompt)
            await self.mount(current)
            current.update(self._label)
            self._drawn = False
            self._parts = None
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
        if not self._composed:  # composing shows the value
            return
        shown = (
            self.NULL
            if isinstance(value, NoSelection)
            else next(shown for shown, choice in self._options if choice == value)
        )
        if self._drawn:
            self._show(shown)
        else:
            self.query_one(SelectCurrent).update(shown)
        self.post_message(self.Changed(self, value))

    def _show(self, label: RenderableType | NoSelection) -> None:
        """Draw ``label`` (the prompt for ``Select.NULL``), as ``SelectCurrent.update``
        shows it."""
        self._label = label
        self._shown = self.prompt if isinstance(label, NoSelection) else label
        self._visual = None
        current, _value, _arrow = self._styled_parts()
        current.set_class(not isinstance(label, NoSelection), "-has-value")
        self._parts_styled = False  # the value's colour says whether there is one
        self.refresh(layout=True)

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

    async def _on_click(self, event: events.Click) -> None:
        """A click on the value drawn here opens the list, as one on the value row does."""
        if self._drawn:
            event.stop()
            await self._make_list()
            self.expanded = True

    def notify_style_update(self) -> None:
        """Style the parts anew when next drawn: what they take from this widget (its focus,
        the focused field's bold) repaints it, as it would them."""
        super().notify_style_update()
        self._parts_styled = False

    def _unstyled_parts(self) -> tuple[SelectCurrent, NonSelectableStatic, NonSelectableStatic]:
        """The value row, its value and its down arrow, as ``Select`` composes them."""
        if self._parts is None:
            self._parts = (
                SelectCurrent(self.prompt),
                NonSelectableStatic(id="label"),
                NonSelectableStatic("\u25bc", classes="arrow down-arrow"),
            )
            self._parts_styled = False
        return self._parts

    def _styled_parts(self) -> tuple[SelectCurrent, NonSelectableStatic, NonSelectableStatic]:
        """The value row, its value and its down arrow, styled as they would be here."""
        current, value, arrow = self._unstyled_parts()
        if not self._parts_styled:
            styled_as_child(current, self)
            styled_as_child(value, current)
            styled_as_child(arrow, current)
            self._parts_styled = True
        return current, value, arrow

    def _value_visual(self, value: NonSelectableStatic) -> Visual:
        """The value shown, as its ``Static`` makes it (markup read, as by default)."""
        if self._visual is None:
            self._visual = visualize(value, self._shown, markup=True)
        return self._visual

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        """As tall as the value row: the value, wrapped beside the arrow."""
        if not self._drawn or not width:
            return super().get_content_height(container, viewport, width)
        current, value, _arrow = self._styled_parts()
        gutter = current.styles.gutter
        value_width = max(width - gutter.width - self.ARROW_CELLS, 0)
        lines = 0  # no room for the value (a terminal too small): the arrow's line
        if value_width:
            visual = self._value_visual(value)
            # a widget's styles are the rules Textual's own Widget.get_content_height passes
            lines = visual.get_height(value.styles, value_width)  # type: ignore[arg-type]
        return max(lines, 1) + gutter.height

    def render_line(self, y: int) -> Strip:
        """A line of the value row: the value, the down arrow beside its first line, as
        ``SelectCurrent`` and its parts draw them."""
        if not self._drawn:
            return super().render_line(y)
        current, value, arrow = self._styled_parts()
        width, height = self.size
        gutter = current.styles.gutter
        value_width = max(width - gutter.width - self.ARROW_CELLS, 0)
        row = Style(background=current.background_colors[1]).rich_style
        blank = Style(background=value.background_colors[1]).rich_style
        lines = (
            Visual.to_strips(
                value, self._value_visual(value), value_width, height, value.visual_style
            )
            if value_width
            else []
        )
        line = lines[y] if y < len(lines) else Strip.blank(value_width, blank)
        strips = [line.adjust_cell_length(value_width, blank)]
        if y:
            strips.append(Strip.blank(self.ARROW_CELLS, blank))
        else:
            (down,) = Visual.to_strips(arrow, arrow.visual, 1, 1, arrow.visual_style)
            strips += [Strip.blank(self.ARROW_CELLS - 1, blank), down.adjust_cell_length(1, blank)]
        if gutter.left:
            strips.insert(0, Strip.blank(gutter.left, row))
        if gutter.right:
            strips.append(Strip.blank(gutter.right, row))
        return Strip.join(strips)
