"""The newest live run under a runs folder, for the read-only viewer ``ampscope serve`` gives
each browser tab. Textual-free."""

from __future__ import annotations

import os
from pathlib import Path

from ampscope.core import records

NEWEST = 8
"""Run folders (the newest by name, which starts with the UTC start time) checked for a live
run at each poll: a live run is one of the last few started."""


class LiveRunFinder:
    """The newest live run under a runs folder, found cheaply enough to ask every second.

    Listing every record (a summary read each) cost 23 % of a core per viewer on a folder of
    2,000 records. The folder is re-listed (names only) when its mtime says a run folder
    came or went, and only the newest NEWEST are checked for a fresh ``live.json``.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._stamp: int | None = None
        self._newest: list[str] = []

    def newest_live(self) -> Path | None:
        try:
            stamp = os.stat(self.root).st_mtime_ns
            if stamp != self._stamp:
                with os.scandir(self.root) as entries:
                    names = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
                self._newest = sorted(names, reverse=True)[:NEWEST]
                self._stamp = stamp
        except OSError:
            return None
        for name in self._newest:
            path = self.root / name
            if records.live_owner(path) is not None and not (path / records.SUMMARY_FILE).exists():
                return path
        return None
