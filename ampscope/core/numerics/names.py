"""Layer names shortened to a column, from the left, never into two that read alike.

``model.layers.0-1.self_attn.q_proj`` in 24 columns is ``…0-1.self_attn.q_proj``: whole dotted
parts are dropped from the front (most names share their first parts: ``model.layers``) and
an ellipsis says so. A part is dropped only while no other name ends in what is left, so
``…q_proj`` never stands for two layers; a name no such shortening fits keeps the shortest
unique ending, wider than the column, and the column grows to it. No torch here.
"""

from __future__ import annotations

from collections.abc import Sequence

FOLD = "…"


def _ends_in(name: str, ending: str) -> bool:
    return name == ending or name.endswith("." + ending)


def fold_name(name: str, others: Sequence[str], width: int) -> str:
    """``name`` in at most ``width`` columns where a shortening from the left can keep it
    apart from every one of ``others``; else the shortest such shortening."""
    if len(name) <= width:
        return name
    parts = name.split(".")
    shortest = name
    for dropped in range(1, len(parts)):
        ending = ".".join(parts[dropped:])
        if any(_ends_in(other, ending) for other in others if other != name):
            break  # dropping more leaves an ending another name shares too
        shortest = FOLD + ending
        if len(shortest) <= width:
            return shortest
    return shortest


def fold_names(names: Sequence[str], width: int) -> list[str]:
    """Each of ``names`` (distinct) shortened to ``width`` columns, told apart from the rest."""
    return [fold_name(name, names, width) for name in names]
