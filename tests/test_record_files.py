"""A record's files that are not files: a FIFO or a link to /dev/zero where live.json, .owner,
summary.json or events.jsonl should be. Each is "unreadable", at once: nothing waits on a FIFO
for ever, nothing reads a device until memory runs out, and History's keys still work."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ampscope.cli.main import main as cli_main
from ampscope.core import events as ev
from ampscope.core import records
from ampscope.core.presets import user_presets_dir
from ampscope.core.processes import ownership
from ampscope.core.records import files
from ampscope.tui import keys
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.screens.history import HistoryScreen
from ampscope.tui.screens.presets import PresetsScreen
from tests.helpers import (
    SIZE,
    done,
    hello,
    run,
    save_dialog_for,
    shown,
    step,
    wait_for,
)

HANG_S = 60.0
"""Far past what any of these takes (milliseconds): only a read that waits for ever exceeds it."""


def returns(call: Callable[[], object], fifos: list[Path]) -> bool:
    """Whether ``call()`` returns, rather than waiting for ever on one of ``fifos``. A reader
    stuck on one is set free afterwards (a writer opens and closes it; a writer stuck on one,
    a reader), so no thread is left."""

    def quietly() -> None:
        with contextlib.suppress(BaseException):  # what it raises is the caller's to check
            call()

    thread = threading.Thread(target=quietly, daemon=True)
    thread.start()
    thread.join(HANG_S)
    stuck = thread.is_alive()
    while thread.is_alive():
        for fifo in fifos:
            with contextlib.suppress(OSError):  # ENXIO: nobody waits on this one
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        thread.join(0.1)
    return not stuck


def a_record(root: Path, name: str, finished: bool = False) -> Path:
    path = root / name
    path.mkdir(parents=True)
    items = [hello(), step(0), step(1)] + ([done("ok", 2)] if finished else [])
    (path / records.EVENTS_FILE).write_bytes(b"".join(ev.encode(e) for e in items))
    return path


@pytest.mark.unit
def test_only_a_regular_file_of_a_records_size_is_read(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    zero = tmp_path / "zero"
    zero.symlink_to("/dev/zero")
    big = tmp_path / "big"
    with big.open("wb") as fh:
        fh.truncate(files.SMALL_BYTES + 1)  # sparse: costs no disk
    good = tmp_path / "good.json"
    good.write_text('{"pid": 1}')
    link = tmp_path / "link.json"
    link.symlink_to(good)

    assert files.read_json(good) == {"pid": 1}
    assert files.read_json(link) == {"pid": 1}  # a link is followed where allowed
    cases = {
        fifo: "not a regular file",
        zero: "not a regular file",
        big: f"larger than {files.SMALL_BYTES:,} bytes",
        tmp_path: "not a regular file",  # a folder
    }
    for path, why in cases.items():
        with pytest.raises(files.NotAFile) as refused:
            assert returns(lambda p=path: files.read_bytes(p), [fifo])
            files.read_bytes(path)
        assert why in str(refused.value) and str(path) in str(refused.value)
    for path in (link, zero):
        with pytest.raises(files.NotAFile) as refused:
            files.read_json(path, follow_links=False)
        assert refused.value.errno == errno.ELOOP
    (tmp_path / "deep.json").write_text("[" * 100_000)
    with pytest.raises(ValueError, match="nests too deep"):
        files.read_json(tmp_path / "deep.json")


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_runs_and_stop_say_what_they_can_of_a_live_json_that_is_not_a_file(
    tmp_path: Path, capsys, kind: str
) -> None:
    root = tmp_path / "runs"
    run_dir = a_record(root, "20260101T000000Z-fp32")
    live = run_dir / records.LIVE_FILE
    if kind == "fifo":
        os.mkfifo(live)
    else:
        live.symlink_to("/dev/zero")
    fifos = [live] if kind == "fifo" else []
    codes: list[int] = []
    assert returns(
        lambda: codes.append(cli_main(["runs", "--json", "--runs-dir", str(root)])), fifos
    )
    (row,) = json.loads(capsys.readouterr().out)
    assert codes == [0] and row["state"] == "crashed"  # no process claims it
    assert returns(lambda: codes.append(cli_main(["stop", str(run_dir)])), fifos)
    assert codes[-1] != 0 and "Traceback" not in capsys.readouterr().err
    assert records.read_live(run_dir) is None


@pytest.mark.unit
def test_a_summary_events_or_owner_that_is_not_a_file_is_unreadable_not_a_hang(
    tmp_path: Path,
) -> None:
    root = tmp_path / "runs"
    summary_fifo = a_record(root, "20260101T000001Z-summary") / records.SUMMARY_FILE
    os.mkfifo(summary_fifo)
    events_dir = root / "20260101T000002Z-events"
    events_dir.mkdir()
    (events_dir / records.EVENTS_FILE).symlink_to("/dev/zero")
    owner_dir = a_record(root, "20260101T000003Z-owner")
    (owner_dir / ownership.OWNER_FILE).symlink_to("/dev/zero")
    fifos = [summary_fifo]
    loaded: list[records.RunRecord] = []
    assert returns(lambda: loaded.append(records.load_run(summary_fifo.parent, False)), fifos)
    assert loaded[-1].hello is not None  # from the events, the summary being no file
    with pytest.raises(files.NotAFile):
        files.read_json(summary_fifo)
    assert returns(lambda: loaded.append(records.load_run(events_dir)), fifos)
    assert loaded[-1].hello is None and loaded[-1].events == []
    assert records.tail_events(events_dir / records.EVENTS_FILE) == []
    assert ownership.group_leader(owner_dir) is None


@pytest.mark.ui
def test_history_lists_a_record_whose_live_json_is_a_fifo_and_its_keys_still_work(
    tmp_path: Path,
) -> None:
    root = tmp_path / "runs"
    a_record(root, "20260101T000000Z-done", finished=True)
    fifo = a_record(root, "20260101T000001Z-fifo") / records.LIVE_FILE
    os.mkfifo(fifo)
    rows: list[list[str]] = []
    ended: list[bool] = []

    async def go() -> None:
        app = AmpscopeApp(runs_dir=root)
        async with app.run_test(size=SIZE) as pilot:
            await shown(pilot, app, PresetsScreen)
            await pilot.press("h")
            history = await shown(pilot, app, HistoryScreen)
            table = history.query_one("#history-table")
            assert await wait_for(pilot, lambda: table.row_count == 2, 10)
            rows.extend([str(c).strip() for c in table.get_row_at(i)] for i in range(2))
            await pilot.press("escape")
            await shown(pilot, app, PresetsScreen)
            await pilot.press("q")
            ended.append(await wait_for(pilot, lambda: not app.is_running, 10))

    assert returns(lambda: run(go()), [fifo])
    assert [r[2] for r in rows] == ["crashed", "ok"]
    assert ended == [True]


@pytest.mark.ui
def test_history_stays_live_while_a_slow_disk_reads_its_records(
    tmp_path: Path, monkeypatch
) -> None:
    """A read that does not end (a network folder that stalls) is not on the UI thread:
    History shows at once, says it is reading, and its keys still work."""
    root = tmp_path / "runs"
    a_record(root, "20260101T000000Z-done", finished=True)
    stalled = threading.Event()
    real = records.list_runs

    def slow(folder: Path | None = None) -> list[records.RunRecord]:
        stalled.wait(HANG_S * 2)
        return real(folder)

    monkeypatch.setattr(records, "list_runs", slow)
    seen: list[str] = []

    async def go() -> None:
        app = AmpscopeApp(runs_dir=root)
        async with app.run_test(size=SIZE) as pilot:
            await shown(pilot, app, PresetsScreen)
            await pilot.press("h")
            history = await shown(pilot, app, HistoryScreen)
            seen.append(str(history.query_one("#history-title").render()))
            await pilot.press("escape")
            await shown(pilot, app, PresetsScreen)
            await pilot.press("h")
            history = await shown(pilot, app, HistoryScreen)
            stalled.set()  # the disk answers: the runs appear
            table = history.query_one("#history-table")
            assert await wait_for(pilot, lambda: table.row_count == 1, 10)
            await pilot.press("q")
            seen.append("quit" if await wait_for(pilot, lambda: not app.is_running, 10) else "")

    thread = threading.Thread(target=lambda: run(go()), daemon=True)
    thread.start()
    thread.join(HANG_S)
    stalled.set()
    thread.join(HANG_S)
    assert seen and seen[0].startswith("History · reading the records in "), seen
    assert seen[-1] == "quit"


@pytest.mark.ui
def test_the_dashboard_starts_beside_a_preset_and_a_keys_file_that_are_fifos(
    tmp_path: Path, monkeypatch
) -> None:
    """A FIFO under a ``.toml`` name, opened as a file is, waited for a writer for ever: the
    dashboard froze before it first drew. Each is said to be no file, and the rest works."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    folder = user_presets_dir()
    folder.mkdir(parents=True)
    fifos = [folder / "evil.toml", keys.keys_path()]
    for fifo in fifos:
        os.mkfifo(fifo)
    problems: list[str | None] = []
    told: list[tuple[str, str]] = []  # each notice as posted, and the screen up then

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path / "runs")
        tell = app.tell

        def recorded(message: str, **kw: Any) -> None:
            told.append((message, type(app.screen).__name__))
            tell(message, **kw)

        app.tell = recorded  # type: ignore[method-assign]
        async with app.run_test(size=SIZE) as pilot:
            presets = await shown(pilot, app, PresetsScreen)
            problems.extend(p.problem for p in presets.presets if p.name == "evil")
            # the notice is posted once the first screen drew (its 5 s then count where they
            # can be read): at load 8 one posted at mount had expired before that
            await wait_for(pilot, lambda: bool(told), 30)
            await pilot.press("h")  # the keys still work
            await shown(pilot, app, HistoryScreen)

    assert returns(lambda: run(go()), fifos)
    assert len(problems) == 1 and "not a regular file" in str(problems[0])
    (notice, screen), *_ = [t for t in told if str(keys.keys_path()) in t[0]]
    assert "not a regular file" in notice and screen == "PresetsScreen", told


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_preset_path_that_is_no_file_is_named_for_what_it_is(
    tmp_path: Path, capsys, kind
) -> None:
    """`run x.toml` where x.toml is a FIFO or a folder said the file 'does not exist'."""
    path = tmp_path / "x.toml"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    assert cli_main(["run", str(path), "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ampscope: {path}: cannot be read (") and "does not exist" not in err


@pytest.mark.ui
def test_saving_a_preset_over_a_fifo_says_so_and_the_dashboard_goes_on(
    tmp_path: Path, monkeypatch
) -> None:
    """Save wrote a preset by opening its file as a file is: a FIFO under that name waited
    for a reader for ever, and the dashboard froze on the enter that saved it."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    folder = user_presets_dir()
    folder.mkdir(parents=True)
    fifo = folder / "mine.toml"
    os.mkfifo(fifo)
    told: list[str] = []

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path / "runs")
        async with app.run_test(size=SIZE) as pilot:
            dialog = await save_dialog_for(pilot, app, "fp32")
            dialog.query_one("#save-name").value = "mine"
            await pilot.press("enter")
            await shown(pilot, app, PresetsScreen)
            told.extend(str(n.message) for n in app._notifications)
            await pilot.press("h")  # the keys still work
            await shown(pilot, app, HistoryScreen)

    assert returns(lambda: run(go()), [fifo])
    assert any(m.startswith("Cannot save: ") and "not a regular file" in m for m in told), told
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # left as it was


@pytest.mark.unit
def test_a_record_file_is_written_whole_beside_fifos_under_its_old_temporary_names(
    tmp_path: Path,
) -> None:
    """config.json, summary.json and live.json were written through a file of a fixed name
    (summary.tmp, .live.json.PID.tmp): a FIFO under one waited for a reader for ever, and the
    engine or the watched loop hung as it wrote its record."""
    fifos = [
        tmp_path / "summary.tmp",
        tmp_path / "config.tmp",
        tmp_path / f".{records.LIVE_FILE}.{os.getpid()}.tmp",
    ]
    for fifo in fifos:
        os.mkfifo(fifo)

    def write() -> None:
        records.write_json(tmp_path / records.SUMMARY_FILE, {"done": None})
        records.write_json(tmp_path / records.CONFIG_FILE, {"name": "x"})
        records.write_live(tmp_path, os.getpid())

    assert returns(write, fifos)
    assert json.loads((tmp_path / records.SUMMARY_FILE).read_text()) == {"done": None}
    assert json.loads((tmp_path / records.CONFIG_FILE).read_text()) == {"name": "x"}
    assert records.read_live(tmp_path)["pid"] == os.getpid()
    left = {p.name for p in tmp_path.iterdir() if p.suffix == ".tmp" or p.suffix == ".json"}
    assert left == {f.name for f in fifos} | {
        records.SUMMARY_FILE,
        records.CONFIG_FILE,
        records.LIVE_FILE,
    }  # no temporary file left behind


@pytest.mark.unit
@pytest.mark.parametrize("blank", ["", " ", "\t"])
@pytest.mark.parametrize(
    "argv",
    [
        ["runs", "--runs-dir", "{}"],
        ["--runs-dir", "{}", "runs"],
        ["run", "fp32", "--runs-dir", "{}"],
        ["stop", "--runs-dir", "{}"],
        ["bench", "fp32", "--runs-dir", "{}"],
        ["profile", "--runs-dir", "{}"],
        ["plan", "--runs-dir", "{}"],
    ],
)
def test_a_blank_runs_dir_is_a_user_error_never_the_current_folder(
    capsys, blank: str, argv: list[str]
) -> None:
    """``--runs-dir "$DIR"`` with DIR unset read as '.': runs went into the current folder and
    ``runs`` said "No runs in ..". A blank name is refused where it is typed."""
    with pytest.raises(SystemExit) as exit_:
        cli_main([blank if a == "{}" else a for a in argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--runs-dir" in err and "Traceback" not in err
    assert f"{blank!r} names no folder" in err and "Accepted: a folder's path" in err


@pytest.mark.unit
@pytest.mark.parametrize("blank", ["", " ", "\t\n"])
def test_a_blank_runs_dir_variable_is_unset_and_runs_go_to_runs(monkeypatch, blank) -> None:
    monkeypatch.setenv("AMPSCOPE_RUNS_DIR", blank)
    assert records.default_runs_dir() == Path("runs")
    monkeypatch.setenv("AMPSCOPE_RUNS_DIR", " elsewhere/r ")
    assert records.default_runs_dir() == Path(" elsewhere/r ")  # a name is taken as typed
