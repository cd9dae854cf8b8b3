"""A drop-down that builds its list of choices only when first opened.

Textual's ``Select`` composes the value shown and, hidden until opened, a pop-up list holding
every choice: the Presets form's five drop-downs made five lists (with their options) before
the first screen was drawn, none of them seen there. ``DropDown`` is a ``Select`` (same look,
keys, mouse and messages: ``Select.Changed``, ``Select.NULL``) whose list is mounted on the
first open (a key or a click) and kept from then on, as ``Select`` keeps its own. The first
paint it saves is measured in benchmarks/first_paint.py. The parts it builds one at a time are
Textual's own, read through ``ampscope.tui.private_apis``.
"""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.css.query import NoMatches
from textual.widgets import Select
from textual.widgets.select import NoSelection

from ampscope.tui.private_apis import NonSelectableStatic, SelectCurrent, SelectOverlay


class ValueShown(SelectCurrent):
    """``Select``'s value and down arrow; the up arrow, hidden while closed, comes with the
    list (``DropDown._make_list``)."""

    def compose(self) -> ComposeResult:
        yield NonSelectableStatic(self.placeholder, id="label")
        yield NonSelectableStatic("\u25bc", classes="arrow down-arrow")


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
        await self.query_one(SelectCurrent).mount(
            NonSelectableStatic("\u25b2", classes="arrow up-arrow")
        )
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
