"""Every private API of Textual and plotext the dashboard reads, in one file: an upgrade that
moves one breaks this module alone, and ``tests/test_private_apis.py`` says which.

- Textual's ``_character_to_key``: the key name Textual matches a typed character with
  (``?`` is ``question_mark``), for the key names of a user's keys.toml.
- plotext's glyph tables (``plotext._dict``): the charts draw into plotext's canvas with
  plotext's own braille and block glyphs, without its slow text round trip.
"""

from __future__ import annotations

from plotext._dict import braille_codes, hd_codes
from textual.keys import _character_to_key

__all__ = ["braille_codes", "character_to_key", "hd_codes"]


def character_to_key(character: str) -> str:
    """The name Textual gives the key that types ``character``."""
    return _character_to_key(character)
