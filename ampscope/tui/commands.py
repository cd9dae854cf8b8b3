"""Command palette: every preset as 'Run preset NAME'.

Textual reads a hit's text and help as markup: a preset named ``[/]`` would crash the
palette. Both are given as Content, which it shows as written.
"""

from __future__ import annotations

from collections.abc import Callable

from textual.command import DiscoveryHit, Hit, Hits, Matcher, Provider
from textual.content import Content

from ampscope.core import presets
from ampscope.core.text import visible
from ampscope.tui.messages import RunRequested


def _prompt(info: presets.PresetInfo) -> str:
    return f"Run preset {visible(info.name)}"


def _help(info: presets.PresetInfo) -> str | None:
    """Content, though typed str: Textual reads a str help as markup but passes Content
    through (``Content.from_markup``), and no escape of a str is faithful (tui.text)."""
    if not info.description:
        return None
    return Content(visible(info.description))  # type: ignore[return-value]


def _highlighted(matcher: Matcher, text: str) -> Content:
    """The matched letters highlighted; text with a '[' is shown plain (no markup read)."""
    return matcher.highlight(text) if "[" not in text else Content(text)


class PresetCommands(Provider):
    async def startup(self) -> None:
        read_only = getattr(self.app, "read_only", False)  # a served viewer starts nothing
        self.presets = [] if read_only else presets.list_presets()

    def _command(self, name: str) -> Callable[[], object]:
        return lambda: self.app.post_message(RunRequested(name))

    async def discover(self) -> Hits:
        for info in self.presets:
            yield DiscoveryHit(
                Content(_prompt(info)),
                self._command(info.name),
                text=_prompt(info),
                help=_help(info),
            )

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for info in self.presets:
            text = _prompt(info)
            score = matcher.match(text)
            if score > 0:
                yield Hit(
                    score,
                    _highlighted(matcher, text),
                    self._command(info.name),
                    text=text,
                    help=_help(info),
                )
