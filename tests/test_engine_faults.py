"""Faults from outside the engine: a full disk, a removed or unwritable runs folder, a reader
that stops reading, a hang-up, a host that runs out of memory."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest
import torch

from ampscope.core import events as ev
from ampscope.core import records
from ampscope.core.processes.launch import engine_command
from ampscope.core.records import folders
from ampscope.engine.emitter import LiveStream
from ampscope.engine.lifecycle.parts import Parts
from ampscope.engine.lifecycle.run import EXIT_FAILED, EXIT_OK, EXIT_STOPPED, EXIT_USAGE, run
from tests.helpers import (
    FAST,
    ROOT,
    done,
    engine_env,
    gone,
    held_at_first_call,
    second_while_first_held,
    step,
    wait_until,
)

TINY = [*FAST, "workload.width=16", "workload.layers=2", "batch_size=4", "telemetry_hz=1"]


def decoded(data: bytes) -> list[ev.Event | ev.UnknownEvent]:
    return [ev.decode(line) for line in data.splitlines() if line.strip()]


def only(items: list, kind: type) -> list:
    return [e for e in items if isinstance(e, kind)]


def disk_with_room_for(budget: int):
    """``os.write`` as on a disk with ``budget`` bytes left for events.jsonl: a short write,
    then ENOSPC, like a real file system that fills up mid-line."""
    real_write = os.write
    left = [budget]

    def write(fd: int, data) -> int:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if not target.endswith(records.EVENTS_FILE):
            return real_write(fd, data)
        if left[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = real_write(fd, bytes(data[: left[0]]))
        left[0] -= n
        return n

    return write


@pytest.mark.unit
def test_a_full_disk_ends_the_run_failed_and_the_record_keeps_every_whole_line(
    tmp_path: Path, monkeypatch, capfd
) -> None:
    budget = 6000  # the hello and a few steps
    monkeypatch.setattr(os, "write", disk_with_room_for(budget))
    code = run("fp32", [*TINY, "steps=400"], json_out=True, runs_dir=tmp_path)
    monkeypatch.undo()
    out = capfd.readouterr().out.encode()
    assert code == EXIT_FAILED

    (run_dir,) = tmp_path.iterdir()
    stream = decoded(out)
    (error,) = only(stream, ev.ErrorEvent)
    assert error.kind == "io" and str(run_dir / records.EVENTS_FILE) in error.message
    assert "No space left on device" in error.message and "--runs-dir" in (error.hint or "")
    assert isinstance(stream[-1], ev.DoneEvent) and stream[-1].status == "failed"
    assert len(only(stream, ev.StepEvent)) < 400  # it stopped

    kept = (run_dir / records.EVENTS_FILE).read_bytes()
    lines = out.splitlines(keepends=True)
    assert kept.endswith(b"\n") and len(kept) <= budget
    n = kept.count(b"\n")
    assert kept == b"".join(lines[:n])  # the stream's first lines, none torn
    assert len(kept) + len(lines[n]) > budget  # and every line that fitted
    record = records.load_run(run_dir)
    assert record.status == "failed"  # the summary holds the done the events file lost
    assert record.done is not None and record.done.error and "No space" in record.done.error


class FullDisk:
    """A disk of ``capacity`` bytes under ``root``, shared by every file there: the events
    file's ``os.write`` (short, then ENOSPC), ``write_json`` and ``live.json`` (whole or
    ENOSPC) and a reservation (``posix_fallocate``). A removed file gives its room back."""

    def __init__(self, root: Path, capacity: int, monkeypatch) -> None:
        self.root, self.capacity = root, capacity
        real_write, real_replace = os.write, folders.write_text
        real_allocate = os.posix_fallocate

        def write(fd: int, data) -> int:
            if not self.ours(self.target(fd)):
                return real_write(fd, data)
            room = self.room()
            if room <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_write(fd, bytes(data[:room]))

        def replace(path: Path, text: str) -> None:
            if self.ours(str(path)) and len(text.encode()) > self.room():
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            real_replace(path, text)

        def allocate(fd: int, offset: int, size: int) -> None:
            if self.ours(self.target(fd)) and offset + size > self.room():
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real_allocate(fd, offset, size)

        monkeypatch.setattr(os, "write", write)
        monkeypatch.setattr(folders, "write_text", replace)
        monkeypatch.setattr(os, "posix_fallocate", allocate)

    @staticmethod
    def target(fd: int) -> str:
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return ""

    def ours(self, path: str) -> bool:
        return path.startswith(str(self.root) + os.sep)

    def room(self) -> int:
        used = sum(f.stat().st_size for f in self.root.rglob("*") if f.is_file())
        return self.capacity - used


@pytest.mark.unit
def test_a_disk_that_fills_mid_run_still_ends_the_record_failed_not_crashed(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """Events, summary.json and live.json all fail once the disk is full: the room the
    record held from its start takes its done and its summary."""
    from ampscope.core.records.writer import SPARE_BYTES
    from tests.test_detach import runs_json

    disk = FullDisk(tmp_path, SPARE_BYTES + 12_000, monkeypatch)
    code = run("fp32", [*TINY, "steps=400"], runs_dir=tmp_path)
    assert disk.room() > 0  # the spare's room, given back
    monkeypatch.undo()
    assert code == EXIT_FAILED
    (run_dir,) = tmp_path.iterdir()
    record = records.load_run(run_dir)
    assert record.done is not None and record.done.status == "failed"
    assert "No space left on device" in (record.done.error or "")
    assert 0 < len(only(record.events, ev.StepEvent)) < 400
    assert (run_dir / records.SUMMARY_FILE).is_file()
    assert not (run_dir / ".spare").exists() and not (run_dir / records.LIVE_FILE).exists()
    (row,) = runs_json(capsys, tmp_path)
    assert row["state"] == "failed"


@pytest.mark.unit
def test_a_runs_folder_removed_mid_run_ends_failed_with_an_io_error(tmp_path: Path) -> None:
    seen: list[ev.Event] = []

    def watch(event: ev.Event) -> None:
        seen.append(event)
        if isinstance(event, ev.StepEvent) and event.step == 3:
            shutil.rmtree(tmp_path / "runs")

    code = run("fp32", [*TINY, "steps=100000"], runs_dir=tmp_path / "runs", on_event=watch)
    assert code == EXIT_FAILED
    (error,) = only(seen, ev.ErrorEvent)
    assert error.kind == "io" and str(tmp_path / "runs") in error.message
    assert "No such file or directory" in error.message
    assert isinstance(seen[-1], ev.DoneEvent) and seen[-1].status == "failed"


@pytest.mark.subprocess
@pytest.mark.parametrize("json_flag", [True, False])
def test_an_unwritable_runs_folder_is_a_message_not_a_traceback(
    tmp_path: Path, json_flag: bool
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the runs folder should be\n")
    proc = subprocess.run(
        [sys.executable, "-m", "ampscope", "run", "fp32", "--runs-dir", str(blocker / "runs")]
        + (["--json"] if json_flag else []),
        capture_output=True,
        cwd=ROOT,
        env=engine_env(),
        timeout=120,
    )
    assert proc.returncode == EXIT_FAILED
    assert b"Traceback" not in proc.stderr
    assert f"cannot create the run record in {blocker}".encode() in proc.stderr
    assert b"Not a directory" in proc.stderr and b"--no-record" in proc.stderr
    if json_flag:
        (error,) = decoded(proc.stdout)
        assert isinstance(error, ev.ErrorEvent) and error.kind == "io"
        assert str(blocker) in error.message


@pytest.mark.unit
def test_a_read_only_runs_folder_names_the_folder_and_the_reason(tmp_path: Path, monkeypatch):
    def refuse_mkdir(root: Path, name: str) -> Path:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(root))

    monkeypatch.setattr(records, "new_run_dir", refuse_mkdir)
    seen: list[ev.Event] = []
    assert run("fp32", FAST, runs_dir=tmp_path, on_event=seen.append) == EXIT_FAILED
    (error,) = seen
    assert isinstance(error, ev.ErrorEvent) and error.kind == "io"
    assert f"in {tmp_path}: Permission denied" in error.message


@pytest.mark.unit
@pytest.mark.parametrize("below", ["", "runs"])
def test_a_runs_folder_that_is_a_file_is_called_a_file(tmp_path: Path, below: str) -> None:
    """--runs-dir naming a file said only 'File exists', which reads as if a run's folder
    clashed with another."""
    a_file = tmp_path / "records.txt"
    a_file.write_text("")
    seen: list[ev.Event] = []
    runs_dir = a_file / below if below else a_file
    assert run("fp32", FAST, runs_dir=runs_dir, on_event=seen.append) == EXIT_FAILED
    (error,) = seen
    assert isinstance(error, ev.ErrorEvent) and error.kind == "io"
    assert f"({a_file} is a file, not a folder)" in error.message


# --------------------------------------------------------------------------- slow readers


@pytest.mark.unit
def test_the_live_stream_never_blocks_and_says_what_it_dropped() -> None:
    read_end, write_end = os.pipe()
    stream = LiveStream(write_end, max_lines=100)
    step = ev.encode(ev.PhaseEvent(phase="train", state="start"))
    try:
        for i in range(5000):  # far more than the pipe and the queue hold; nobody reads
            stream.put([(step, True)])
            if i % 1000 == 0:
                stream.put([(b'{"kept":1}\n', False)])  # never dropped
        assert stream.dropped > 4000

        chunks = bytearray()

        def read_all() -> None:
            while chunk := os.read(read_end, 65536):
                chunks.extend(chunk)

        reader = threading.Thread(target=read_all, daemon=True)
        reader.start()  # the reader comes back
        stream.close(timeout=10)
        os.close(write_end)
        reader.join(10)
    finally:
        os.close(read_end)
    lines = bytes(chunks).splitlines()
    assert lines.count(b'{"kept":1}') == 5
    warnings = only(decoded(bytes(chunks)), ev.WarningEvent)  # one a time it fell behind
    assert warnings and all(w.code == "live-stream-dropped" for w in warnings)
    told = sum(int(w.message.split()[0].replace(",", "")) for w in warnings)
    assert told == stream.dropped and "the record has them all" in warnings[0].message
    assert lines.count(step.strip()) + stream.dropped == 5000


@pytest.mark.subprocess
def test_an_engine_whose_reader_stops_reading_still_finishes(tmp_path: Path) -> None:
    steps = 400  # ~160 step lines fill a pipe: an engine that waited on its reader stops there
    cmd = engine_command("fp32", [*TINY, f"steps={steps}"], tmp_path)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=engine_env()
    )
    try:

        def record_done() -> bool:
            return any(
                isinstance(e, ev.DoneEvent)
                for d in tmp_path.iterdir()
                for e in records.tail_events(d / records.EVENTS_FILE)
            )

        assert wait_until(record_done, 300), "the engine waited for a reader that did not read"
        out = proc.stdout.read()  # the reader comes back: the rest arrives
        assert proc.wait(timeout=30) == EXIT_OK
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stream = decoded(out)
    assert isinstance(stream[-1], ev.DoneEvent) and stream[-1].steps_done == steps
    (run_dir,) = tmp_path.iterdir()
    assert len(only(records.load_run(run_dir).events, ev.StepEvent)) == steps


# --------------------------------------------------------------------------- hang-up


@pytest.mark.subprocess
def test_a_hang_up_stops_a_headless_run_like_sigterm(tmp_path: Path) -> None:
    """The SSH link drops: the terminal goes, the kernel sends SIGHUP, and writing to the
    terminal fails from then on. The run ends stopped, with its summary, exit 130."""
    master, slave = os.openpty()
    cmd = [sys.executable, "-m", "ampscope", "run", "fp32", "--runs-dir", str(tmp_path)]
    for item in [*TINY, "steps=100000"]:
        cmd += ["--set", item]

    def take_the_terminal() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(
        cmd,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
        preexec_fn=take_the_terminal,  # noqa: PLW1509 - the session must own the terminal
        env=engine_env(TERM="xterm"),
    )
    os.close(slave)
    output = bytearray()

    def drain() -> None:
        with contextlib.suppress(OSError):
            while chunk := os.read(master, 65536):
                output.extend(chunk)

    threading.Thread(target=drain, daemon=True).start()
    try:

        def stepping() -> bool:
            return any(
                isinstance(e, ev.StepEvent)
                for d in tmp_path.iterdir()
                for e in records.tail_events(d / records.EVENTS_FILE)
            )

        assert wait_until(stepping, 120), bytes(output[-2000:])
        os.close(master)  # the terminal hangs up
        master = -1
        assert proc.wait(timeout=60) == EXIT_STOPPED
    finally:
        if master >= 0:
            os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (run_dir,) = tmp_path.iterdir()
    record = records.load_run(run_dir, with_events=False)  # from summary.json
    assert record.done is not None and record.done.status == "stopped"
    assert record.done.steps_done > 0 and record.problem is None
    assert gone(proc.pid)


# --------------------------------------------------------------------------- host memory


@pytest.mark.unit
def test_a_failed_host_allocation_is_an_oom_error_with_a_hint(tmp_path: Path):
    import torch

    from ampscope.engine.lifecycle import loop

    try:
        torch.empty(1 << 56, dtype=torch.uint8)  # what the CPU allocator says when it cannot
    except RuntimeError as exc:
        refusal = exc
    real_step = loop.train_step

    def step_that_runs_out(s, step: int, *rest):
        if step == 2:
            raise refusal
        return real_step(s, step, *rest)

    seen: list[ev.Event] = []
    parts = Parts(train_step=step_that_runs_out)
    code = run("fp32", [*TINY, "steps=6"], runs_dir=tmp_path, on_event=seen.append, parts=parts)
    (error,) = only(seen, ev.ErrorEvent)
    assert code == EXIT_FAILED and error.kind == "oom" and error.step == 2
    assert error.message.startswith("Out of memory at step 2: DefaultCPUAllocator")
    assert str(1 << 56) in error.message and error.hint and "batch_size" in error.hint
    assert not error.traceback


GIB = 1 << 30


@pytest.mark.unit
def test_a_batch_far_beyond_the_hosts_memory_is_refused_before_anything_is_built(
    tmp_path: Path,
) -> None:
    import dataclasses

    from ampscope.engine.step.validation import read_facts

    def a_host_of_8_gib(info, grouped):
        return dataclasses.replace(
            read_facts(info, grouped), host_memory=lambda: (6 * GIB, 8 * GIB)
        )

    built = []
    parts = Parts(facts=a_host_of_8_gib, build=lambda *a: built.append(a))
    seen: list[ev.Event] = []
    code = run(
        "mlp-demo", ["batch_size=400000"], runs_dir=tmp_path, on_event=seen.append, parts=parts
    )
    assert code == EXIT_USAGE and built == []
    (error,) = only(seen, ev.ErrorEvent)
    assert error.kind == "config" and error.message.startswith("batch_size = 400000")
    assert "13.1 GiB" in error.message  # the pool: 32 batches of 400000 x 256 fp32 values
    assert "the host's 8 GiB, 6 GiB available" in error.message


@pytest.mark.unit
def test_a_batch_that_may_not_fit_is_warned_about() -> None:
    from ampscope.core import presets
    from ampscope.engine.step.preflight import check_memory

    preset = presets.load_preset("mlp-demo", ["batch_size=40000"])  # about 1.6 GiB
    [(code, message)] = check_memory(preset, "cpu", False, host=lambda: (4 * GIB, 5 * GIB))
    assert code == "memory-estimate" and "of 4 GiB available" in message
    assert check_memory(preset, "cpu", False, host=lambda: (64 * GIB, 64 * GIB)) == []


@pytest.mark.unit
@pytest.mark.parametrize("name", ["mlp-demo", "cnn-amp-bf16", "fp32"])
def test_the_memory_estimate_holds_what_the_built_run_holds(name: str) -> None:
    """Checked against the tensors themselves: the pool, and after a step the weights,
    gradients and AdamW's state."""
    from ampscope.core import presets
    from ampscope.engine.device import resolve_device
    from ampscope.engine.lifecycle.loop import train_step
    from ampscope.engine.step.preflight import estimate
    from ampscope.engine.step.setup import build

    overrides = ["device='cpu'", "batch_size=8"] + (
        ["workload.kind='gpt'"] if name == "fp32" else []
    )
    preset = presets.load_preset(name, overrides)
    s = build(preset, resolve_device("cpu"))
    train_step(s, 0, False)
    need = estimate(preset, on_cuda=False)
    pool = s.workload.pool.inputs.nbytes + s.workload.pool.targets.nbytes
    state = sum(2 * p.nbytes for p in s.model.parameters())  # a gradient is its weight's size
    state += sum(
        t.nbytes
        for per_param in s.optimizer.state.values()
        for t in per_param.values()
        if isinstance(t, torch.Tensor) and t.dim() > 0
    )
    assert pool <= need.data <= 3 * pool  # the estimate adds the temporaries of building it
    assert need.model == pytest.approx(state, rel=0.02)


