"""The README's commands are the first a user types: each parses, and the presets, examples and
docs it names exist."""

from __future__ import annotations

import re
import shlex

import pytest

from ampscope.cli.main import build_parser
from ampscope.cli.runs import EXAMPLES_DIR
from ampscope.core import presets
from tests.helpers import ROOT

README = ROOT / "README.md"


def readme_commands() -> list[list[str]]:
    found = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S):
        for line in block.splitlines():
            for part in line.split("&&"):
                argv = shlex.split(part, comments=True)
                if argv and argv[0] == "ampscope" and len(argv) > 1:
                    found.append(argv[1:])
    return found


@pytest.mark.unit
def test_every_command_in_the_readme_parses_and_names_what_exists() -> None:
    commands = readme_commands()
    assert len(commands) >= 10
    examples = {p.name for p in EXAMPLES_DIR.iterdir()}
    for argv in commands:
        args = build_parser().parse_args(argv)  # SystemExit(2) on anything argparse refuses
        for name in [getattr(args, "preset", None), *(getattr(args, "presets", None) or [])]:
            if name:
                presets.load_preset(name)  # ConfigError names what is wrong
        if args.command == "replay":
            assert args.run in examples, argv


@pytest.mark.unit
def test_every_doc_the_readme_links_exists() -> None:
    links = re.findall(r"\]\((docs/[^)#]+)\)", README.read_text())
    assert len(links) >= 10
    assert [link for link in links if not (ROOT / link).exists()] == []


@pytest.mark.unit
def test_the_readme_keeps_the_two_commands_ci_and_a_new_user_run() -> None:
    text = README.read_text()
    assert "pip install . && ampscope\n" in text
    test_command = "pip install -e '.[test,serve]' && python -m pytest -q -n auto --dist loadgroup"
    assert test_command in text
    assert "python -m pytest -q -n auto --dist loadgroup" in (ROOT / ".ci" / "run").read_text()
