"""A model's layers by kind: the members of a repeated block (``blocks.0-11.attn.proj``) as one
row, and which layers are measured when a model has more than ``MODULE_CAP``.
"""

from __future__ import annotations

import re

MODULE_CAP = 256  # leaf modules measured at most; beyond it, one of each repeated kind first


def group_label(names: list[str]) -> str:
    """``blocks.0.attn.proj`` .. ``blocks.11.attn.proj`` -> ``blocks.0-11.attn.proj``."""
    if len(names) == 1:
        return names[0]
    parts = [n.split(".") for n in names]
    out = []
    for i, first in enumerate(parts[0]):
        column = [p[i] for p in parts]
        if all(c == first for c in column):
            out.append(first)
        else:
            numbers = sorted(int(c) for c in column)
            out.append(f"{numbers[0]}-{numbers[-1]}")
    return ".".join(out)


def pattern(name: str) -> str:
    """A module name with its block numbers blanked: the members of a repeated block share it.

    Only a number with more of the name after it is a block's (``blocks.3.attn.proj``); a
    name that ends in a number is a layer of its own, one of a ``Sequential``'s or a
    ``ModuleList``'s (``0``, ``net.4``): a Linear and the GELU after it are never one row."""
    return re.sub(r"(?<=\.)\d+(?=\.)|^\d+(?=\.)", "*", name)


def group_names(names: list[str]) -> list[tuple[str, list[str]]]:
    """Repeated blocks as one row each, in the model's order: (label, member names)."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(pattern(name), []).append(name)
    return [(group_label(members), members) for members in groups.values()]


def choose_modules(names: list[str], cap: int = MODULE_CAP) -> list[str]:
    """At most ``cap`` names, in the model's order; beyond the cap, every repeated kind of
    layer keeps a member before any kind keeps a second one."""
    if len(names) <= cap:
        return list(names)
    members = [m for _, m in group_names(names)]
    chosen: set[str] = set()
    depth = 0
    while len(chosen) < cap:
        for group in members:
            if depth < len(group) and len(chosen) < cap:
                chosen.add(group[depth])
        depth += 1
    return [n for n in names if n in chosen]
