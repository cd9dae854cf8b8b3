"""Tables that fit: whole columns only, the most important first, never one cut at the edge."""

from __future__ import annotations

from collections.abc import Sequence

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import DataTable

CELL_PADDING = 2
"""A DataTable cell pads its text by one column each side."""
TABLE_CHROME = 4
"""The table's left border and a vertical scrollbar."""


def text_width(cell: object) -> int:
    if isinstance(cell, Text):
        return cell.cell_len
    return max((cell_len(line) for line in str(cell).splitlines()), default=0)


def column_widths(heads: Sequence[str], rows: Sequence[Sequence[object]]) -> list[int]:
    """Each column's widest cell (or header), in terminal cells."""
    return [max([text_width(h), *(text_width(r[i]) for r in rows)]) for i, h in enumerate(heads)]


def fitting_columns(widths: Sequence[int], width: int, order: Sequence[int]) -> list[int]:
    """Indexes of the columns that fit in ``width``, picked in ``order`` (most wanted first),
    returned in table order. The first of ``order`` is always kept."""
    chosen: list[int] = []
    used = 0
    for i in order:
        if chosen and used + widths[i] + CELL_PADDING > width:
            continue
        chosen.append(i)
        used += widths[i] + CELL_PADDING
    return sorted(chosen)


def fill(
    table: DataTable,
    heads: Sequence[str],
    rows: Sequence[Sequence[object]],
    width: int,
    order: Sequence[int] | None = None,
    keys: Sequence[str] | None = None,
) -> list[int]:
    """Rebuild ``table`` with the columns of ``heads``/``rows`` that fit in ``width``."""
    order = list(range(len(heads))) if order is None else order
    widths = column_widths(heads, rows)
    shown = fitting_columns(widths, width - TABLE_CHROME, order)
    table.clear(columns=True)
    for i in shown:  # widths given: a cursor moved before the table measures would cut them
        table.add_column(heads[i], width=widths[i], key=heads[i])
    for n, row in enumerate(rows):
        table.add_row(*(row[i] for i in shown), key=None if keys is None else keys[n])
    return shown


def hidden_note(
    heads: Sequence[str], shown: Sequence[int], order: Sequence[int] | None = None, room: int = 28
) -> str:
    """`` · columns hidden: final loss, steps`` for the columns ``fill`` left out, the most
    wanted first (``order``), as many names as ``room`` holds and ``+N`` for the rest; '' for
    none. A column that does not fit is said, never silently missing."""
    order = list(range(len(heads))) if order is None else order
    hidden = [heads[i] for i in order if i not in shown]
    if not hidden:
        return ""
    names: list[str] = []
    for name in hidden:
        if names and len(", ".join([*names, name])) > room:
            break
        names.append(name)
    rest = len(hidden) - len(names)
    return f" · columns hidden: {', '.join(names)}" + (f" +{rest}" if rest else "")


def off_edges(
    heads: Sequence[str], widths: Sequence[int], scroll_x: float, room: int, fixed: int = 1
) -> tuple[list[str], list[str]]:
    """The columns a sideways-scrolled table cuts: (those left of what shows, those right of
    it). ``widths`` include the padding; the first ``fixed`` columns never scroll; ``room`` is
    the width the table draws its columns in."""
    left: list[str] = []
    right: list[str] = []
    x = sum(widths[:fixed])
    for head, width in zip(heads[fixed:], widths[fixed:], strict=True):
        if x < sum(widths[:fixed]) + scroll_x:
            left.append(head)
        elif x + width - 1 > room + scroll_x:  # its right padding may go
            right.append(head)
        x += width
    return left, right


def column_scroll(widths: Sequence[int], scroll_x: float, step: int, fixed: int = 1) -> int:
    """Where a row-cursor table scrolls for one press of left (``step`` -1) or right (+1): to
    the start of the column before or after the first one that shows, never part of one.
    DataTable scrolls such a table a character a press, which beside a long cell (a reason
    of 60 characters) took 60 presses to reach the next column. ``widths`` include padding;
    the first ``fixed`` columns never scroll."""
    starts = [sum(widths[fixed:i]) for i in range(fixed, len(widths))]
    if step > 0:
        return next((x for x in starts if x > scroll_x), starts[-1] if starts else 0)
    return next((x for x in reversed(starts) if x < scroll_x), 0)
