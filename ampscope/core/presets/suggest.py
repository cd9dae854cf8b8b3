"""Did you mean ...?" for a mistyped name: a preset, a field, a format, a function.

A typo answered with the whole list makes the reader search it; the one close name, when
there is one, is what they meant nine times in ten (difflib's ratio, as git and pip do).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice most like ``word``, or None when none is close (ratio under 0.6)."""
    names = [c for c in choices if c != word]
    lowered = {c.lower(): c for c in names}  # case alone differs (AMP-BF16): the same name
    found = [lowered[c] for c in difflib.get_close_matches(word.lower(), list(lowered), n=3)]
    # Two letters swapped (fp61 for fp16) is the commonest slip; difflib may rank fp64 as high.
    swapped = [c for c in found if sorted(c.lower()) == sorted(word.lower())]
    best = swapped or found
    return best[0] if best else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` Did you mean 'x'?`` (with its leading space) for the close choice, else ''."""
    best = closest(word, choices)
    return f" Did you mean '{best}'?" if best else ""
