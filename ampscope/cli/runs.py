"""Runs that outlive the terminal: ``run --detach``, ``runs``, ``attach``, ``replay``
(``serve`` is ``cli.serve.serve``).

Torch-free and textual-free at import: the dashboard is imported inside the commands that open it.
A detached engine is ``python -m ampscope run PRESET --run-dir DIR`` in its own session, with
stdout to /dev/null and stderr (its progress lines and tracebacks) to ``DIR/engine.log``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ampscope.cli.output import fail, not_a_runs_folder
from ampscope.core import events as ev
from ampscope.core import presets, records
from ampscope.core.processes.launch import EngineDidNotStart, launch_detached
from ampscope.core.records.folders import runs_dir_argument
from ampscope.core.text import visible

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "example_runs"
FINISHED = ("ok", "failed", "stopped")
SPEED_RANGE = (0.1, 100.0)


# --------------------------------------------------------------------------- argparse


def add_detach_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--detach",
        action="store_true",
        help="start the engine in the background, print its run folder and pid, and return; "
        "the run survives this terminal ('ampscope attach' watches it)",
    )


def _runs_dir_argument(p: argparse.ArgumentParser) -> None:
    # SUPPRESS: the top-level --runs-dir stays when the subcommand's is not given
    p.add_argument(
        "--runs-dir",
        type=runs_dir_argument,
        default=argparse.SUPPRESS,
        help="where run records are (default ./runs or $AMPSCOPE_RUNS_DIR)",
    )


def add_runs_parsers(sub: Any) -> None:
    runs = sub.add_parser("runs", help="list run records, newest first: live, crashed or finished")
    runs.add_argument("--json", action="store_true", help="print the list as JSON")
    _runs_dir_argument(runs)
    attach = sub.add_parser(
        "attach", help="watch a live run (detached or started elsewhere) in the dashboard"
    )
    attach.add_argument(
        "run", nargs="?", help="a run folder or its name under the runs dir (default: newest live)"
    )
    _runs_dir_argument(attach)
    replay = sub.add_parser(
        "replay", help="play a finished run back at its recorded pace (space pauses, arrows seek)"
    )
    replay.add_argument(
        "run",
        nargs="?",
        help="a run folder, its name, or a shipped example (default: newest finished run)",
    )
    replay.add_argument(
        "--speed", default="1", help="times the recorded pace, 0.1 to 100 (default 1)"
    )
    _runs_dir_argument(replay)
    serve = sub.add_parser(
        "serve", help="serve a read-only dashboard that follows the current run to browsers"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument(
        "--port",
        type=int,
        default=8000,
        help="port (default 8000; 0: any free port, said when served)",
    )
    serve.add_argument(
        "--max-viewers",
        type=int,
        default=4,
        help="browser tabs watching at once, 1 to 64 (default 4); each costs a process",
    )
    _runs_dir_argument(serve)


def main(args: argparse.Namespace) -> int:
    if args.command == "serve":
        from ampscope.cli.serve.serve import cmd_serve

        return cmd_serve(args)
    command = {"runs": cmd_runs, "attach": cmd_attach, "replay": cmd_replay}
    return command[args.command](args)


def _runs_root(args: argparse.Namespace) -> Path:
    return getattr(args, "runs_dir", None) or records.default_runs_dir()


# --------------------------------------------------------------------------- detached runs


def cmd_run_detached(args: argparse.Namespace, wait: Any = None) -> int:
    """``ampscope run --detach``; ``wait`` waits for the engine's hello
    (``launch.wait_for_hello`` unless given)."""
    from ampscope.core.presets.run_args import run_overrides

    if args.no_record:
        return fail("--detach needs the run record (drop --no-record): it is how you watch it.")
    root = _runs_root(args)
    try:  # the user's folder, said as theirs (exit 2), before an engine is started for it
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        in_the_way = next((p for p in root.parents if p.exists()), None)
        why = str(exc.strerror or exc)
        if in_the_way is not None and not in_the_way.is_dir():
            why += f" ({visible(in_the_way, 0)} is a file, not a folder)"
        return fail(
            f"cannot create the runs folder {visible(root, 0)}: {why}. Pass --runs-dir with a "
            "writable folder."
        )
    try:
        run_dir, pid = launch_detached(
            args.preset,
            run_overrides(args),
            args.runs_dir,
            getattr(args, "launch", None),
            wait=wait,
        )
    except presets.ConfigError as exc:
        return fail(str(exc))
    except EngineDidNotStart as exc:
        if exc.stopped:  # 'ampscope stop' (or a kill) while it set up: as a stopped run ends
            return fail(str(exc), 130)
        return fail(str(exc), 2 if exc.code == 2 else 1)
    except OSError as exc:
        return fail(f"cannot start the engine: {exc}", 1)
    if args.json:
        print(json.dumps(ev.text_only({"run_dir": str(run_dir), "pid": pid})))
    else:
        print(f"{visible(run_dir, 0)}\npid {pid}")
        print(f"Watch it with: ampscope attach {visible(run_dir, 0)}", file=sys.stderr)
    return 0


# --------------------------------------------------------------------------- finding runs


def example_runs() -> list[Path]:
    if not EXAMPLES_DIR.is_dir():
        return []
    return sorted(p for p in EXAMPLES_DIR.iterdir() if (p / records.EVENTS_FILE).is_file())


def resolve_run(arg: str, root: Path) -> Path | None:
    """A run folder from a path, a name under ``root``, or a shipped example's name; a name
    with bytes that are not UTF-8 as ampscope prints it (``caf\\xe9``) finds its folder."""
    for named in (Path(arg), root / arg, EXAMPLES_DIR / arg):
        candidate = ev.named_path(str(named))
        if (candidate / records.EVENTS_FILE).is_file():
            return candidate
    return None


def latest(root: Path, states: Sequence[str]) -> records.RunRecord | None:
    return next((r for r in records.list_runs(root) if r.state in states), None)


def progress(record: records.RunRecord) -> tuple[int | None, float | None, float | None]:
    """Steps done, median step ms, last loss: from ``done``, else from the stream's tail."""
    done = record.done
    if done is not None:
        return done.steps_done, done.step_ms_median, done.loss_final
    tail = records.tail_events(record.path / records.EVENTS_FILE)
    steps = [e for e in tail if isinstance(e, ev.StepEvent)]
    if not steps:
        return None, None, None
    last = steps[-20:]
    recent = sorted(s.step_ms for s in [s for s in last if not s.profiled] or last)
    return steps[-1].step + 1, recent[len(recent) // 2], steps[-1].loss


def run_rows(root: Path) -> list[dict[str, Any]]:
    rows = []
    for record in records.list_runs(root):
        state = record.state
        steps, median, loss = progress(record)
        live = records.read_live(record.path) or {}
        pid = records.live_pid(live) if state in ("live", "stalled") else None
        rows.append(
            {
                "name": record.name,
                "state": state,
                "preset": record.preset,
                "steps": steps,
                "step_ms_median": median,
                "loss_final": loss,
                # a run that ended on inf/NaN: loss_final is null, this names it and its step
                "loss_nonfinite": record.done.loss_nonfinite if record.done else None,
                "loss_final_step": record.done.loss_final_step if record.done else None,
                "pid": pid or (record.hello.pid if record.hello else None),
                "started_at": record.hello.started_at if record.hello else live.get("started_at"),
                "path": str(record.path),
                "problem": record.problem,
            }
        )
    return rows


def cmd_runs(args: argparse.Namespace) -> int:
    from ampscope.core.units import fmt_final_loss, fmt_ms, fmt_steps

    root = _runs_root(args)
    if (refused := not_a_runs_folder(root)) is not None:  # else it listed as an empty folder
        return refused
    rows = run_rows(root)
    if args.json:
        print(json.dumps(ev.text_only(rows), indent=2))  # no lone surrogates: strict readers
        return 0
    if not rows:
        print(f"No runs in {visible(root, 300)}.", file=sys.stderr)
        return 0
    print(f"Runs in {visible(root, 300)}, newest first; attach, replay and stop take a run:")
    table: list[tuple[str, ...]] = [("run", "state", "steps", "median step", "final loss")]
    for row in rows:
        table.append(
            (
                visible(Path(row["path"]).name, 300),  # its folder: a timestamp and the preset
                row["state"],
                fmt_steps(row["steps"]),
                fmt_ms(row["step_ms_median"]),
                fmt_final_loss(row["loss_final"], row["loss_nonfinite"], row["loss_final_step"]),
            )
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for r, listed in zip(table, [None, *rows], strict=True):
        line = "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        problem = listed["problem"] if listed else None
        print(line + (f"  ({visible(problem, 300)})" if problem else ""))
    return 0


# --------------------------------------------------------------------------- attach and replay


def _dashboard(args: argparse.Namespace, open_run: Any) -> int:
    """The dashboard, showing ``open_run`` (a run source) once it is up.

    ``--refresh`` was checked by its argparse type (``run_args.refresh_rate``).
    """
    from ampscope.tui.app import run_dashboard

    refresh = getattr(args, "refresh", None)
    return run_dashboard(runs_dir=_runs_root(args), refresh_hz=refresh, open_run=open_run)


def cmd_attach(
    args: argparse.Namespace, dashboard: Callable[[argparse.Namespace, Any], int] = _dashboard
) -> int:
    """``ampscope attach``: the run opened in ``dashboard`` (the dashboard's own unless
    given), then how to follow it again if it still runs."""
    root = _runs_root(args)
    if (refused := not_a_runs_folder(root)) is not None:
        return refused
    if args.run is not None:
        path = resolve_run(args.run, root)
        if path is None:
            return fail(f"no run record '{args.run}' (a run folder, or a name in {root}).")
    else:
        record = latest(root, ("live", "stalled"))  # stalled: paused, as 'ampscope stop' takes
        if record is None:
            return fail(f"no live run in {root}. 'ampscope runs' lists them all.", 1)
        path = record.path
    state = records.run_state(records.load_run(path, with_events=False))
    if state not in ("live", "stalled"):
        print(
            f"ampscope: {path.name} is not running ({state}); showing its record.", file=sys.stderr
        )

    from ampscope.tui.model.follow import AttachSource

    code = dashboard(args, AttachSource(path))
    if records.run_state(records.load_run(path, with_events=False)) in ("live", "stalled"):
        name = visible(path.name)
        stoppable, _why = records.stop_rule(records.read_live(path) or {})
        ends = f", 'ampscope stop {name}' ends it" if stoppable else ""
        print(
            f"ampscope: {name} is still running; 'ampscope attach {name}' follows it again{ends}.",
            file=sys.stderr,
        )
    return code


EXAMPLE_REPLAY = "shipped example replay"
"""The header's word for a replay of a shipped example, played when no run is finished."""


def cmd_replay(
    args: argparse.Namespace, dashboard: Callable[[argparse.Namespace, Any], int] = _dashboard
) -> int:
    """``ampscope replay``: the run (or a shipped example) replayed in ``dashboard`` (the
    dashboard's own unless given)."""
    low, high = SPEED_RANGE
    try:
        speed = float(args.speed)
    except ValueError:
        return fail(
            f"--speed {visible(args.speed)} is not a number. Accepted: {low:g} to {high:g}."
        )
    if not low <= speed <= high:  # NaN and inf too, echoed as typed
        return fail(
            f"--speed {visible(args.speed)} is out of range. Accepted: {low:g} to {high:g}."
        )
    root = _runs_root(args)
    if (refused := not_a_runs_folder(root)) is not None:  # else an example was replayed
        return refused
    read_from = "replay"
    if args.run is not None:
        path = resolve_run(args.run, root)
        if path is None:
            names = ", ".join(p.name for p in example_runs())
            return fail(f"no run record '{args.run}' in {root} (shipped examples: {names}).")
    else:
        record = latest(root, FINISHED)
        examples = example_runs()
        if record is not None:
            path = record.path
        elif examples:
            path = examples[0]
            read_from = EXAMPLE_REPLAY  # the header says so: the dashboard covers this line
            print(
                visible(f"ampscope: no finished run in {root}; replaying the example {path.name}."),
                file=sys.stderr,
            )
        else:
            return fail(f"no finished run in {root} to replay.", 1)
    from ampscope.tui.model.replay import ReplaySource

    return dashboard(args, ReplaySource.load(path, speed=speed, read_from=read_from))
