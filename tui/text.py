"""User and record strings where Textual reads Rich markup (table cells, markup Statics).

``[b]`` in a preset name must show as written, and ``[/x]`` must not break a table: these are
escaped, and control characters spelled out (``ampscope.core.text.visible``).
"""

from __future__ import annotations

from rich.markup import escape

from ampscope.core.text import visible


def literal(text: object) -> str:
    """``text`` as written, on one line, for a place that reads markup."""
    return escape(visible(str(text)))
