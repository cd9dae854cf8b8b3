"""The per-rank strip of the Run view: shown only for a run on several processes.

One line names the slowest rank and how far it lags the median rank; below it, a cell a rank
(step time in ms, memory, utilisation), four to a line at 80 columns, so eight ranks take
three lines. With more ranks than fit in two lines of cells, the slowest are shown.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from ampscope.tui.model.rank_table import RankRow, RankTable

MAX_CELL_LINES = 2


def compact_ms(ms: float | None) -> str:
    """Milliseconds in at most six characters (the unit is in the strip's legend)."""
    if ms is None:
        return "-"
    if ms >= 10_000:
        return f"{ms:.0f}"
    return f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}"


def mib_or_gib(n: int | None) -> str:
    if n is None:
        return "-"
    mib = n / 2**20
    if mib < 1000:
        return f"{mib:.0f}M"
    gib = n / 2**30
    return f"{gib:.1f}G" if gib < 10 else f"{gib:.0f}G"


def compact_util(util: float | None) -> str:
    return "-" if util is None else f"{util:.0f}%"


def cell(row: RankRow, rank_width: int) -> str:
    return (
        f"r{row.rank:<{rank_width}} {compact_ms(row.step_ms):>6} "
        f"{mib_or_gib(row.memory):>4} {compact_util(row.util):>4}"
    )


def header(table: RankTable) -> str:
    how = "/".join(x for x in (table.strategy, table.backend) if x)
    parts = [f"{table.world_size} ranks" + (f" {how}" if how else "")]
    slowest = table.slowest()
    if slowest is not None:
        parts.append(
            f"slowest r{slowest.rank} {compact_ms(slowest.step_ms)} ms, "
            f"+{compact_ms(slowest.lag_ms)} ms vs median"
        )
    parts.append("ms, GPU mem, util" if table.on_gpus else "ms, RSS, CPU")
    return " · ".join(parts)


def cells_shown(rows: list[RankRow], per_line: int) -> tuple[list[RankRow], int]:
    """The rows that fit (all in rank order, or else the slowest first) and how many were left."""
    room = per_line * MAX_CELL_LINES
    if len(rows) <= room:
        return rows, 0
    slowest_first = sorted(rows, key=lambda r: -(r.step_ms or 0.0))
    return slowest_first[: room - 1], len(rows) - (room - 1)


def render(table: RankTable, width: int) -> Text:
    rows = table.rows()
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(header(table), style="bold")
    if not rows:
        return text
    rank_width = len(str(max(r.rank for r in rows)))
    cell_width = len(cell(rows[0], rank_width)) + 1
    per_line = max(1, (width + 1) // cell_width)
    shown, left = cells_shown(rows, per_line)
    slowest = table.slowest()
    for i, row in enumerate(shown):
        text.append("\n" if i % per_line == 0 else " ")
        style = "bold reverse" if slowest is not None and row.rank == slowest.rank else ""
        text.append(cell(row, rank_width), style=style)
    if left:
        text.append(f"  +{left} more", style="dim")
    return text


class RankStrip(Static):
    """Fed the run's RankTable on every redraw; hidden for a one-process run."""

    DEFAULT_CSS = """
    RankStrip {
        height: auto;
        display: none;
    }
    """

    def show(self, table: RankTable) -> None:
        self.display = table.shown
        if table.shown:
            self.update(render(table, self.content_size.width or 80))
