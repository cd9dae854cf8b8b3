"""Warnings, errors and skipped steps, with the step they happened at."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import RichLog

from ampscope.core.text import visible
from ampscope.tui.model.run_state import RunState

STYLES = {
    "error": "bold red",
    "warning": "yellow",
    "skipped": "magenta",
    "stderr": "red",
    "info": "dim",
}


class EventLogView(RichLog):
    def __init__(self, **kwargs) -> None:
        super().__init__(max_lines=1000, wrap=True, markup=False, highlight=False, **kwargs)
        self._seq = 0
        self._state_id: int | None = None
        self.texts: list[str] = []  # plain text of what was written, for tests and copy
        self._max_texts = 1000

    def sync(self, state: RunState) -> None:
        if id(state) != self._state_id:
            self._state_id = id(state)
            self._seq = 0
            self.clear()
            self.texts.clear()
        for entry in state.log.since(self._seq):
            self._seq = entry.seq
            where = f"step {entry.step:>6}" if entry.step is not None else " " * 11
            shown = visible(entry.text, keep_newlines=True)  # a record's text is seen, never obeyed
            # a grid: a long message wraps under itself, not under the step column
            line = Table.grid(padding=(0, 1))
            line.add_column(width=12, no_wrap=True)
            line.add_column(width=8, no_wrap=True)
            line.add_column(ratio=1, overflow="fold")
            line.add_row(
                Text(where, style="dim"),
                Text(entry.level, style=STYLES.get(entry.level, "")),
                Text(shown, style=STYLES.get(entry.level, "") if entry.level == "error" else ""),
            )
            self.write(line, expand=True)
            self.texts.append(f"{where.strip()} {entry.level} {shown}")
            if len(self.texts) > self._max_texts:
                del self.texts[: len(self.texts) - self._max_texts]
