"""Every private API of Textual and plotext the dashboard reads, in one file: an upgrade that
moves one breaks this module alone, and ``tests/test_private_apis.py`` says which.

- Textual's ``_character_to_key``: the key name Textual matches a typed character with
  (``?`` is ``question_mark``), for the key names of a user's keys.toml.
- Textual's ``SelectCurrent``, ``SelectOverlay`` and ``NonSelectableStatic``
  (``textual.widgets._select``): the parts of a ``Select`` (the value shown with its arrows,
  and the pop-up list), which ``ampscope.tui.widgets.drop_down.DropDown`` builds one at a
  time (the list and the up arrow when first opened).
- Textual's ``DOMNode._attach``: a widget given a parent without being mounted, as Textual's
  own component styles are found; ``DropDown``'s value row and ``FormRow`` style their parts
  (the value and its arrow, the field's name) so, to draw them themselves
  (``styled_as_child``); and ``DOMNode._get_default_css``, the ``DEFAULT_CSS`` Textual adds
  to the stylesheet when a widget of a kind is first mounted, added for such a part where
  none of its kind is mounted (``with_default_css``).
- plotext's glyph tables (``plotext._dict``): the charts draw into plotext's canvas with
  plotext's own braille and block glyphs, without its slow text round trip.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.keys import _character_to_key
from textual.widget import Widget
from textual.widgets._select import NonSelectableStatic, SelectCurrent, SelectOverlay

if TYPE_CHECKING:
    from textual.app import App

__all__ = [
    "NonSelectableStatic",
    "SelectCurrent",
    "SelectOverlay",
    "character_to_key",
    "styled_as_child",
    "with_default_css",
]
PLOTEXT_GLYPHS = ("braille_codes", "hd_codes")
"""plotext's tables, this module's attributes too (``__getattr__``)."""


def character_to_key(character: str) -> str:
    """The name Textual gives the key that types ``character``."""
    return _character_to_key(character)


def styled_as_child(widget: Widget, parent: Widget) -> None:
    """Give ``widget`` the styles Textual's CSS gives it as a child of ``parent`` (its rules,
    its ancestors' states), without mounting it: nothing lays it out, draws it or finds it
    in a query. Called again, it styles it anew (after a change of state above it)."""
    if widget.parent is not parent:
        widget._attach(parent)
    parent.app.stylesheet.apply(widget)


def with_default_css(widget: Widget, app: App[object]) -> None:
    """Put the ``DEFAULT_CSS`` of ``widget``'s class (and of its bases) in ``app``'s
    stylesheet, as mounting the first widget of its kind does: for a widget styled without
    being mounted (``styled_as_child``) where none of its kind is."""
    for read_from, css, tie_breaker, scope in widget._get_default_css():
        app.stylesheet.add_source(
            css, read_from=read_from, is_default_css=True, tie_breaker=tie_breaker, scope=scope
        )


def __getattr__(name: str) -> dict[tuple[int, ...], str]:
    """plotext's glyph tables, loaded with plotext when a chart first asks (the keys do not
    wait for plotext)."""
    if name not in PLOTEXT_GLYPHS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from plotext import _dict

    table: dict[tuple[int, ...], str] = getattr(_dict, name)
    return table
