"""Detached launches that fail, and preset text that must survive being written as TOML."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import tomllib

from ampscope.core import events as ev
from ampscope.core import presets, records
from ampscope.core.processes import launch
from ampscope.core.processes.launch import EngineDidNotStart, launch_detached
from tests.helpers import FAST, ROOT, engine_env, gone, wait_gone, wait_until

AWKWARD_TEXT = [
    "two\nlines",
    'a "quoted" \\ backslash',
    "\x1b]0;title\x07 and \x1b[2J",
    "tab\tcr\r nul\x00 del\x7f",
    "[/] [bold]x '''",
    "unicode é ✓ \u2028",
]


@pytest.mark.unit
@pytest.mark.parametrize("text", AWKWARD_TEXT)
def test_any_description_and_name_write_a_toml_that_reads_back_the_same(text: str) -> None:
    preset = msgspec.structs.replace(presets.load_preset("fp32"), description=text)
    written = presets.to_toml(preset)
    assert tomllib.loads(written)["description"] == text
    assert presets.validate(tomllib.loads(written)) == preset


@pytest.mark.subprocess
def test_a_preset_with_a_multi_line_description_runs_detached(tmp_path: Path) -> None:
    user = Path(os.environ["XDG_CONFIG_HOME"]) / "ampscope" / "presets"
    user.mkdir(parents=True)
    (user / "odd.toml").write_text(
        'name = "odd"\ndescription = """first line\nsecond \\u001b[31m line"""\n'
        'precision = "fp32"\n[workload]\nkind = "mlp"\n'
    )
    run_dir, pid = launch_detached("odd", [*FAST, "steps=3"], tmp_path)
    try:
        assert wait_gone(pid, 120)
        record = records.load_run(run_dir)
        assert record.status == "ok", (run_dir / launch.ENGINE_LOG).read_text()
        assert record.hello is not None
        assert record.hello.config["description"] == "first line\nsecond \x1b[31m line"
    finally:
        if not gone(pid):
            os.killpg(pid, 9)


@pytest.mark.subprocess
def test_detach_reports_an_engine_that_dies_at_once_with_its_reason(tmp_path: Path) -> None:
    """The launcher accepts the preset; the engine refuses it (no such GPU) and exits 2."""
    proc = subprocess.run(
        [sys.executable, "-m", "ampscope", "run", "fp32", "--detach"]
        + ["--set", "device='cuda:99'", "--runs-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=engine_env(),
        timeout=180,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""  # no run folder and pid, as if it ran
    assert "before it started" in proc.stderr and "CUDA" in proc.stderr
    assert "Traceback" not in proc.stderr
    (run_dir,) = tmp_path.iterdir()
    assert not (run_dir / records.LIVE_FILE).exists()


@pytest.mark.subprocess
def test_an_engine_that_cannot_even_start_is_reported_from_its_log(tmp_path: Path) -> None:
    broken = {**os.environ, "PYTHONHOME": str(tmp_path / "no-python-here")}
    with pytest.raises(EngineDidNotStart) as failed:
        launch_detached("fp32", FAST, tmp_path / "runs", env=broken)
    assert failed.value.code == 1
    assert "its log ends with" in str(failed.value) and "Python" in str(failed.value)
    # its record says so: not a crashed run in ampscope runs and History
    record = records.load_run(failed.value.run_dir)
    assert record.state == "failed" and record.done is not None
    assert "its log ends with" in (record.done.error or "")


@pytest.mark.subprocess
def test_a_detached_run_stopped_before_it_started_reads_stopped_not_failed(
    tmp_path: Path,
) -> None:
    """'ampscope stop' right after 'run --detach': SIGTERM reached the run while it imported
    torch, and its record said failed, "exited (code -15) before it started"."""

    def stop_at_once(proc: subprocess.Popen, run_dir: Path, wait_s: float) -> int | None:
        os.killpg(proc.pid, 15)  # what 'ampscope stop' sends
        return proc.wait(timeout=60)

    with pytest.raises(EngineDidNotStart) as ended:
        launch_detached("fp32", FAST, tmp_path, wait=stop_at_once)
    assert ended.value.stopped and "was stopped before it started" in str(ended.value)
    record = records.load_run(ended.value.run_dir)
    assert record.state == "stopped" and record.done is not None
    assert record.done.error is None and record.unreadable_lines == 0
    assert not [e for e in record.events if isinstance(e, ev.ErrorEvent)]


@pytest.mark.unit
def test_the_dashboard_is_told_why_a_detached_run_did_not_start(tmp_path: Path) -> None:
    import asyncio

    from ampscope.tui.model.run_manager import RunManager
    from tests.helpers import FakeListener

    def launch_that_fails(preset, overrides, runs_dir):
        raise EngineDidNotStart(tmp_path / "20260101T000000Z-fp32", 2, "no CUDA GPU")

    async def go() -> None:
        listener = FakeListener()
        manager = RunManager(listener, tmp_path, launch=launch_that_fails)
        await manager.start_run("fp32", detach=True)
        assert listener.detached == []
        ((message, error, title),) = listener.told
        assert error and title == "Not started" and "no CUDA GPU" in message

    asyncio.run(go())


def record_has_hello(run_dir: Path) -> bool:
    return any(isinstance(e, ev.HelloEvent) for e in records.tail_events(run_dir / "events.jsonl"))


@pytest.mark.subprocess
def test_detach_returns_once_the_engine_said_hello(tmp_path: Path) -> None:
    run_dir, pid = launch_detached("fp32", [*FAST, "steps=100000"], tmp_path)
    try:
        assert record_has_hello(run_dir)  # no wait needed: it said hello before returning
        assert records.load_run(run_dir, with_events=False).state == "live"
    finally:
        os.killpg(pid, 15)
        assert wait_until(lambda: gone(pid), 30)


@pytest.mark.unit
def test_the_engine_takes_the_launchers_owner_descriptor_and_no_child_of_its_inherits_it(
    tmp_path: Path,
) -> None:
    """The detached launcher passes .owner with pass_fds, which leaves it inheritable in the
    engine: every os.system child of the user's code held the record's proof too."""
    from ampscope.core.processes import ownership

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    passed = ownership.claim_for_child(run_dir)
    os.set_inheritable(passed, True)  # as pass_fds leaves it in the child
    try:
        assert ownership.claim(run_dir) == passed  # held as its own, not opened again
        assert not os.get_inheritable(passed)
    finally:
        ownership.release(run_dir)
    with pytest.raises(OSError):
        os.fstat(passed)  # released with the record


@pytest.mark.subprocess
def test_ctrl_c_while_detach_waits_still_says_where_the_run_is(tmp_path: Path, capsys) -> None:
    """Ctrl+C during the wait for hello printed a traceback, and the run went on with its
    folder and pid never printed."""
    from ampscope.cli.main import command_args
    from ampscope.cli.runs import cmd_run_detached

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    args = command_args(
        ["run", "fp32", "--detach", "--runs-dir", str(tmp_path), "--device", "cpu",
         "--set", "workload.kind='mlp'", "--set", "steps=100000"]
    )  # fmt: skip
    code = cmd_run_detached(args, wait=interrupted)
    said = capsys.readouterr()
    (run_dir,) = tmp_path.iterdir()
    pid = int(said.out.split("pid ")[1].split()[0])
    try:
        assert code == 0, said.err
        assert str(run_dir) in said.out and "Traceback" not in said.err
        assert "ampscope attach" in said.err
    finally:
        os.killpg(pid, 15)
        assert wait_until(lambda: gone(pid), 30)


@pytest.mark.unit
def test_a_detached_runs_folder_is_shown_literally(tmp_path: Path, monkeypatch, capsys) -> None:
    """Before: a runs folder named with an escape sequence reached the terminal raw in the
    run folder and 'Watch it with' lines."""
    from ampscope.cli import runs
    from ampscope.cli.main import main

    run_dir = tmp_path / "odd\x1b]0;title\x07" / "20260101T000000Z-fp32"
    monkeypatch.setattr(runs, "launch_detached", lambda *args, **kwargs: (run_dir, 4242))
    assert main(["--runs-dir", str(run_dir.parent), "run", "fp32", "--detach"]) == 0
    said = capsys.readouterr()
    assert "\x1b" not in said.out + said.err
    assert "odd\\x1b]0;title\\x07/20260101T000000Z-fp32\npid 4242" in said.out
    assert "attach " + str(tmp_path) + "/odd\\x1b]0;title\\x07/" in said.err


@pytest.mark.unit
def test_a_runs_folder_that_cannot_be_made_is_the_users_input_at_fault(tmp_path: Path, capsys):
    """'run --detach' under a file said 'cannot start the engine: [Errno 20] ...' and exited 1,
    as if ampscope had failed, where every other command names --runs-dir and exits 2."""
    from ampscope.cli.main import main

    (tmp_path / "file").write_text("")
    runs = tmp_path / "file" / "runs"
    assert main(["--runs-dir", str(runs), "run", "fp32", "--detach"]) == 2
    err = capsys.readouterr().err
    assert f"cannot create the runs folder {runs}: Not a directory" in err
    assert f"({tmp_path / 'file'} is a file, not a folder)" in err
    assert "Pass --runs-dir with a writable folder" in err and "Errno" not in err
