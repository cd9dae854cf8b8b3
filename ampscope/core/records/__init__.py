"""Run records on disk: ``runs/<UTC timestamp>-<preset>/`` with config, events and summary.

The engine writes them; the dashboard, comparisons and replays read them. A record is
self-describing: ``config.json`` is the resolved preset, ``events.jsonl`` is the event stream
exactly as emitted (its first line, ``hello``, names the device and versions), and
``summary.json`` is the final ``done`` event plus the ``hello`` it belongs to.

Its modules:

    folders.py       run folders on disk: making, reading, listing, who runs one (live.json)
    writer.py        writing a run's record while it runs (events, heartbeat, summary)
    step_event.py    a step's figures as its ``step`` event
    tally.py         a run's books: its steps' figures, losses and peaks, for ``done``
    thinned.py       a long record read in bounded memory, thinned as the plots are
    distribution.py  one figure of every step, in memory that does not grow with the run
    summary.py       how a run is summarised in ``done``, engine runs and watched loops alike
    labels.py        what a recorded run is called on every screen
    files.py         reading a record's files, which need not be regular files, bounded

The engine and ``ampscope.watch`` keep their books with the same writer, step event and tally.
"""

from __future__ import annotations

from ampscope.core.records.folders import (
    CONFIG_FILE,
    EVENTS_FILE,
    LIVE_FILE,
    LIVE_STALE_S,
    MAX_PID,
    PROC_START_SLACK_S,
    SUMMARY_FILE,
    RunRecord,
    clear_live,
    default_runs_dir,
    is_stalled,
    list_runs,
    live_owner,
    live_pid,
    load_run,
    new_run_dir,
    pid_alive,
    process_start,
    read_events,
    read_live,
    run_state,
    safe_file_name,
    same_process,
    stop_rule,
    tail_events,
    write_json,
    write_live,
    write_text,
)

__all__ = [
    "CONFIG_FILE",
    "EVENTS_FILE",
    "LIVE_FILE",
    "LIVE_STALE_S",
    "MAX_PID",
    "PROC_START_SLACK_S",
    "RunRecord",
    "SUMMARY_FILE",
    "clear_live",
    "default_runs_dir",
    "is_stalled",
    "list_runs",
    "live_owner",
    "live_pid",
    "load_run",
    "new_run_dir",
    "pid_alive",
    "process_start",
    "read_events",
    "read_live",
    "run_state",
    "safe_file_name",
    "same_process",
    "stop_rule",
    "tail_events",
    "write_json",
    "write_live",
    "write_text",
]
