"""User and record strings as renderables no markup parser reads.

Escaping into markup is not enough: rich's and Textual's ``escape`` leave an unmatched ``[``
that then swallows the next tag (a name ending in ``[2J`` showed ``[/b]``), drop ``[$x]``
and double backslashes. So user text never goes into a markup string: it goes in as a
``rich.text.Text`` (table cells, Statics, options), with control characters spelled out
(``ampscope.core.text.visible``). Styled lines are assembled with ``Text.assemble``.
"""

from __future__ import annotations

from rich.text import Text

from ampscope.core.text import visible


def literal(text: object, style: str = "", *, keep_newlines: bool = False) -> Text:
    """``text`` as written (on one line unless ``keep_newlines``), optionally styled."""
    return Text(visible(str(text), keep_newlines=keep_newlines), style=style)
