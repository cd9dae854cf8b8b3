"""docs/lecture.md: every command it gives parses, names presets, fields and examples that
exist, and the instant ones run; every key it names does something on its screen.

The training commands' presets train two steps, as each line sets them; the
dashboard's key sequences are driven with Pilot in tests/test_formats_tabs.py (the Formats
screen) and tests/test_snapshots.py (Compare's sideways scroll)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from textual.binding import Binding
from textual.widgets import DataTable, OptionList

from ampscope.cli.main import build_parser
from ampscope.cli.runs import EXAMPLES_DIR
from ampscope.core import presets
from ampscope.core.presets.run_args import run_overrides
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.screens.compare import CompareScreen
from ampscope.tui.screens.formats import FormatsScreen
from ampscope.tui.screens.history import HistoryScreen
from ampscope.tui.screens.presets import PresetsScreen
from ampscope.tui.screens.run import RunScreen
from tests.helpers import ROOT, cli

LECTURE = ROOT / "docs" / "lecture.md"
SCREENS = {
    "Presets": (PresetsScreen,),
    "Formats": (FormatsScreen, DataTable, OptionList),  # its tables and its list of demos
    "History": (HistoryScreen, DataTable),
    "Compare": (CompareScreen, DataTable),  # left/right: the table's sideways scroll
    "Run": (RunScreen,),
}

ALIASES = {"esc": "escape"}
MEANT_TO_FAIL = {("amp-fp16", "examples/fp16_overflow.py:make")}
"""(preset, --model) of the guide's runs that fail on purpose: step 7's amp-fp16 skips every
step of the planted overflow, which the plan then trains."""
"""Keys as the guide (and the footer) writes them, as Textual names them."""


def commands() -> list[list[str]]:
    """Each ``ampscope ...`` line of the guide's bash blocks, as argv (comments dropped)."""
    text = LECTURE.read_text()
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            argv = shlex.split(line, comments=True)
            if argv and argv[0] == "ampscope":
                found.append(argv[1:])
    return found


def key_lines() -> list[tuple[str, list[str]]]:
    """``Keys, SCREEN: `a` `b``` lines: the screen and its keys, in order."""
    found = re.findall(r"^Keys, (\w+): (.+)$", LECTURE.read_text(), flags=re.M)
    return [(screen, re.findall(r"`([^`]+)`", keys)) for screen, keys in found]


def bound_keys(owners: tuple[type, ...]) -> set[str]:
    keys: set[str] = set()
    for owner in (*owners, AmpscopeApp):
        for binding in owner.BINDINGS:
            if isinstance(binding, Binding):
                keys.update(k.strip() for k in binding.key.split(","))
            else:  # a tuple: (key, action, description)
                keys.update(k.strip() for k in binding[0].split(","))
    return keys


@pytest.mark.unit
def test_the_readme_points_at_the_lecture_guide() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "docs/lecture.md" in readme and "demonstrations below" not in readme


@pytest.mark.unit
def test_the_guide_covers_the_lecture_in_seven_timed_steps() -> None:
    text = LECTURE.read_text()
    steps = re.findall(r"^## \d\. (.+) \((\d+) minutes?\)$", text, flags=re.M)
    assert len(steps) == 7, steps
    assert sum(int(minutes) for _, minutes in steps) == 17
    assert text.startswith("# A 17-minute lecture")
    assert len(commands()) >= 15 and len(key_lines()) >= 5


def planned_presets() -> dict[str, list[str]]:
    """The presets a ``plan`` line of the guide writes (``--out DIR``/plan.toml), each with
    the line that writes it: they exist once that line has run."""
    made = {}
    for argv in commands():
        if argv[:1] == ["plan"] and "--out" in argv:
            made[f"{argv[argv.index('--out') + 1]}/plan.toml"] = argv
    return made


@pytest.mark.unit
def test_every_command_in_the_guide_parses_and_names_what_exists() -> None:
    """Presets with their --set fields load; replays name a shipped example; a plan line's
    model is a shipped example."""
    examples = {p.name for p in EXAMPLES_DIR.iterdir()}
    planned = planned_presets()
    for argv in commands():
        args = build_parser().parse_args(argv)  # SystemExit(2) on anything argparse refuses
        if args.command == "plan":
            assert (ROOT / args.model.partition(":")[0]).is_file(), argv
        if args.command in ("run", "bench"):
            names = [args.preset] if args.command == "run" else args.presets
            for name in names:
                if name in planned:
                    continue  # written by its plan line: the slow test below runs them in turn
                presets.load_preset(name, run_overrides(args))  # ConfigError names what is wrong
        if args.command == "replay":
            assert args.run in examples, argv


