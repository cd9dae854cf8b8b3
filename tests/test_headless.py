"""The headless commands' output: the run folder at the end of a run, ``stop``, a bench table
that fits the terminal, and help that says what each flag does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ampscope.cli.main import build_parser
from ampscope.cli.main import main as cli_main
from ampscope.core import comparison, records
from ampscope.tui.app import missing_terminal, terminal_refusal
from tests.helpers import gone, owning_sleeper, wait_gone, write_finished_record
from tests.test_detach import make_record


@pytest.mark.unit
def test_run_says_where_its_record_is(tmp_path: Path, capsys) -> None:
    code = cli_main(
        ["run", "fp32", "--steps", "2", "--device", "cpu", "--set", "workload.kind='mlp'"]
        + ["--runs-dir", str(tmp_path)]
    )
    out = capsys.readouterr().out  # stdout: what a script captures
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert code == 0
    assert out.rstrip().splitlines()[-1] == f"run record: {run_dir}"  # the last line, whole
    assert "loss first -> final" in out and "[#" not in out  # the summary, no progress bar
    assert (run_dir / records.EVENTS_FILE).is_file()


@pytest.mark.subprocess
def test_stop_signals_only_the_verified_engine_of_a_live_run(tmp_path: Path, capsys) -> None:
    engine = owning_sleeper(tmp_path / "20260101T000002Z-fp32")  # holds the record's .owner
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        live = make_record(tmp_path, "20260101T000002Z-fp32", engine.pid)
        # a stale record naming a pid that now belongs to someone else (its start time differs)
        stale = make_record(tmp_path, "20260101T000001Z-fp32", bystander.pid)
        data = records.read_live(stale)
        data["proc_start"] -= 3600
        (stale / records.LIVE_FILE).write_text(json.dumps(data))
        assert cli_main(["stop", stale.name, "--runs-dir", str(tmp_path)]) == 1
        assert "nothing to stop" in capsys.readouterr().err and not gone(bystander.pid)

        assert cli_main(["stop", "--runs-dir", str(tmp_path), "--wait", "5"]) == 0  # the newest
        assert wait_gone(engine.pid, 5)
        out, err = capsys.readouterr()
        assert f"stopping {live.name} (pid {engine.pid})" in err
        assert out.startswith(str(live)) and not gone(bystander.pid)
    finally:
        for proc in (engine, bystander):
            proc.kill()
            proc.wait()


@pytest.mark.unit
def test_stop_says_why_it_stops_nothing(tmp_path: Path, capsys) -> None:
    finished = write_finished_record(tmp_path, "fp32")
    assert cli_main(["stop", finished.name, "--runs-dir", str(tmp_path)]) == 1
    assert f"{finished.name} is not running on this host (ok)" in capsys.readouterr().err
    assert cli_main(["stop", "--runs-dir", str(tmp_path)]) == 1
    assert "no live run" in capsys.readouterr().err
    assert cli_main(["stop", "no-such-run", "--runs-dir", str(tmp_path)]) == 2
    assert "no run record 'no-such-run'" in capsys.readouterr().err
    assert cli_main(["stop", "--wait", "nan"]) == 2
    assert "--wait nan is out of range" in capsys.readouterr().err
    assert cli_main(["stop", "--wait", "1e400"]) == 2  # said 'inf', which no one typed
    assert "--wait 1e400 is out of range" in capsys.readouterr().err
    assert cli_main(["stop", "--wait", "soon"]) == 2
    assert "--wait soon is not a number" in capsys.readouterr().err


def bench_rows() -> list[comparison.Row]:
    rows = [
        comparison.Row(
            preset=name,
            status="ok",
            runs=1,
            step_ms=ms,
            spread_lo=ms * 0.9,
            spread_hi=ms * 1.1,
            samples_per_s=1e5 / ms,
            tflops=1.5,
            mem_peak=1 << 30,
            loss_final=0.5,
        )
        for name, ms in (("fp32", 10.0), ("amp-bf16", 6.0), ("amp-fp16-noscale", 5.0))
    ]
    return comparison.compare(rows, "fp32")


@pytest.mark.unit
def test_bench_table_fits_the_terminal_in_blocks_of_whole_columns() -> None:
    rows = bench_rows()
    wide = comparison.render(rows, "fp32", "text").split("\n\n")[0].splitlines()
    assert max(len(line) for line in wide) > 80  # the table as a whole does not fit
    narrow = comparison.render(rows, "fp32", "text", width=80)
    first_verdict = comparison.verdicts(rows, "fp32")[0].split(":")[0] + ":"  # wrapped below
    table = narrow.split("\n\n" + first_verdict)[0]
    lines = table.splitlines()
    assert max(len(line) for line in lines) <= 80
    blocks = table.split("\n\n")
    assert len(blocks) >= 2
    heads = [block.splitlines()[0].split() for block in blocks]
    assert all(h[0] == "preset" for h in heads)  # each block names its rows
    titles = [t for t, _ in comparison.COLUMNS]
    joined = " ".join(" ".join(b.splitlines()[0].split("  ")) for b in blocks)
    for title in titles:
        assert title in joined  # no column lost or cut
    for block in blocks:  # every row in every block
        assert [line.split()[0] for line in block.splitlines()[1:]] == [r.preset for r in rows]


@pytest.mark.unit
def test_help_says_what_each_flag_does_and_its_default() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    for command in ("presets", "doctor"):
        json_flag = next(a for a in sub[command]._actions if "--json" in a.option_strings)
        assert json_flag.help and "JSON" in json_flag.help
    repeats = next(a for a in sub["bench"]._actions if "--repeats" in a.option_strings)
    assert f"default: {repeats.default}" in repeats.help % {"default": repeats.default}
    assert "stop" in sub and "default" in sub["stop"].format_help()


@pytest.mark.unit
def test_a_dumb_terminal_is_told_what_works_there() -> None:
    message = terminal_refusal("dumb")
    assert message and "TERM=dumb" in message and "ampscope run" in message
    assert terminal_refusal("xterm-256color") is None and terminal_refusal(None) is None


def refused_dashboard(tmp_path: Path, term: str) -> subprocess.CompletedProcess[bytes]:
    """The dashboard started with no terminal (input from /dev/null, output to pipes) under
    ``TERM=term``, once it has refused: exit 2, and no escape code written."""
    from tests.helpers import ROOT, engine_env

    proc = subprocess.run(
        [sys.executable, "-m", "ampscope", "--runs-dir", str(tmp_path)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env=engine_env(TERM=term),
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 2
    assert b"\x1b" not in proc.stdout + proc.stderr
    return proc


@pytest.mark.subprocess
def test_the_dashboard_refuses_term_dumb_without_escape_codes(tmp_path: Path) -> None:
    proc = refused_dashboard(tmp_path, "dumb")
    assert b"headless commands" in proc.stderr


@pytest.mark.unit
def test_a_dashboard_without_a_terminal_says_what_works_instead(monkeypatch) -> None:
    monkeypatch.delenv("TEXTUAL_DRIVER", raising=False)
    read, write = os.pipe()
    master, slave = os.openpty()
    try:
        assert missing_terminal(slave, slave) is None
        message = missing_terminal(read, slave)
        assert message and "its input here is not one" in message and "ampscope run" in message
        assert "input and output (stderr) here are not one" in (missing_terminal(read, write) or "")
        assert "output (stderr) here is not one" in (missing_terminal(slave, None) or "")
        monkeypatch.setenv("TEXTUAL_DRIVER", "textual.drivers.web_driver:WebDriver")
        assert missing_terminal(read, write) is None  # served: no terminal is needed
    finally:
        for fd in (read, write, master, slave):
            os.close(fd)


@pytest.mark.subprocess
def test_the_dashboard_started_with_no_terminal_ends_at_once_without_escape_codes(
    tmp_path: Path,
) -> None:
    """Before: started from a script (input from /dev/null, output to a pipe), the dashboard
    drew its screens into the pipe and waited for keys for ever."""
    proc = refused_dashboard(tmp_path, "xterm-256color")
    assert b"the dashboard needs a terminal" in proc.stderr
