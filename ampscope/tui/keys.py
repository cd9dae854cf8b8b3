"""The dashboard's keys: which matter most, and the user's own from ``keys.toml``.

Every binding has an id (``run.stop``, ``presets.history``, ``quit``...). A user remaps keys in
``~/.config/ampscope/keys.toml`` (``$XDG_CONFIG_HOME`` is honoured), one line per binding::

    "run.stop" = "x"
    "presets.history" = "H,ctrl+h"

The help screen (``?``) lists every id with its keys. A file that cannot be read, an unknown
id or a key Textual has no name for is said in one notice and otherwise ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from textual.binding import Binding
from textual.keys import Keys, key_to_character

from ampscope.core.presets import user_config_dir
from ampscope.core.presets.toml_text import read_config_file, tomllib  # tomli before Python 3.11
from ampscope.tui.private_apis import character_to_key

KEYS_FILE = "keys.toml"
MAX_KEYS_BYTES = 1 << 20
"""A keys file is a few hundred bytes; one past this is not read as one."""
MODIFIERS = ("ctrl", "shift", "alt", "meta", "super", "hyper")
NAMED_KEYS = {k.value for k in Keys if "+" not in k.value and not k.value.startswith("<")}

PRIORITY: dict[str, int] = {
    # the screen's own main key first
    "presets.run": 0,
    "run.stop": 0,
    "replay.pause": 0,
    "history.open": 0,
    "viewer.current-run": 0,
    "confirm.yes": 0,
    "confirm.no": 0,
    "help.close": 0,
    "too-small.quit": 0,
    # then the two a newcomer needs everywhere
    "help": 1,
    "quit": 1,
    "app.quit": 1,
    # then the way back and the next things to try
    "run.back": 2,
    "history.back": 2,
    "compare.back": 2,
    "formats.back": 2,
    "formats.values": 3,
    "formats.facts": 3,
    "formats.demos": 3,
    "memory.back": 2,
    "machine.back": 2,
    "presets.machine": 6,  # in help and the palette; the footer keeps the run's keys first
    "save.cancel": 2,
    "form.leave": 2,
    "run.restart": 3,
    "run.profile": 4,
    "profile.back": 2,
    "presets.history": 3,
    "presets.live-run": 3,
    "presets.sweep": 3,  # shown once two presets are marked
    "presets.repeats": 4,  # shown once a preset is marked
    "presets.mark": 4,
    "history.compare": 3,
    "history.mark": 3,
    "compare.baseline": 3,
    "run.numerics": 3,
    "numerics.format": 0,
    "numerics.metric": 0,
    "numerics.back": 2,
    "numerics.plan": 3,
    "presets.plan": 5,
    "plan.train": 0,
    "plan.back": 2,
    "plan.sort": 3,
    "plan.target": 4,
    "plan.again": 4,
}
"""Which keys the footer keeps when the terminal is narrow: lower first. Others rank 5."""
DEFAULT_PRIORITY = 5


def priority(binding_id: str | None) -> int:
    return PRIORITY.get(binding_id or "", DEFAULT_PRIORITY)


def keys_path() -> Path:
    return user_config_dir() / KEYS_FILE


def valid_key(key: str) -> bool:
    """A key Textual can bind: ``x``, ``?``, ``f5``, ``ctrl+x``, ``shift+tab``, ``question_mark``."""
    *mods, base = key.strip().split("+")
    if not base or any(m not in MODIFIERS for m in mods):
        return False
    if len(base) == 1:
        return base.isprintable()
    return base in NAMED_KEYS or key_to_character(base) is not None


def normalise(keys: str) -> str:
    """``?,F5`` -> ``question_mark,f5``: the names Textual matches key presses with."""
    out = []
    for key in keys.split(","):
        key = key.strip()
        *mods, base = key.split("+")
        if len(base) == 1:
            base = character_to_key(base)
        elif not mods:
            base = base.lower()
        out.append("+".join([*(m.lower() for m in mods), base]))
    return ",".join(out)


def load_keymap(path: Path, known_ids: Iterable[str]) -> tuple[dict[str, str], list[str]]:
    """The keymap in ``path`` (empty when there is no file), and what was wrong with it."""
    try:
        text = read_config_file(path, MAX_KEYS_BYTES)
        if len(text) > MAX_KEYS_BYTES:
            return {}, [f"{path} is larger than 1 MiB, so no keys file; the default keys apply."]
        data = tomllib.loads(text.decode())
    except FileNotFoundError:
        return {}, []
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        return {}, [f"{path} cannot be read ({exc}); the default keys apply."]
    known = set(known_ids)
    keymap: dict[str, str] = {}
    problems: list[str] = []
    for binding_id, keys in data.items():
        if binding_id not in known:
            problems.append(f"'{binding_id}' is no binding id (the help screen, ?, lists them)")
        elif not isinstance(keys, str) or not keys.strip():
            problems.append(f'\'{binding_id}\' needs keys as a string, such as "x" or "x,ctrl+x"')
        elif bad := [k for k in keys.split(",") if not valid_key(k)]:
            problems.append(
                f"'{binding_id}': {', '.join(repr(k.strip()) for k in bad)} is no key "
                "(accepted: a character, f1-f24, home, end, escape, enter, tab, space, "
                "arrows, with ctrl+, shift+ or alt+ in front)"
            )
        else:
            keymap[binding_id] = normalise(keys)
    if problems:
        problems = [f"{path}: " + "; ".join(problems) + ". Those lines are ignored."]
    return keymap, problems


def bindings_of(owner: type) -> list[Binding]:
    """Every binding a screen or app class has, its Textual bases' included."""
    found: list[Binding] = []
    for klass in reversed(owner.__mro__):
        found += [b for b in klass.__dict__.get("BINDINGS", []) if isinstance(b, Binding)]
    return found


def screen_name(owner: type) -> str:
    name = owner.__name__.removesuffix("Screen").removesuffix("Dialog")
    return f"the {name} screen" if name else "every screen"


def drop_clashes(
    keymap: dict[str, str], app: type, screens: Sequence[type]
) -> tuple[dict[str, str], list[str]]:
    """The keymap less the lines that give a key another binding of the same screen (or the
    app) already has, and one notice naming both. Textual would otherwise let one of them
    take the key with no word of which."""
    kept = dict(keymap)
    problems: list[str] = []
    app_bindings = bindings_of(app)
    for screen in screens:
        scope = [*bindings_of(screen), *app_bindings]
        for binding_id, new in keymap.items():
            if binding_id not in kept or not any(b.id == binding_id for b in scope):
                continue
            wanted = set(new.split(","))
            for other in scope:
                if other.id == binding_id:
                    continue
                theirs = kept.get(other.id, other.key) if other.id else other.key
                taken = sorted(wanted & set(normalise(theirs).split(",")))
                if taken:
                    what = f"'{other.id}'" if other.id else f"Textual's {other.action}"
                    problems.append(
                        f"'{binding_id}' = \"{new}\" is ignored: {', '.join(taken)} is already "
                        f"{what} on {screen_name(screen)} (pick a free key: the help screen, "
                        "?, lists every binding's keys)"
                    )
                    del kept[binding_id]
                    break
    return kept, problems