@pytest.mark.unit
def test_a_disk_full_before_the_record_begins_leaves_no_folder_behind(
    tmp_path: Path, monkeypatch, capfd
) -> None:
    """The folder was made, its config.json could not be written: it stayed, empty, and
    ``ampscope runs`` listed it as a crashed run."""

    def full(path, data) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(records, "write_json", full)
    code = run("fp32", [*TINY, "steps=3"], json_out=True, runs_dir=tmp_path)
    monkeypatch.undo()
    out = capfd.readouterr().out.encode()
    assert code == EXIT_FAILED
    (error,) = only(decoded(out), ev.ErrorEvent)
    assert error.kind == "io" and "No space left on device" in error.message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.unit
def test_lines_taken_by_two_threads_at_once_reach_the_record_in_the_order_queued(
    tmp_path: Path,
) -> None:
    """A watched loop's close and its monitor's thread each took queued lines and wrote them:
    the one taken later (the done) could reach the file first, and a fast loop's record
    ended on a step after its done (two CI runs of the suite failed so)."""
    from ampscope.core.records.writer import RecordWriter

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    writer = RecordWriter(run_dir, {}, queued=True)
    taken, let_go = threading.Event(), threading.Event()
    # the first writer holds its chunk on a slow disk
    writer.events.append = held_at_first_call(writer.events.append, taken, let_go)  # type: ignore[method-assign]
    writer.append(ev.encode(step(0)))
    second_while_first_held(
        writer.write_queued,
        writer.write_queued,
        taken,
        let_go,
        between=lambda: writer.append(ev.encode(done(steps=1))),
    )
    kinds = [type(e).__name__ for e in records.load_run(run_dir).events]
    assert kinds == ["StepEvent", "DoneEvent"]
