"""A command whose output has nowhere to go: stdout on a full disk (/dev/full), or closed
(``>&-``). One line says so, or the command runs on with its output dropped: never a
traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ampscope.core import events as ev
from tests.helpers import FAST, engine_env, events_of

FULL_DISK = Path("/dev/full")


def ampscope(args: list[str], stdout: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m ampscope ARGS`` with stdout redirected as ``stdout`` says (shell syntax)."""
    line = " ".join([sys.executable, "-m", "ampscope", *args, stdout])
    return subprocess.run(
        ["sh", "-c", f"exec {line}"],
        cwd=cwd,
        env=engine_env(),
        capture_output=False,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )


@pytest.mark.subprocess
@pytest.mark.skipif(not FULL_DISK.exists(), reason="no /dev/full here")
@pytest.mark.parametrize("args", [["presets"], ["presets", "--json"], ["dtypes", "65504"]])
def test_stdout_on_a_full_disk_is_said_in_one_line(tmp_path: Path, args: list[str]) -> None:
    out = ampscope(args, "> /dev/full", tmp_path)
    assert out.returncode == 1
    assert out.stderr == "ampscope: a write failed: No space left on device.\n"  # was a traceback


@pytest.mark.subprocess
@pytest.mark.parametrize("args", [["presets"], ["dtypes", "65504"]])
def test_a_closed_stdout_drops_the_output_without_a_traceback(tmp_path: Path, args) -> None:
    out = ampscope(args, ">&-", tmp_path)
    assert (out.returncode, out.stderr) == (0, "")


@pytest.mark.subprocess
def test_a_run_with_its_stdout_closed_trains_and_records(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    sets = [a for f in FAST for a in ("--set", f'"{f}"')]
    args = ["run", "fp32", *sets, "--steps", "2", "--runs-dir", str(runs)]
    out = ampscope(args, ">&-", tmp_path)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    (run_dir,) = runs.iterdir()
    (done,) = events_of(run_dir, ev.DoneEvent)
    assert done.status == "ok" and done.steps_done == 2


@pytest.mark.unit
def test_output_in_an_encoding_without_ampscopes_characters_shows_them_escaped(
    monkeypatch,
) -> None:
    """Before: under PYTHONIOENCODING=ascii, 'dtypes 1e-8' ended on a UnicodeEncodeError
    traceback at the first '…' it printed."""
    import io

    from ampscope.cli.main import main

    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="ascii")
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["dtypes", "1e-8"]) == 0
    out.flush()
    assert b"\\u2026" in raw.getvalue() and b"fp8 e5m2" in raw.getvalue()


@pytest.mark.unit
@pytest.mark.skipif(not FULL_DISK.exists(), reason="no /dev/full here")
def test_an_event_stream_on_a_full_disk_says_why_the_run_stops(capfd) -> None:
    """Before: 'run --json > /dev/full' ended 'stopped', exit 130, without a word: a full disk
    was taken for a reader that had left. A reader leaving (EPIPE) still goes unsaid."""
    import os

    from ampscope.engine.emitter import LiveStream

    line = ev.encode(ev.NoteEvent(code="x", message="x"))
    with open(FULL_DISK, "wb") as full:
        live = LiveStream(full.fileno())
        live.put([(line, False)])
        live.close()
        assert live.broken
    said = capfd.readouterr().err
    assert said == (
        "ampscope: the event stream could not be written (No space left on device): "
        "the run stops.\n"
    )
    read, write = os.pipe()
    os.close(read)
    live = LiveStream(write)
    live.put([(line, False)])
    live.close()
    os.close(write)
    assert live.broken and capfd.readouterr().err == ""