@pytest.mark.unit
def test_every_replay_in_the_guide_plays_in_a_few_seconds_at_its_speed() -> None:
    """A lecture waits for each replay: played from the run's hello at the command's speed,
    none takes more than 10 s, and the first thing shown is the run itself, not a start-up."""
    from ampscope.core import events as ev
    from ampscope.core import records
    from ampscope.tui.model.replay import ReplaySource

    replays = [
        args for args in map(build_parser().parse_args, commands()) if args.command == "replay"
    ]
    assert len(replays) == 3
    for args in replays:
        events = records.load_run(EXAMPLES_DIR / args.run).events
        speed = float(args.speed)  # the command reads it, to echo a refused one as typed
        source = ReplaySource(events, speed=speed)
        assert source.duration / speed <= 10, args.run
        source.advance_to(0.0)
        assert isinstance(source.events[source.index - 1], ev.HelloEvent)  # shown at once


@pytest.mark.unit
def test_the_guides_instant_commands_run(capsys) -> None:
    """The dtypes lines, in this process: exit 0 and what the guide says they show."""
    said = {}
    for argv in commands():
        if argv[:1] == ["dtypes"]:
            done = cli(capsys, *argv)
            assert done.returncode == 0, (argv, done.stderr)
            said[" ".join(argv)] = done.stdout
    assert "65520" in said["dtypes --demo fp16-overflow"]
    assert (
        "1e-08" in said["dtypes --demo fp16-underflow"]
        or "1e-8" in said["dtypes --demo fp16-underflow"]
    )
    assert "256" in said["dtypes --demo sum-0.1"]


@pytest.mark.unit
def test_every_key_in_the_guide_is_bound_on_its_screen() -> None:
    for screen, keys in key_lines():
        assert screen in SCREENS, screen
        bound = bound_keys(SCREENS[screen])
        missing = [k for k in keys if ALIASES.get(k, k) not in bound]
        assert not missing, f"{screen}: {missing} not bound"


@pytest.mark.slow
def test_every_preset_the_guide_trains_trains_two_steps_as_its_command_sets_it(
    tmp_path: Path,
) -> None:
    """Each run and bench line's presets, with the line's own --set, --steps and --device
    turned into overrides as the command does, train two steps on the CPU and end ok. In this
    process: what ``run`` and ``bench`` add around the engine (its process, the table) is
    tested on their own, and each engine process costs seconds of imports. The compiled run
    trains eager here: a cold compile costs 20 s to minutes on a busy CPU, and the suite's own
    cold-compile test covers it."""
    from ampscope.cli.main import main
    from ampscope.engine.lifecycle.run import EXIT_FAILED, EXIT_OK, run

    trained = set()
    planned = planned_presets()
    for argv in commands():
        if argv[:1] == ["plan"]:  # the preset it writes, under tmp_path (without --verify)
            out = argv[argv.index("--out") + 1]
            kept = [a for a in argv if a not in ("--verify", "30")]
            kept[kept.index(out)] = str(tmp_path / out)
            assert main([*kept, "--device", "cpu"]) == 0, argv
        if argv[:1] not in (["run"], ["bench"]):
            continue
        args = build_parser().parse_args(argv)
        names = [args.preset] if args.command == "run" else args.presets
        names = [str(tmp_path / n) if n in planned else n for n in names]
        overrides = [str(o) for o in run_overrides(args)]
        overrides += ["steps=2", "device='cpu'", "warmup_steps=0", "compile='off'"]
        for name in names:
            if (name, tuple(overrides)) in trained:
                continue
            trained.add((name, tuple(overrides)))
            expected = EXIT_FAILED if (name, args.model) in MEANT_TO_FAIL else EXIT_OK
            assert run(name, overrides, runs_dir=tmp_path) == expected, (argv, name)
    assert len(trained) >= 4
