"""What a user types, a record holds or a folder contains never takes a command down.

Each case was a traceback or a hang before: a crafted preset, a garbage record, an escape
sequence in a name, a pid that belongs to someone else.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from ampscope.cli.main import main
from ampscope.core import events as ev
from ampscope.core import presets, records
from ampscope.core.processes import stopping
from ampscope.core.text import visible
from ampscope.core.units import fmt_bytes, fmt_done, fmt_loss, fmt_ms, fmt_num, fmt_steps, fmt_time
from tests.helpers import done, hello, owning_sleeper

ESCAPE = "evil\x1b]0;pwned\x07\x1b[2J"


def user_preset(name: str, text: str) -> Path:
    folder = presets.user_presets_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


@pytest.mark.unit
def test_visible_shows_control_characters_and_caps_length() -> None:
    assert visible(ESCAPE) == "evil\\x1b]0;pwned\\x07\\x1b[2J"
    assert (
        visible("é 中 [bold]x[/]") == "é 中 [bold]x[/]"
    )  # markup stays text; the UI never parses it
    assert visible("a\nb") == "a\\nb" and visible("a\nb", keep_newlines=True) == "a\nb"
    assert visible("x" * 50, 10) == "x" * 10 + "… (40 more characters)"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("name", "text", "reason"),
    [
        ("deep", "x = " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
        ("huge", "steps = " + "9" * 5000 + "\n", "a number too large"),
        ("notoml", "this is = = not toml\n", "not valid TOML"),
        ("binary", "\udcff", "not UTF-8"),
        ("unknown", 'description = "mine"\nbogus = 3\n', "unknown field 'bogus'"),
        ("badvalue", 'precision = "fp7"\n', "fp7"),
    ],
)
def test_a_broken_user_preset_is_listed_as_broken_and_the_rest_works(
    name: str, text: str, reason: str, capsys
) -> None:
    path = presets.user_presets_dir() / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    listed = {p.name: p for p in presets.list_presets()}
    assert reason in (listed[name].problem or "")
    assert listed["fp32"].problem is None and presets.load_preset("fp32").name == "fp32"
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert "BROKEN: " in out and str(path) in out
    assert main(["run", name, "--no-record"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and reason in err and "Traceback" not in err


@pytest.mark.unit
@pytest.mark.parametrize(
    "override",
    [
        "steps=" + "9" * 5000,
        "steps=99999999999999999999999",
        "batch_size=400000000",
        "workload.width=" + "[" * 3000 + "]" * 3000,
        "workload.layers=100000",
    ],
)
def test_absurd_overrides_are_refused_with_exit_2(override: str, capsys) -> None:
    assert main(["run", "fp32", "--no-record", "--set", override]) == 2
    err = capsys.readouterr().err
    key = override.partition("=")[0]
    assert err.startswith("ampscope: ") and key in err and "Traceback" not in err
    assert len(err) < 1000


@pytest.mark.unit
def test_preset_names_and_descriptions_are_printed_literally(capsys) -> None:
    toml_name = "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in ESCAPE)
    user_preset("esc", f'name = "{toml_name}"\ndescription = "[/] d"\n')
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "evil\\x1b]0;pwned\\x07" in out and "[/] d" in out


@pytest.mark.unit
def test_config_errors_name_the_key_and_the_flag_at_fault() -> None:
    with pytest.raises(presets.ConfigError) as info:
        presets.load_preset("fp32", ["workload.layers=0"])
    assert info.value.key == "workload.layers" and info.value.source == "--set workload.layers=0"
    with pytest.raises(presets.ConfigError) as info:
        presets.validate({"name": "x", "device": "tpu"}, source="form")
    assert info.value.key == "device" and str(info.value).startswith("form: ")


def write_record(root: Path, name: str, summary: object | None, events: str | None) -> Path:
    path = root / name
    path.mkdir(parents=True)
    if events is not None:
        (path / records.EVENTS_FILE).write_text(events)
    if summary is not None:
        (path / records.SUMMARY_FILE).write_text(
            summary if isinstance(summary, str) else json.dumps(summary)
        )
    return path


@pytest.mark.unit
def test_a_corpus_of_bad_records_never_breaks_the_listing(tmp_path: Path, capsys) -> None:
    line = ev.encode(hello()).decode().strip()
    write_record(tmp_path, "20260101T000000Z-list", [1, 2], line + "\n")
    write_record(tmp_path, "20260101T000001Z-text", "not json", line + "\n")
    write_record(tmp_path, "20260101T000002Z-empty", None, "")
    write_record(tmp_path, "20260101T000003Z-garbage", None, "\x00\xff garbage\n{]\n")
    write_record(tmp_path, "20260101T000004Z-future", None, '{"type": "hello", "v": 99}\n')
    absurd = json.loads(line)
    absurd["started_at"] = 1e308
    write_record(tmp_path, "20260101T000005Z-absurd", None, json.dumps(absurd) + "\n")
    write_record(tmp_path, f"20260101T000006Z-{ESCAPE}", None, line + "\n")
    runs = records.list_runs(tmp_path)
    assert len(runs) == 7
    problems = {r.name: r.problem for r in runs}
    assert "not a JSON object" in (problems["20260101T000000Z-list"] or "")
    assert "not valid JSON" in (problems["20260101T000001Z-text"] or "")
    assert main(["runs", "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "not a JSON object" in out
    for record in runs:
        records.load_run(record.path)  # the full read too: never raises


@pytest.mark.unit
def test_a_runs_folder_that_is_a_file_or_holds_an_escape_is_said_plainly(
    tmp_path: Path, capsys
) -> None:
    """'No runs in' echoed the folder's name raw (an ESC byte reached the terminal), and a
    --runs-dir that is a file listed as an empty folder."""
    assert main(["runs", "--runs-dir", str(tmp_path / f"x{ESCAPE}")]) == 0
    err = capsys.readouterr().err
    assert "\x1b" not in err and "No runs in" in err
    a_file = tmp_path / "records.txt"
    a_file.write_text("")
    assert main(["runs", "--runs-dir", str(a_file)]) == 2
    err = capsys.readouterr().err
    assert f"ampscope: the runs folder {a_file} is a file, not a folder of run records" in err


@pytest.mark.unit
def test_an_unreadable_record_is_named_not_raised(tmp_path: Path, monkeypatch) -> None:
    path = write_record(tmp_path, "20260101T000000Z-locked", {"hello": None}, "{}\n")
    real = os.open

    def denied(file, *args, **kwargs) -> int:
        if Path(file).parent == path:  # what a chmod 000 gives a user who is not root
            raise PermissionError(13, "Permission denied", str(file))
        return real(file, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied)
    (run,) = records.list_runs(tmp_path)
    assert run.problem and "Permission denied" in run.problem


@pytest.mark.unit
def test_formatters_take_whatever_a_record_holds() -> None:
    inf, nan = float("inf"), float("nan")
    assert [fmt_bytes(inf), fmt_num(nan), fmt_ms(-inf)] == ["inf", "nan", "-inf"]
    assert fmt_time(1e308) == "-" and fmt_time(None) == "-" and fmt_time(0).startswith("19")


def live_json(run_dir: Path, **fields: object) -> None:
    data = {"pid": os.getpid(), "host": socket.gethostname(), "heartbeat": time.time()}
    data.update(fields)
    (run_dir / records.LIVE_FILE).write_text(json.dumps(data))


@pytest.mark.subprocess
def test_a_foreign_pid_in_live_json_is_never_taken_for_the_engine(tmp_path: Path) -> None:
    sleeper = owning_sleeper(tmp_path)
    try:
        live_json(tmp_path, pid=sleeper.pid, proc_start=time.time() - 3600)  # a reused pid
        assert stopping.verified_pid(records.read_live(tmp_path) or {}, tmp_path) is None
        live_json(tmp_path, pid=sleeper.pid)  # no start time at all: a crafted record
        assert stopping.verified_pid(records.read_live(tmp_path) or {}, tmp_path) is None
        records.write_live(tmp_path, sleeper.pid)  # what the engine writes about itself
        assert stopping.verified_pid(records.read_live(tmp_path) or {}, tmp_path) == sleeper.pid
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.unit
def test_a_heartbeat_from_the_future_does_not_keep_a_record_live(tmp_path: Path) -> None:
    record = records.RunRecord(tmp_path)
    live_json(tmp_path, heartbeat=time.time() + 10 * 365 * 86400)
    assert records.run_state(record) != "live"


@pytest.mark.unit
def test_a_paused_engine_is_stalled_not_crashed(tmp_path: Path) -> None:
    record = records.RunRecord(tmp_path)
    records.write_live(tmp_path, os.getpid())
    assert records.run_state(record) == "live"
    later = time.time() + 2 * records.LIVE_STALE_S
    assert records.run_state(record, now=later) == "stalled"
    live_json(tmp_path, pid=2**22 + 12345, heartbeat=time.time() - 60)  # gone for good
    assert records.run_state(record) == "crashed"


@pytest.mark.unit
def test_byte_sizes_read_at_a_glance_never_in_exponents() -> None:
    mib, gib = 1 << 20, 1 << 30
    sizes = [1010 * mib, 1.5 * gib, 26.14 * gib, 150 * mib, 3 * 1024, 512]
    assert [fmt_bytes(n) for n in sizes] == [
        "1010 MiB",
        "1.5 GiB",
        "26.1 GiB",
        "150 MiB",
        "3 KiB",
        "512 B",
    ]


@pytest.mark.subprocess  # the two records are real engine runs (made once a session)
def test_a_deeply_nested_line_in_a_record_is_one_unreadable_line_not_a_crash(
    recorded_runs: Path, capsys
) -> None:
    """A line of 100,000 nested brackets raised RecursionError out of replay, profile
    --compare and memory --run: JSON's own parser recurses once per level."""
    from ampscope.tui.model.replay import ReplaySource
    from tests.helpers import split_profile

    nested = b'{"type": "step", "v": 1, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    a, b = sorted(recorded_runs.iterdir())
    for run_dir in (a, b):
        events = run_dir / records.EVENTS_FILE
        lines = events.read_bytes().splitlines(keepends=True)
        lines.insert(len(lines) - 1, ev.encode(split_profile(10.0, matmul=5000)))
        lines.insert(2, nested)
        events.write_bytes(b"".join(lines))
    assert ev.decode(nested).reason  # unreadable, said why
    run = records.load_run(a)
    assert run.status == "ok" and run.unreadable_lines == 1
    ReplaySource.load(a)  # the replay's source reads it whole
    assert main(["profile", "--compare", str(a), str(b)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert main(["memory", "--run", str(a)]) in (0, 1)
    assert "RecursionError" not in capsys.readouterr().err


def record_ending(root: Path, **figures: object) -> ev.DoneEvent:
    """A fp32 run's record under ``root``: its hello and a done of ``figures``."""
    run_dir = root / "20260101T000000Z-fp32"
    run_dir.mkdir()
    d = ev.empty_done("ok", None)
    for name, value in figures.items():
        setattr(d, name, value)
    (run_dir / records.EVENTS_FILE).write_bytes(ev.encode(hello()) + ev.encode(d))
    return d


@pytest.mark.unit
def test_a_negative_step_time_in_a_record_is_never_shown_as_a_duration(tmp_path: Path, capsys):
    """Before: a done event with step_ms_median -3 was listed as '-3.00 ms' by 'ampscope runs'
    and History, a figure no run can have."""
    record_ending(tmp_path, steps_done=5, step_ms_median=-3.0)
    assert main(["--runs-dir", str(tmp_path), "runs"]) == 0
    out = capsys.readouterr().out
    assert "20260101T000000Z-fp32" in out and "ms" not in out.splitlines()[-1]
    assert fmt_ms(-3.0) == "?" and fmt_ms(3.0) == "3.00 ms"
    assert fmt_ms(0.0042) == "4.20 \u00b5s" and fmt_ms(0.0) == "0.00 ms"  # was "0.00 ms"


@pytest.mark.unit
def test_a_negative_step_count_in_a_record_is_never_shown_as_a_count(tmp_path: Path, capsys):
    """Before: a done event with steps_done -7 was listed as '-7' steps by 'ampscope runs' and
    History, and the Run view said '-7 steps'."""
    d = record_ending(tmp_path, steps_done=-7)
    assert main(["--runs-dir", str(tmp_path), "runs"]) == 0
    # the record's own row: the header names the runs folder, whose path may hold "-7"
    # (pytest's pytest-731)
    row = capsys.readouterr().out.splitlines()[-1].split()
    assert row[0] == "20260101T000000Z-fp32" and row[2] == "?" and "-7" not in row
    assert "-7" not in fmt_done(d) and "run ok: ? steps" in fmt_done(d)
    assert [fmt_steps(None), fmt_steps(-7), fmt_steps(12)] == ["-", "?", "12"]


@pytest.mark.unit
def test_a_run_folder_named_in_another_encoding_lines_up_in_runs(tmp_path: Path, capsys) -> None:
    """A Latin-1 folder name: its byte is a lone surrogate, which the table measured as one
    column and the output wrote as six (\\udcff), pushing its row out of line."""
    for name in (b"20260101T000000Z-caf\xe9", b"20260101T000001Z-cafe"):
        run_dir = tmp_path / os.fsdecode(name)
        run_dir.mkdir()
        (run_dir / records.EVENTS_FILE).write_bytes(ev.encode(hello()) + ev.encode(done()))
    assert main(["--runs-dir", str(tmp_path), "runs"]) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    assert rows[1].startswith("20260101T000000Z-caf\\xe9  ")
    assert [row.index("ok") for row in rows] == [rows[0].index("ok")] * 2
    assert visible("caf\udce9") == "caf\\xe9"
    # as JSON, the name is text a strict reader takes (a lone "\\udce9" is refused)
    assert main(["--runs-dir", str(tmp_path), "runs", "--json"]) == 0
    paths = [row["path"] for row in json.loads(capsys.readouterr().out)]
    assert any(p.encode().endswith(b"caf\\xe9") for p in paths)
    # and the name as printed finds the folder (attach, replay, memory --run, profile, stop)
    from ampscope.cli.runs import resolve_run
    from ampscope.cli.stop import find_run

    real = tmp_path / os.fsdecode(b"20260101T000000Z-caf\xe9")
    assert resolve_run("20260101T000000Z-caf\\xe9", tmp_path) == real
    assert find_run(str(tmp_path / "20260101T000000Z-caf\\xe9"), tmp_path) == real


@pytest.mark.unit
def test_a_diverged_runs_huge_loss_is_shown_in_a_few_digits(tmp_path: Path, capsys) -> None:
    """A loss of 1e30 (a diverging regression) is a float32 any run can end on: 'ampscope
    runs' and run's progress printed all 31 of its digits and '.0000', 309 for 1e308."""
    record_ending(tmp_path, steps_done=5, loss_final=-1.2345678e30)
    assert main(["--runs-dir", str(tmp_path), "runs"]) == 0
    row = capsys.readouterr().out.splitlines()[-1]
    assert row.endswith("  -1.235e+30") and len(row) < 80
    assert [fmt_loss(1e308), fmt_loss(999999.0), fmt_loss(2.5)] == [
        "1e+308",
        "999999.0000",
        "2.5000",
    ]


@pytest.mark.unit
@pytest.mark.parametrize("command", ["replay", "attach", "stop"])
def test_a_runs_folder_that_is_a_file_is_refused_by_every_command_that_takes_a_run(
    tmp_path: Path, capsys, command: str
) -> None:
    """Before: replay played a shipped example instead ('no finished run in records.txt'),
    attach and stop said 'no live run' and exited 1, as if the folder held no run."""
    from ampscope.cli import runs as runs_cli
    from ampscope.cli.main import command_args
    from ampscope.cli.stop import cmd_stop

    a_file = tmp_path / "records.txt"
    a_file.write_text("")
    args = command_args(["--runs-dir", str(a_file), command])
    opened: list[object] = []

    def dashboard(args, source) -> int:
        opened.append(source)
        return 0

    if command == "stop":
        code = cmd_stop(args)
    else:
        code = getattr(runs_cli, f"cmd_{command}")(args, dashboard)
    err = capsys.readouterr().err
    assert code == 2 and opened == []
    assert f"ampscope: the runs folder {a_file} is a file, not a folder of run records" in err


@pytest.mark.unit
@pytest.mark.parametrize(
    "args",
    [
        ["runs", "--runs-dir", "{long}"],
        ["stop", "--runs-dir", "{long}"],
        ["replay", "--runs-dir", "{long}"],
        ["memory", "--run", "{long}"],
        ["memory", "--model", "{long}.py:make"],
        ["run", "{long}.toml"],
    ],
)
def test_a_path_that_cannot_be_looked_at_is_said_in_one_line(
    tmp_path: Path, capsys, args: list[str]
) -> None:
    """A path the system will not look up (a folder on the way that is not yours to search,
    a name past the file system's limit) was a traceback in every command that takes one:
    pathlib's exists() and is_file() raise for those instead of answering."""
    long = str(tmp_path / ("x" * 300))  # one name past the 255 bytes a file system allows
    assert main([a.format(long=long) for a in args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ampscope: cannot use {long}") and err.count("\n") == 1
    assert err.endswith(": File name too long.\n")


@pytest.mark.unit
def test_the_launcher_log_is_kept_in_a_run_folder_whose_path_is_not_utf8(tmp_path: Path) -> None:
    """Before: the hello names such a folder with those bytes escaped (\\xe9), as the engine
    writes it; no folder had that name, and torchrun's output was lost without a word."""
    from ampscope.cli.torchrun import LAUNCHER_LOG, TorchrunWatch
    from ampscope.core.presets.parallel import Launch

    folder = Path(os.fsdecode(bytes(tmp_path) + b"/r\xe9s"))
    folder.mkdir()
    watch = TorchrunWatch(["torchrun"], Launch(2))
    said = ev.decode(ev.encode(hello(run_dir=str(folder))))
    assert isinstance(said, ev.HelloEvent) and "\\xe9" in str(said.run_dir)
    watch.hello = said
    watch.stderr.append("rank 1 exited with code 1")
    watch._save_log()
    assert (folder / LAUNCHER_LOG).read_text() == "rank 1 exited with code 1\n"
