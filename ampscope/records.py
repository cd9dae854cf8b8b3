"""Run records on disk: ``runs/<UTC timestamp>-<preset>/`` with config, events and summary.

The engine writes them; the dashboard, comparisons and replays read them. A record is
self-describing: ``config.json`` is the resolved preset, ``events.jsonl`` is the event stream
exactly as emitted (its first line, ``hello``, names the device and versions), and
``summary.json`` is the final ``done`` event plus the ``hello`` it belongs to.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ampscope import events as ev

CONFIG_FILE = "config.json"
EVENTS_FILE = "events.jsonl"
SUMMARY_FILE = "summary.json"


def default_runs_dir() -> Path:
    return Path(os.environ.get("AMPSCOPE_RUNS_DIR") or "runs")


def new_run_dir(root: Path, preset_name: str) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in preset_name) or "run"
    root.mkdir(parents=True, exist_ok=True)
    for n in range(1000):
        path = root / (f"{stamp}-{safe}" if n == 0 else f"{stamp}-{safe}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"cannot create a run folder under {root}")


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)


@dataclass
class RunRecord:
    """A run read back from disk."""

    path: Path
    hello: ev.HelloEvent | None = None
    done: ev.DoneEvent | None = None
    events: list[ev.Event] = field(default_factory=list)
    unreadable_lines: int = 0

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def preset(self) -> str:
        return self.hello.preset if self.hello else self.path.name.split("-", 1)[-1]

    @property
    def status(self) -> str:
        """ok, failed or stopped from the record's own ``done``; 'incomplete' without one."""
        return self.done.status if self.done else "incomplete"


def read_events(path: Path) -> tuple[list[ev.Event], int]:
    """All events of an ``events.jsonl``; a torn last line (a crash mid-write) is skipped."""
    events: list[ev.Event] = []
    bad = 0
    with path.open("rb") as fh:
        for line in fh:
            if not line.strip():
                continue
            item = ev.decode(line)
            if isinstance(item, ev.UnknownEvent):
                bad += 1
            else:
                events.append(item)
    return events, bad


def load_run(path: Path, with_events: bool = True) -> RunRecord:
    record = RunRecord(path)
    events_path = path / EVENTS_FILE
    if with_events and events_path.is_file():
        record.events, record.unreadable_lines = read_events(events_path)
        for item in record.events:
            if isinstance(item, ev.HelloEvent):
                record.hello = item
            elif isinstance(item, ev.DoneEvent):
                record.done = item
        return record
    summary = path / SUMMARY_FILE
    if summary.is_file():
        try:
            data = json.loads(summary.read_text())
            record.hello = ev.decode(json.dumps(data.get("hello"))) or None  # type: ignore[assignment]
            record.done = ev.decode(json.dumps(data.get("done"))) or None  # type: ignore[assignment]
        except (OSError, ValueError):
            pass
        if not isinstance(record.hello, ev.HelloEvent):
            record.hello = None
        if not isinstance(record.done, ev.DoneEvent):
            record.done = None
    elif events_path.is_file():
        with events_path.open("rb") as fh:
            first = ev.decode(fh.readline())
        if isinstance(first, ev.HelloEvent):
            record.hello = first
    return record


def list_runs(root: Path | None = None) -> list[RunRecord]:
    """Runs under ``root``, newest first, read from their summaries (cheap)."""
    root = root or default_runs_dir()
    if not root.is_dir():
        return []
    runs = [load_run(p, with_events=False) for p in root.iterdir() if (p / EVENTS_FILE).is_file()]
    return sorted(runs, key=lambda r: r.name, reverse=True)
